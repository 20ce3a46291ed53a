package rest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math/rand/v2"
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
