package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The REST client reuses one connection and checks the exit code.
func TestRESTClientOneConnection(t *testing.T) {
	exit := "0"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sessions/s1/commands" || r.Header.Get("Authorization") != "Bearer tok" || string(body) != string(restTrue) {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"exitCode": `+exit+`, "stdout": "", "stderr": ""}`)
	}))
	defer srv.Close()
	rc := newRESTClient(&sandgate{url: srv.URL, token: "tok"})
	defer rc.close()
	for i := 0; i < 5; i++ {
		if err := rc.command(t.Context(), "s1", restTrue); err != nil {
			t.Fatal(err)
		}
	}
	if n := rc.dials.Load(); n != 1 {
		t.Errorf("%d connections for 5 requests, want 1", n)
	}
	exit = "1"
	if err := rc.command(t.Context(), "s1", restTrue); err == nil {
		t.Error("exit code 1 passed")
	}
	if err := rc.command(t.Context(), "s2", restTrue); err == nil {
		t.Error("an HTTP 400 passed")
	}
}

func TestCheckCommand(t *testing.T) {
	if err := checkCommand(200, []byte(`{"exitCode": 0}`)); err != nil {
		t.Error(err)
	}
	for _, body := range []string{`{}`, `{"exitCode": 127}`, `not json`} {
		if err := checkCommand(200, []byte(body)); err == nil {
			t.Errorf("%s passed", body)
		}
	}
	if err := checkCommand(409, []byte(`{"exitCode": 0}`)); err == nil {
		t.Error("a 409 passed")
	}
}

func TestCheckPut(t *testing.T) {
	p := filepath.Join(t.TempDir(), "put.json")
	for _, c := range []struct {
		body string
		ok   bool
	}{{`{"name": "big.bin", "sizeBytes": 1024}`, true}, {`{"sizeBytes": 1023}`, false}, {`oops`, false}} {
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := checkPut(p, 1024); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.body, err)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: answer file left behind", c.body)
		}
	}
}

func TestRowOrderAndSelection(t *testing.T) {
	rows := []string{"10", "9d", "1", "e3b", "10a", "e", "2", "e10", "9a", "e3a"}
	sort.Slice(rows, func(i, j int) bool { return rowLess(rows[i], rows[j]) })
	if got := strings.Join(rows, ","); got != "e,e3a,e3b,e10,1,2,9a,9d,10,10a" {
		t.Errorf("order %s", got)
	}
	c := &config{rows: map[string]bool{"10b": true}}
	for id, want := range map[string]bool{"10": true, "10b": true, "10a": false, "1": false, "1a": false} {
		if got := c.wantRow(id); got != want {
			t.Errorf("rows 10b: wantRow(%s) = %v", id, got)
		}
	}
	c = &config{rows: map[string]bool{"1": true}}
	if c.wantRow("10") || c.wantRow("10a") {
		t.Error("rows 1 selects row 10")
	}
}

// TestRESTClientPost: post (row 15's pause and resume) decodes a 200
// answer and refuses another status, naming the path, on one connection.
func TestRESTClientPost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer tok" || r.URL.Path != "/v1/sessions/s1/pause" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		io.WriteString(w, `{"status": "paused"}`)
	}))
	defer srv.Close()
	rc := newRESTClient(&sandgate{url: srv.URL, token: "tok"})
	defer rc.close()
	var a pauseAnswer
	if err := rc.post(t.Context(), "/v1/sessions/s1/pause", nil, &a); err != nil || a.Status != "paused" {
		t.Fatalf("post: %v %+v", err, a)
	}
	if err := rc.post(t.Context(), "/v1/sessions/s2/pause", nil, nil); err == nil || !strings.Contains(err.Error(), "/v1/sessions/s2/pause: 400") {
		t.Errorf("an HTTP 400: %v", err)
	}
	if n := rc.dials.Load(); n != 1 {
		t.Errorf("%d connections for 2 requests, want 1", n)
	}
}
