package rest_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandgate/sandgate/gateway"
)

// processOut is a process as the API shows it.
type processOut struct {
	ProcessID   string   `json:"processId"`
	PID         int      `json:"pid"`
	Name        string   `json:"name"`
	Command     string   `json:"command"`
	Status      string   `json:"status"`
	ExitCode    *int     `json:"exitCode"`
	ExitSignal  string   `json:"exitSignal"`
	OutputBytes int64    `json:"outputBytes"`
	EnvIgnored  []string `json:"envIgnored"`
}

// outLine is one line of a process's output stream.
type outLine struct {
	Offset       *int64 `json:"offset"`
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	StdoutBase64 []byte `json:"stdoutBase64"`
	StderrBase64 []byte `json:"stderrBase64"`
	DroppedBytes int64  `json:"droppedBytes"`
	Done         *bool  `json:"done"`
	ExitCode     *int   `json:"exitCode"`
	ExitSignal   string `json:"exitSignal"`
	NextOffset   *int64 `json:"nextOffset"`
}

// ndjsonLines checks an output answer's content type and each line against
// the spec's ProcessOutputLine, and returns the lines.
func ndjsonLines(t *testing.T, doc *openapi3.T, r result) []outLine {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("output Content-Type %q, want application/x-ndjson", ct)
	}
	schema := doc.Components.Schemas["ProcessOutputLine"].Value
	var lines []outLine
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("output line %q: %v", sc.Bytes(), err)
		}
		if err := schema.VisitJSON(v, openapi3.EnableFormatValidation()); err != nil {
			t.Errorf("output line %q does not match ProcessOutputLine: %v", sc.Bytes(), err)
		}
		var l outLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 || lines[len(lines)-1].Done == nil || lines[len(lines)-1].NextOffset == nil {
		t.Fatalf("output does not end with a done line: %s", r.body)
	}
	return lines
}

func TestContractProcesses(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	doc := loadSpec(t)
	s := g.create(t, aliceKey, "")
	base := "/v1/sessions/" + s.SessionID + "/processes"
	start := func(t *testing.T, body string) processOut {
		t.Helper()
		r := g.do(t, http.MethodPost, base, aliceKey, []byte(body))
		expect(t, r, http.StatusCreated, "")
		var p processOut
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	get := func(t *testing.T, id string) processOut {
		t.Helper()
		r := g.do(t, http.MethodGet, base+"/"+id, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		var p processOut
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	waitEnd := func(t *testing.T, id string) processOut {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			p := get(t, id)
			if p.Status != "running" {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %s still running", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	t.Run("start-read-done", func(t *testing.T) {
		p := start(t, `{"command": "printf 'out\n'; printf 'err\n' >&2; printf '\\377\\376'; echo \"$LANG $SECRET_X\"; exit 3", "name": "job", "env": {"LANG": "C.UTF-8", "SECRET_X": "no"}}`)
		// A command this short may have ended by the time the start answers.
		if p.ProcessID == "" || p.PID <= 0 || p.Name != "job" || (p.Status != "running" && p.Status != "exited") {
			t.Errorf("started: %+v", p)
		}
		if len(p.EnvIgnored) != 1 || p.EnvIgnored[0] != "SECRET_X" {
			t.Errorf("envIgnored %v, want [SECRET_X]", p.EnvIgnored)
		}
		end := waitEnd(t, p.ProcessID)
		if end.Status != "exited" || end.ExitCode == nil || *end.ExitCode != 3 {
			t.Errorf("ended: %+v", end)
		}
		r := g.do(t, http.MethodGet, base+"/"+p.ProcessID+"/output", aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		lines := ndjsonLines(t, doc, r)
		var stdout, stderr []byte
		next := int64(0)
		for _, l := range lines[:len(lines)-1] {
			if l.Offset == nil || *l.Offset != next {
				t.Fatalf("line at offset %v, want %d: %+v", l.Offset, next, l)
			}
			chunk := append([]byte(l.Stdout), l.StdoutBase64...)
			stdout = append(stdout, chunk...)
			errChunk := append([]byte(l.Stderr), l.StderrBase64...)
			stderr = append(stderr, errChunk...)
			next += int64(len(chunk) + len(errChunk))
		}
		last := lines[len(lines)-1]
		if !*last.Done || last.ExitCode == nil || *last.ExitCode != 3 || *last.NextOffset != next || next != end.OutputBytes {
			t.Errorf("done line %+v, want exit 3 at %d (outputBytes %d)", last, next, end.OutputBytes)
		}
		if string(stdout) != "out\n\xff\xfeC.UTF-8 \n" || string(stderr) != "err\n" {
			t.Errorf("stdout %q stderr %q", stdout, stderr)
		}
		// From an offset, and from the end backwards.
		r = g.do(t, http.MethodGet, base+"/"+p.ProcessID+"/output?offset=4&follow=true", aliceKey, nil)
		if l := ndjsonLines(t, doc, r); *l[0].Offset != 4 || !*l[len(l)-1].Done {
			t.Errorf("from 4: %s", r.body)
		}
		r = g.do(t, http.MethodGet, base+"/"+p.ProcessID+"/output?offset=-2", aliceKey, nil)
		if l := ndjsonLines(t, doc, r); *l[0].Offset != next-2 {
			t.Errorf("last 2 bytes: %s", r.body)
		}
		expect(t, g.do(t, http.MethodPost, base+"/"+p.ProcessID+"/signal", aliceKey, []byte(`{"signal": "TERM"}`)), http.StatusConflict, "process_exited")
		expect(t, g.do(t, http.MethodPost, base+"/"+p.ProcessID+"/stdin", aliceKey, []byte(`{"data": "x"}`)), http.StatusConflict, "process_exited")
	})

	t.Run("stdin-signal", func(t *testing.T) {
		p := start(t, `{"argv": ["cat"]}`)
		expect(t, g.do(t, http.MethodPost, base+"/"+p.ProcessID+"/stdin", aliceKey, []byte(`{"data": "hello "}`)), http.StatusNoContent, "")
		expect(t, g.do(t, http.MethodPost, base+"/"+p.ProcessID+"/stdin", aliceKey, []byte(`{"dataBase64": "d29ybGQ=", "eof": true}`)), http.StatusNoContent, "")
		if r := g.do(t, http.MethodPost, base+"/"+p.ProcessID+"/stdin", aliceKey, []byte(`{"data": "late"}`)); r.status != http.StatusConflict {
			t.Errorf("stdin after eof: %d %s", r.status, r.body)
		}
		waitEnd(t, p.ProcessID)
		r := g.do(t, http.MethodGet, base+"/"+p.ProcessID+"/output", aliceKey, nil)
		if l := ndjsonLines(t, doc, r); len(l) != 2 || l[0].Stdout != "hello world" || !*l[1].Done {
			t.Errorf("cat: %s", r.body)
		}

		q := start(t, `{"command": "sleep 60"}`)
		r = g.do(t, http.MethodGet, base+"/"+q.ProcessID+"/output", aliceKey, nil)
		if l := ndjsonLines(t, doc, r); len(l) != 1 || *l[0].Done || *l[0].NextOffset != 0 {
			t.Errorf("running, no output: %s", r.body)
		}
		expect(t, g.do(t, http.MethodPost, base+"/"+q.ProcessID+"/signal", aliceKey, []byte(`{"signal": "TERM"}`)), http.StatusNoContent, "")
		if end := waitEnd(t, q.ProcessID); end.Status != "killed" || end.ExitSignal != "TERM" || end.ExitCode != nil {
			t.Errorf("after TERM: %+v", end)
		}
		r = g.do(t, http.MethodGet, base, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		var l struct{ Processes []processOut }
		_ = json.Unmarshal(r.body, &l)
		if len(l.Processes) < 3 {
			t.Errorf("list: %s", r.body)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, body := range []string{
			`{}`, `{"command": "x", "argv": ["x"]}`, `{"command": ""}`, `{"argv": []}`, `{"command": "x", "env": {"A=B": "c"}}`,
			`{"command": "x", "name": "` + strings.Repeat("n", 65) + `"}`,
		} {
			expect(t, g.exchange(t, false, http.MethodPost, base, aliceKey, []byte(body)), http.StatusBadRequest, "invalid_field")
		}
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"cmd": "x"}`)), http.StatusBadRequest, "unknown_field")
		big := []byte(`{"command": "` + strings.Repeat("x", 70<<10) + `"}`)
		expect(t, g.do(t, http.MethodPost, base, aliceKey, big), http.StatusRequestEntityTooLarge, "body_too_large")
		expect(t, g.do(t, http.MethodGet, base, "", nil), http.StatusUnauthorized, "unauthorized")
		expect(t, g.do(t, http.MethodPost, base, "", []byte(`{"command": "true"}`)), http.StatusUnauthorized, "unauthorized")
		other := "/v1/sessions/" + s.SessionID + "/processes"
		expect(t, g.do(t, http.MethodGet, other, bobKey, nil), http.StatusNotFound, "not_found")
		expect(t, g.do(t, http.MethodPost, other, bobKey, []byte(`{"command": "true"}`)), http.StatusNotFound, "not_found")

		p := start(t, `{"command": "sleep 60"}`)
		pp := base + "/" + p.ProcessID
		for _, sub := range []string{"", "/output"} {
			expect(t, g.do(t, http.MethodGet, base+"/p999"+sub, aliceKey, nil), http.StatusNotFound, "process_not_found")
			expect(t, g.do(t, http.MethodGet, pp+sub, "", nil), http.StatusUnauthorized, "unauthorized")
		}
		for _, sub := range []string{"/stdin", "/signal"} {
			expect(t, g.do(t, http.MethodPost, base+"/p999"+sub, aliceKey, []byte(`{}`)), http.StatusNotFound, "process_not_found")
			expect(t, g.do(t, http.MethodPost, pp+sub, "", []byte(`{}`)), http.StatusUnauthorized, "unauthorized")
		}
		expect(t, g.do(t, http.MethodGet, pp+"/output?offset=x", aliceKey, nil), http.StatusBadRequest, "invalid_offset")
		expect(t, g.exchange(t, false, http.MethodGet, pp+"/output?follow=maybe", aliceKey, nil), http.StatusBadRequest, "invalid_field")
		expect(t, g.exchange(t, false, http.MethodPost, pp+"/signal", aliceKey, []byte(`{"signal": "WINCH"}`)), http.StatusBadRequest, "invalid_signal")
		expect(t, g.do(t, http.MethodPost, pp+"/stdin", aliceKey, []byte(`{"data": "x", "dataBase64": "eA=="}`)), http.StatusBadRequest, "invalid_field")
		expect(t, g.do(t, http.MethodPost, pp+"/stdin", aliceKey, []byte(`{"data": "`+strings.Repeat("x", 70<<10)+`"}`)), http.StatusRequestEntityTooLarge, "body_too_large")
		expect(t, g.do(t, http.MethodPost, pp+"/stdin", aliceKey, []byte(`{"eof": true}`)), http.StatusNoContent, "")
		expect(t, g.do(t, http.MethodPost, pp+"/stdin", aliceKey, []byte(`{"data": "x"}`)), http.StatusConflict, "stdin_closed")
		expect(t, g.do(t, http.MethodPost, pp+"/signal", aliceKey, []byte(`{"signal": "SIGKILL"}`)), http.StatusNoContent, "")

		// A process that closed its input itself, and runs on.
		q := start(t, `{"command": "exec 0<&-; sleep 60"}`)
		qp := base + "/" + q.ProcessID
		time.Sleep(300 * time.Millisecond) // past the exec
		expect(t, g.do(t, http.MethodPost, qp+"/stdin", aliceKey, []byte(`{"data": "x"}`)), http.StatusConflict, "stdin_closed")
		expect(t, g.do(t, http.MethodPost, qp+"/signal", aliceKey, []byte(`{"signal": "SIGKILL"}`)), http.StatusNoContent, "")
	})

	t.Run("too-many", func(t *testing.T) {
		s2 := g.create(t, aliceKey, "")
		b2 := "/v1/sessions/" + s2.SessionID + "/processes"
		for i := range 64 {
			r := g.do(t, http.MethodPost, b2, aliceKey, []byte(`{"command": "sleep 60"}`))
			if r.status != http.StatusCreated {
				t.Fatalf("process %d: %d %s", i, r.status, r.body)
			}
		}
		expect(t, g.do(t, http.MethodPost, b2, aliceKey, []byte(`{"command": "sleep 60"}`)), http.StatusTooManyRequests, "too_many_processes")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+s2.SessionID, aliceKey, nil), http.StatusNoContent, "")
	})

	t.Run("session-not-running", func(t *testing.T) {
		store := gateway.NewMemStore()
		id := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		lb := "/v1/sessions/" + id + "/processes"
		expect(t, fg.do(t, http.MethodPost, lb, aliceKey, []byte(`{"command": "true"}`)), http.StatusConflict, "session_not_running")
		expect(t, fg.do(t, http.MethodGet, lb, aliceKey, nil), http.StatusConflict, "session_not_running")
		for _, sub := range []string{"", "/output"} {
			expect(t, fg.do(t, http.MethodGet, lb+"/p1"+sub, aliceKey, nil), http.StatusConflict, "session_not_running")
		}
		expect(t, fg.do(t, http.MethodPost, lb+"/p1/stdin", aliceKey, []byte(`{"data": "x"}`)), http.StatusConflict, "session_not_running")
		expect(t, fg.do(t, http.MethodPost, lb+"/p1/signal", aliceKey, []byte(`{"signal": "TERM"}`)), http.StatusConflict, "session_not_running")
	})

	t.Run("gone", func(t *testing.T) {
		expectGone(t, g,
			goneCall{method: http.MethodPost, sub: "/processes", body: []byte(`{"command": "true"}`)},
			goneCall{method: http.MethodGet, sub: "/processes"},
			goneCall{method: http.MethodGet, sub: "/processes/p1"},
			goneCall{method: http.MethodGet, sub: "/processes/p1/output"},
			goneCall{method: http.MethodPost, sub: "/processes/p1/stdin", body: []byte(`{"data": "x"}`)},
			goneCall{method: http.MethodPost, sub: "/processes/p1/signal", body: []byte(`{"signal": "TERM"}`)})
	})

	requireSeen(t, cov, func(p string) bool { return strings.Contains(p, "/processes") }, map[string]string{
		"startProcess 500": "a sandbox that cannot start a process (a broken driver) is not part of this test",
	})
}
