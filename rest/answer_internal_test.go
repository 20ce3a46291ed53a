package rest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/dataplane"
)

// writeJSONString escapes as encoding/json does, byte for byte.
func TestWriteJSONStringMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pieces := []string{"a", "Z", " ", "\"", "\\", "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
		"é", "€", "𝄞", "\u2028", "\u2029", "\xff", "\xe2\x82"}
	for range 2000 {
		var sb strings.Builder
		for range rng.IntN(30) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := sb.String()
		want, _ := json.Marshal(s)
		var buf bytes.Buffer
		bw := bufio.NewWriterSize(&buf, 16)
		writeJSONString(bw, []byte(s))
		bw.Flush()
		if buf.String() != string(want) {
			t.Fatalf("%q: got %s, want %s", s, buf.Bytes(), want)
		}
	}
}

func FuzzWriteJSONString(f *testing.F) {
	f.Add([]byte("a<b>\u2028\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		want, _ := json.Marshal(string(b))
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		writeJSONString(bw, b)
		bw.Flush()
		if buf.String() != string(want) {
			t.Fatalf("%q: got %s, want %s", b, buf.Bytes(), want)
		}
	})
}

// A command's streamed answer is the JSON of its result with the output
// fields, as json.Marshal would give them.
func TestWriteAnswerIsJSON(t *testing.T) {
	code := 3
	rec := httptest.NewRecorder()
	small := commandResult{ExitCode: &code, Truncated: true, DurationMs: 5, Cwd: "/w"}
	if err := writeAnswer(rec, 200, small, outputOf(t, "out <\n"), outputOf(t, "\xff\x00")); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%s: %v", rec.Body.Bytes(), err)
	}
	if got["stdout"] != "out <\n" || got["stderrBase64"] != "/wA=" || got["exitCode"] != 3.0 || got["truncated"] != true ||
		got["cwd"] != "/w" || got["exitSignal"] != nil || len(got) != 8 {
		t.Errorf("answer %s", rec.Body.Bytes())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" || !bytes.HasSuffix(rec.Body.Bytes(), []byte("}\n")) {
		t.Errorf("content type %q, body %q", ct, rec.Body.Bytes())
	}
}

func outputOf(t *testing.T, s string) dataplane.Output {
	t.Helper()
	return dataplane.OutputOf([]byte(s), false)
}

// A small answer is sent whole, with its length, in one write: not
// chunked, so the client has its end without waiting for the handler to
// return. One larger than a write is chunked, and is the same JSON.
func TestWriteAnswerLength(t *testing.T) {
	code := 0
	big := strings.Repeat("x", 3*answerChunk)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := "hi\n"
		if r.URL.Query().Has("big") {
			out = big
		}
		_ = writeAnswer(w, 200, commandResult{ExitCode: &code}, outputOf(t, out), outputOf(t, ""))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		query   string
		out     string
		chunked bool
	}{{"", "hi\n", false}, {"?big", big, true}} {
		resp, err := http.Get(srv.URL + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		chunked := len(resp.TransferEncoding) > 0
		if chunked != tc.chunked || (!chunked && resp.ContentLength != int64(len(body))) {
			t.Errorf("%q: content length %d for %d bytes, transfer encoding %v", tc.query, resp.ContentLength, len(body), resp.TransferEncoding)
		}
		var got struct {
			Stdout   string `json:"stdout"`
			ExitCode *int   `json:"exitCode"`
		}
		if err := json.Unmarshal(body, &got); err != nil || got.Stdout != tc.out || got.ExitCode == nil || *got.ExitCode != 0 {
			t.Errorf("%q: answer %.200s: %v", tc.query, body, err)
		}
	}
}
