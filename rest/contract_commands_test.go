package rest_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// cmdOut is a command's JSON answer.
type cmdOut struct {
	ExitCode     *int    `json:"exitCode"`
	ExitSignal   *string `json:"exitSignal"`
	Stdout       *string `json:"stdout"`
	Stderr       *string `json:"stderr"`
	StdoutBase64 *string `json:"stdoutBase64"`
	Truncated    bool    `json:"truncated"`
	TimedOut     bool    `json:"timedOut"`
	Cwd          string  `json:"cwd"`
}

func decodeCmd(t *testing.T, r result) cmdOut {
	t.Helper()
	var c cmdOut
	if r.status != http.StatusOK {
		t.Fatalf("command: %d %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return c
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestContractCommands checks every documented answer of the commands
// endpoints against the spec.
func TestContractCommands(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	id := g.create(t, aliceKey, "").SessionID
	path := "/v1/sessions/" + id + "/commands"
	post := func(body string, hdr ...string) result {
		t.Helper()
		return g.do(t, http.MethodPost, path, aliceKey, []byte(body), hdr...)
	}

	t.Run("run", func(t *testing.T) {
		c := decodeCmd(t, post(`{"command": "echo hi; echo oops >&2; exit 2"}`))
		if c.ExitCode == nil || *c.ExitCode != 2 || str(c.Stdout) != "hi\n" || str(c.Stderr) != "oops\n" || c.ExitSignal != nil {
			t.Errorf("got %+v", c)
		}
		c = decodeCmd(t, post(`{"argv": ["printf", "%s", "a $HOME 'b'"], "timeout": 5, "maxOutputBytes": 100}`))
		if str(c.Stdout) != "a $HOME 'b'" {
			t.Errorf("argv: %q", str(c.Stdout))
		}
		c = decodeCmd(t, post(`{"command": "printf '\\377'"}`))
		if c.Stdout != nil || str(c.StdoutBase64) != "/w==" {
			t.Errorf("binary: %+v", c)
		}
		c = decodeCmd(t, post(`{"command": "kill -9 $$"}`))
		if c.ExitCode != nil || str(c.ExitSignal) != "KILL" {
			t.Errorf("signal: %+v", c)
		}
		c = decodeCmd(t, post(`{"command": "sleep 30", "timeout": 0.5}`))
		if !c.TimedOut || c.ExitCode == nil || *c.ExitCode != 124 {
			t.Errorf("timeout: %+v", c)
		}
		c = decodeCmd(t, post(`{"command": "seq 1 1000", "maxOutputBytes": 8}`))
		if !c.Truncated || str(c.Stdout) != "1\n2\n000\n" {
			t.Errorf("truncated: %+v %q", c, str(c.Stdout))
		}
		c = decodeCmd(t, post(`{"command": "cat; pwd", "stdinBase64": "aGk=", "env": {"LC_A": "x"}, "cwd": "/", "background": true}`))
		if str(c.Stdout) != "hi/\n" || c.Cwd != "/" {
			t.Errorf("stdin/cwd: %+v", c)
		}
	})

	t.Run("stream", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(`{"command": "echo a; echo b >&2; printf '\\377'"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		req.Header.Set("Accept", "application/x-ndjson")
		res, err := g.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("%d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
		doc := loadSpec(t)
		event := doc.Components.Schemas["CommandOutputEvent"].Value
		final := doc.Components.Schemas["CommandResult"].Value
		var lines []map[string]any
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			var v map[string]any
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			lines = append(lines, v)
		}
		if len(lines) < 2 {
			t.Fatalf("lines %v", lines)
		}
		var out bytes.Buffer
		for i, l := range lines {
			schema := event
			if i == len(lines)-1 {
				schema = final
			}
			if err := schema.VisitJSON(l); err != nil {
				t.Errorf("line %d %v: %v", i, l, err)
			}
			for k, v := range l {
				if k != "exitCode" && i < len(lines)-1 {
					fmt.Fprintf(&out, "%s=%v;", k, v)
				}
			}
		}
		if s := out.String(); !strings.Contains(s, "stdout=a\n;") || !strings.Contains(s, "stderr=b\n;") || !strings.Contains(s, "stdoutBase64=/w==;") {
			t.Errorf("events %q", s)
		}
	})

	t.Run("shells", func(t *testing.T) {
		c := decodeCmd(t, post(`{"command": "cd /tmp && export X=1", "shell": "s1"}`))
		if c.Cwd != "/tmp" {
			t.Errorf("cwd %q", c.Cwd)
		}
		c = decodeCmd(t, post(`{"command": "echo $X", "shell": "s1"}`))
		if str(c.Stdout) != "1\n" || c.Cwd != "/tmp" {
			t.Errorf("got %+v", c)
		}
		for i := 2; i <= 16; i++ {
			decodeCmd(t, post(fmt.Sprintf(`{"command": "true", "shell": "s%d"}`, i)))
		}
		expect(t, post(`{"command": "true", "shell": "s17"}`), 429, "too_many_shells")
		// Waiters of a deleted shell get 409.
		var wg sync.WaitGroup
		results := make([]result, 3)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = post(`{"command": "sleep 20", "shell": "s2"}`)
			}()
		}
		time.Sleep(500 * time.Millisecond)
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+id+"/shells/s2", aliceKey, nil), 204, "")
		wg.Wait()
		closed := 0
		for _, r := range results {
			if r.status == http.StatusConflict && r.errorCode() == "shell_closed" {
				closed++
			}
		}
		if closed == 0 {
			t.Errorf("no waiter got shell_closed: %v", results)
		}
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+id+"/shells/s2", aliceKey, nil), 404, "shell_not_found")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/shells/s2", aliceKey, nil), 404, "not_found")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+id+"/shells/s1", "", nil), 401, "unauthorized")
	})

	t.Run("history", func(t *testing.T) {
		r := g.do(t, http.MethodGet, path+"?limit=2", aliceKey, nil)
		expect(t, r, 200, "")
		var h struct{ Commands []gateway.CommandRecord }
		if err := json.Unmarshal(r.body, &h); err != nil || len(h.Commands) != 2 {
			t.Fatalf("history %s: %v", r.body, err)
		}
		expect(t, g.do(t, http.MethodGet, path, aliceKey, nil), 200, "")
		expect(t, g.do(t, http.MethodGet, path+"?limit=0", aliceKey, nil), 400, "invalid_limit")
		expect(t, g.do(t, http.MethodGet, path, "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/commands", aliceKey, nil), 404, "not_found")
	})

	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct{ body, code string }{
			{`{}`, "invalid_command"},
			{`{"command": "x", "argv": ["x"]}`, "invalid_command"},
			{`{"argv": []}`, "invalid_command"},
			{`{"command": "x", "stdin": "a", "stdinBase64": "YQ=="}`, "invalid_stdin"},
			{`{"command": "x", "stdinBase64": "!!"}`, "invalid_stdin"},
			{`{"command": "x", "env": {"PATH": "/x", "LD_PRELOAD": "y"}}`, "env_not_allowed"},
			{`{"command": "x", "timeout": 100000}`, "invalid_timeout"},
			{`{"command": "x", "timeout": 1e10}`, "invalid_timeout"}, // wraps as a Duration
			{`{"command": "x", "maxOutputBytes": -1}`, "invalid_max_output"},
			{`{"command": "x", "shell": "a/b"}`, "invalid_shell_name"},
			{`{"command": "x", "nope": 1}`, "unknown_field"},
		} {
			r := g.exchange(t, false, http.MethodPost, path, aliceKey, []byte(c.body))
			expect(t, r, 400, c.code)
			if c.code == "env_not_allowed" && (!strings.Contains(r.errorMessage(), "PATH") || !strings.Contains(r.errorMessage(), "LD_PRELOAD")) {
				t.Errorf("message does not name the variables: %s", r.errorMessage())
			}
		}
		expect(t, post(`{"command": "`+strings.Repeat("x", 70<<10)+`"}`), 413, "body_too_large")
		expect(t, g.do(t, http.MethodPost, path, "", []byte(`{"command": "true"}`)), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/commands", aliceKey, []byte(`{"command": "true"}`)), 404, "not_found")
		expect(t, g.do(t, http.MethodPost, path, bobKey, []byte(`{"command": "true"}`)), 404, "not_found")
	})

	t.Run("rate-limited", func(t *testing.T) {
		rl := newGateway(t, gwOptions{rateLimit: 3, cov: cov})
		rid := rl.create(t, aliceKey, "").SessionID
		for _, p := range []struct{ method, path string }{
			{http.MethodGet, "/v1/sessions/" + rid + "/commands"},
			{http.MethodDelete, "/v1/sessions/" + rid + "/shells/x"},
			{http.MethodPost, "/v1/sessions/" + rid + "/commands"},
		} {
			var r result
			for range 5 {
				var body []byte
				if p.method == http.MethodPost {
					body = []byte(`{"command": "true"}`)
				}
				if r = rl.do(t, p.method, p.path, aliceKey, body); r.status == 429 {
					break
				}
			}
			expect(t, r, 429, "rate_limited")
		}
	})

	t.Run("memory-bound-and-shutdown", func(t *testing.T) {
		stopping := make(chan struct{})
		mg := newGateway(t, gwOptions{cov: cov, stopping: stopping,
			dataPlane: rest.DataPlane{CommandMemory: 3 << 20, CommandMemoryPerTenant: 3 << 20, CommandQueue: 100 * time.Millisecond}})
		aid, bid := mg.create(t, aliceKey, "").SessionID, mg.create(t, bobKey, "").SessionID
		ended := make(chan result, 1)
		go func() {
			ended <- mg.do(t, http.MethodPost, "/v1/sessions/"+aid+"/commands", aliceKey,
				[]byte(`{"command": "echo so far; touch started; sleep 60", "maxOutputBytes": 1048576}`))
		}()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			// A command that keeps no output fits beside it.
			r := mg.do(t, http.MethodPost, "/v1/sessions/"+aid+"/commands", aliceKey, []byte(`{"command": "test -e started", "maxOutputBytes": 0}`))
			var c cmdOut
			if r.status == 200 && json.Unmarshal(r.body, &c) == nil && c.ExitCode != nil && *c.ExitCode == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command did not start")
			}
		}
		one := []byte(`{"command": "true", "maxOutputBytes": 1048576}`)
		r := mg.do(t, http.MethodPost, "/v1/sessions/"+aid+"/commands", aliceKey, one)
		expect(t, r, 429, "too_many_commands")
		if r.header.Get("Retry-After") == "" {
			t.Error("429 too_many_commands without Retry-After")
		}
		expect(t, mg.do(t, http.MethodPost, "/v1/sessions/"+bid+"/commands", bobKey, one), 503, "commands_unavailable")
		close(stopping)
		r = <-ended
		expect(t, r, 503, "shutting_down")
		var out struct{ Stdout *string }
		if err := json.Unmarshal(r.body, &out); err != nil || out.Stdout == nil || *out.Stdout != "so far\n" {
			t.Errorf("the output so far: %s", r.body)
		}
	})

	t.Run("failed-session", func(t *testing.T) {
		store := gateway.NewMemStore()
		lost := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		expect(t, fg.do(t, http.MethodPost, "/v1/sessions/"+lost+"/commands", aliceKey, []byte(`{"command": "true"}`)), 409, "session_not_running")
		expect(t, fg.do(t, http.MethodGet, "/v1/sessions/"+lost+"/commands", aliceKey, nil), 409, "session_not_running")
		expect(t, fg.do(t, http.MethodDelete, "/v1/sessions/"+lost+"/shells/x", aliceKey, nil), 409, "session_not_running")
	})

	t.Run("gone", func(t *testing.T) {
		expectGone(t, g,
			goneCall{method: http.MethodPost, sub: "/commands", body: []byte(`{"command": "true"}`)},
			goneCall{method: http.MethodGet, sub: "/commands"},
			goneCall{method: http.MethodDelete, sub: "/shells/x"})
	})

	requireSeen(t, cov, func(p string) bool {
		return strings.Contains(p, "/commands") || strings.Contains(p, "/shells/")
	}, map[string]string{
		"runCommand 500":   "a sandbox that cannot start a process; every handler sits behind the panic recoverer",
		"listCommands 500": "the handler has no failure path; documented because every handler sits behind the panic recoverer",
		"deleteShell 500":  "the handler has no failure path; documented because every handler sits behind the panic recoverer",
	})
}
