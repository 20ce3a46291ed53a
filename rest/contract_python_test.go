package rest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// pyOut is a Python call's JSON answer.
type pyOut struct {
	Kernel       string  `json:"kernel"`
	Stdout       *string `json:"stdout"`
	Stderr       *string `json:"stderr"`
	StdoutBase64 *string `json:"stdoutBase64"`
	Result       *string `json:"result"`
	Error        *struct {
		Name, Value, Traceback string
	} `json:"error"`
	Truncated   bool `json:"truncated"`
	TimedOut    bool `json:"timedOut"`
	Interrupted bool `json:"interrupted"`
	Restarted   bool `json:"restarted"`
	StateLost   bool `json:"stateLost"`
}

func decodePy(t *testing.T, r result) pyOut {
	t.Helper()
	var p pyOut
	if r.status != http.StatusOK {
		t.Fatalf("python: %d %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return p
}

func pyCode(code string, extra ...string) string {
	b, _ := json.Marshal(code)
	return `{"code": ` + string(b) + strings.Join(extra, "") + `}`
}

// TestContractPython checks every documented answer of the Python kernel
// endpoints against the spec.
func TestContractPython(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	id := g.create(t, aliceKey, "").SessionID
	path := "/v1/sessions/" + id + "/python"
	post := func(body string) result {
		t.Helper()
		return g.do(t, http.MethodPost, path, aliceKey, []byte(body))
	}
	reset := func(body string) result {
		t.Helper()
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		return g.do(t, http.MethodPost, path+"/reset", aliceKey, b)
	}

	t.Run("run", func(t *testing.T) {
		p := decodePy(t, post(pyCode("x = 10\nx", `, "timeout": 30, "kernel": "default"`)))
		if str(p.Result) != "10" || p.Error != nil || p.Kernel != "default" || p.StateLost {
			t.Errorf("got %+v", p)
		}
		p = decodePy(t, post(pyCode("x += 5\nprint('x is', x)\nx")))
		if str(p.Result) != "15" || str(p.Stdout) != "x is 15\n" || str(p.Stderr) != "" {
			t.Errorf("got %+v %q", p, str(p.Stdout))
		}
		p = decodePy(t, post(pyCode("def f():\n    raise ValueError('bad')\nf()")))
		if p.Error == nil || p.Error.Name != "ValueError" || p.Error.Value != "bad" || !strings.Contains(p.Error.Traceback, "in f") || p.Result != nil {
			t.Errorf("exception: %+v", p)
		}
		p = decodePy(t, post(pyCode("import sys\nsys.stdout.buffer.write(b'\\xff')\nNone")))
		if p.Stdout != nil || str(p.StdoutBase64) != "/w==" {
			t.Errorf("binary: %+v", p)
		}
		p = decodePy(t, post(pyCode("print('y' * 100)\n'z' * 100", `, "maxOutputBytes": 10`)))
		if !p.Truncated || str(p.Stdout) != "yyyyyyyyy\n" || str(p.Result) != "'zzzzzzzzz" {
			t.Errorf("truncated: %+v %q", p, str(p.Stdout))
		}
		p = decodePy(t, post(pyCode("while True: pass", `, "timeout": 0.5`)))
		if !p.TimedOut || !p.Interrupted || p.Restarted || p.StateLost || p.Error == nil || p.Error.Name != "KeyboardInterrupt" {
			t.Errorf("timeout: %+v", p)
		}
		p = decodePy(t, post(pyCode("import os\nos._exit(3)")))
		if p.Error == nil || p.Error.Name != "KernelDied" || !p.StateLost {
			t.Errorf("crash: %+v", p)
		}
		p = decodePy(t, post(pyCode("'x' in dir()")))
		if str(p.Result) != "False" || !p.Restarted || !p.StateLost {
			t.Errorf("after the crash: %+v", p)
		}
	})

	t.Run("reset", func(t *testing.T) {
		decodePy(t, post(pyCode("x = 1\nopen('f.txt', 'w').write('kept')", `, "kernel": "r"`)))
		r := reset(`{"kernel": "r"}`)
		expect(t, r, 200, "")
		if !strings.Contains(string(r.body), `"existed":true`) {
			t.Errorf("reset: %s", r.body)
		}
		p := decodePy(t, post(pyCode("('x' in dir(), open('f.txt').read())", `, "kernel": "r"`)))
		if str(p.Result) != "(False, 'kept')" || p.StateLost || p.Restarted {
			t.Errorf("after reset: %+v", p)
		}
		r = reset(`{"kernel": "never"}`)
		expect(t, r, 200, "")
		if !strings.Contains(string(r.body), `"existed":false`) {
			t.Errorf("reset of nothing: %s", r.body)
		}
		expect(t, reset(""), 200, "") // the default kernel
		expect(t, reset(`{"kernel": "a b"}`), 400, "invalid_kernel_name")
		expect(t, reset(`{"nope": 1}`), 400, "unknown_field")
		expect(t, reset(`{"kernel": "`+strings.Repeat("x", 70<<10)+`"}`), 413, "body_too_large")
		expect(t, g.do(t, http.MethodPost, path+"/reset", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/python/reset", aliceKey, nil), 404, "not_found")
	})

	t.Run("kernels", func(t *testing.T) {
		// With "default" and "r", 8 kernels.
		decodePy(t, post(pyCode("1")))
		for i := 3; i <= 8; i++ {
			decodePy(t, post(pyCode("1", fmt.Sprintf(`, "kernel": "k%d"`, i))))
		}
		expect(t, post(pyCode("1", `, "kernel": "k9"`)), 429, "too_many_kernels")
		for i := 3; i <= 8; i++ {
			expect(t, reset(fmt.Sprintf(`{"kernel": "k%d"}`, i)), 200, "")
		}
	})

	t.Run("busy and reset under calls", func(t *testing.T) {
		runningc := make(chan result, 1)
		go func() { runningc <- post(pyCode("import time\ntime.sleep(25)", `, "kernel": "busy"`)) }()
		time.Sleep(time.Second) // the first call holds the kernel
		// 33 more: 32 wait, one is refused.
		waiters := make(chan result, 33)
		for range 33 {
			go func() { waiters <- post(pyCode("1", `, "kernel": "busy"`)) }()
		}
		select {
		case r := <-waiters:
			expect(t, r, 429, "kernel_busy")
		case <-time.After(15 * time.Second):
			t.Fatal("no call was refused")
		}
		expect(t, reset(`{"kernel": "busy"}`), 200, "")
		p := decodePy(t, <-runningc)
		if p.Error == nil || p.Error.Name != "KernelReset" || !p.StateLost {
			t.Errorf("running call: %+v", p)
		}
		closed := 0
		for range 32 {
			r := <-waiters
			if r.status == http.StatusConflict && r.errorCode() == "kernel_reset" {
				closed++
			} else {
				expect(t, r, 200, "") // it came after the reset: a new kernel
			}
		}
		if closed == 0 {
			t.Error("no waiter got kernel_reset")
		}
		expect(t, reset(`{"kernel": "busy"}`), 200, "")
	})

	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct{ body, code string }{
			{`{}`, "invalid_code"},
			{`{"code": 1}`, "invalid_field"},
			{`{"code": "1", "timeout": 0}`, "invalid_timeout"},
			{`{"code": "1", "timeout": 100000}`, "invalid_timeout"},
			{`{"code": "1", "timeout": 1e10}`, "invalid_timeout"}, // wraps as a Duration
			{`{"code": "1", "maxOutputBytes": -1}`, "invalid_max_output"},
			{`{"code": "1", "kernel": "../x"}`, "invalid_kernel_name"},
			{`{"code": "1", "nope": 1}`, "unknown_field"},
			{`[`, "invalid_json"},
		} {
			expect(t, g.exchange(t, false, http.MethodPost, path, aliceKey, []byte(c.body)), 400, c.code)
		}
		expect(t, post(pyCode(strings.Repeat("x", 70<<10))), 413, "body_too_large")
		expect(t, g.do(t, http.MethodPost, path, "", []byte(`{"code": "1"}`)), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/python", aliceKey, []byte(`{"code": "1"}`)), 404, "not_found")
		expect(t, g.do(t, http.MethodPost, path, bobKey, []byte(`{"code": "1"}`)), 404, "not_found")
	})

	t.Run("rate-limited", func(t *testing.T) {
		rl := newGateway(t, gwOptions{rateLimit: 3, cov: cov})
		rid := rl.create(t, aliceKey, "").SessionID
		for _, p := range []string{"/v1/sessions/" + rid + "/python", "/v1/sessions/" + rid + "/python/reset"} {
			var r result
			for range 5 {
				if r = rl.do(t, http.MethodPost, p, aliceKey, []byte(`{"code": "1"}`)); r.status == 429 {
					break
				}
			}
			expect(t, r, 429, "rate_limited")
		}
	})

	t.Run("gone", func(t *testing.T) {
		expectGone(t, g,
			goneCall{method: http.MethodPost, sub: "/python", body: []byte(`{"code": "1"}`)},
			goneCall{method: http.MethodPost, sub: "/python/reset"})
	})

	t.Run("failed-session", func(t *testing.T) {
		store := gateway.NewMemStore()
		lost := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		expect(t, fg.do(t, http.MethodPost, "/v1/sessions/"+lost+"/python", aliceKey, []byte(`{"code": "1"}`)), 409, "session_not_running")
		expect(t, fg.do(t, http.MethodPost, "/v1/sessions/"+lost+"/python/reset", aliceKey, nil), 409, "session_not_running")
	})

	requireSeen(t, cov, func(p string) bool { return strings.Contains(p, "/python") }, map[string]string{
		"runPython 500":   "a sandbox that cannot start a process; every handler sits behind the panic recoverer",
		"resetPython 500": "the handler has no failure path; documented because every handler sits behind the panic recoverer",
		"runPython 503":   "the gateway's whole command memory; TestPythonChargedToCommandMemory sees the tenant's share of it (429)",
	})
}

// TestPythonChargedToCommandMemory: a Python call keeps up to its
// maxOutputBytes per stream, as a command does, and is charged to the same
// memory bound (review of issue 34 item 4): past the tenant's share it is
// refused.
func TestPythonChargedToCommandMemory(t *testing.T) {
	g := filesGateway(t, newCoverage(), filesTestBinary(t), 0, rest.DataPlane{
		CommandMemory: 64 << 20, CommandMemoryPerTenant: 3 << 20, CommandQueue: 100 * time.Millisecond})
	id := g.create(t, aliceKey, "").SessionID
	// The kernel is started before the budget is held.
	decodePy(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/python", aliceKey, []byte(pyCode("1"))))
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan struct{})
	go func() {
		defer close(held)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/sessions/"+id+"/commands",
			strings.NewReader(`{"command": "touch started; sleep 60", "maxOutputBytes": 1048576}`))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		req.Header.Set("Content-Type", "application/json")
		if res, err := g.client.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	defer func() { cancel(); <-held }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := g.do(t, http.MethodPost, "/v1/sessions/"+id+"/commands", aliceKey, []byte(`{"command": "test -e started", "maxOutputBytes": 0}`))
		if r.status == 200 && strings.Contains(string(r.body), `"exitCode":0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
	}
	r := g.do(t, http.MethodPost, "/v1/sessions/"+id+"/python", aliceKey, []byte(pyCode("2", `, "maxOutputBytes": 1048576`)))
	expect(t, r, 429, "too_many_commands")
	if r.header.Get("Retry-After") == "" {
		t.Error("429 too_many_commands without Retry-After")
	}
	// A call that keeps nothing fits beside the command.
	decodePy(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/python", aliceKey, []byte(pyCode("4", `, "maxOutputBytes": 0`))))
	cancel()
	<-held
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := g.do(t, http.MethodPost, "/v1/sessions/"+id+"/python", aliceKey, []byte(pyCode("5", `, "maxOutputBytes": 1048576`)))
		if r.status == 200 {
			break
		}
		expect(t, r, 429, "too_many_commands")
		if time.Now().After(deadline) {
			t.Fatal("the budget was not released")
		}
	}
}
