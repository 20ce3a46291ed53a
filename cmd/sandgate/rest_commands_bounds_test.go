package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// postCommand posts a command as tenant token and returns the status and
// the whole answer.
func postCommand(t *testing.T, g *gatewayProc, token, id string, body map[string]any, accept string) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", bytes.NewReader(b))
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("command %v: %v", body, err)
		return 0, nil
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("command %v: read the answer: %v", body, err)
	}
	return res.StatusCode, out
}

// createAs creates a session as tenant token.
func createAs(t *testing.T, g *gatewayProc, token string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s sessionJSON
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %v", res.StatusCode, err)
	}
	return s.SessionID
}

// vmKB reads a field of /proc/<pid>/status, in kB.
func vmKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// errorCode is the code of an error envelope.
func errorCode(b []byte) string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code
}

// Issue 34 item 4: 8 commands at once, each printing 40 MB to each stream
// with maxOutputBytes at the 16 MiB cap, took the gateway from 92 MB to
// 1.5 GB, still held a minute later. A command's answer now costs about its
// kept bytes, and the commands' memory is bounded.
func TestRESTCommandsMemoryUnderLoad(t *testing.T) {
	g := startGateway(t)
	id := g.createSession(t).SessionID
	runREST(t, g, id, map[string]any{"command": "true"})
	pid := g.cmd.Process.Pid
	before := vmKB(t, pid, "VmHWM")
	const n, printed, limit = 8, 40_000_000, 16 << 20
	// stderr: "xy", then "€\n" (4 bytes) over and over: the head's end
	// cuts a €, which the answer drops.
	cmd := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' a; { printf xy; yes '€' | head -c %d; } >&2`, printed, printed)
	wantErr := "xy" + strings.Repeat("€\n", (limit/2-2)/4) + strings.Repeat("€\n", limit/2/4)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body := postCommand(t, g, g.Token, id, map[string]any{"command": cmd, "maxOutputBytes": limit, "timeout": 600}, "")
			var a cmdAnswer
			if err := json.Unmarshal(body, &a); err != nil || status != http.StatusOK {
				t.Errorf("status %d, %v: %.200s", status, err, body)
				return
			}
			if a.code() != 0 || !a.Truncated || a.out() != strings.Repeat("a", limit) || a.Stderr == nil || *a.Stderr != wantErr {
				t.Errorf("answer: exit %d truncated %v stdout %d bytes, stderr %v", a.code(), a.Truncated, len(a.out()), a.Stderr != nil)
			}
		}()
	}
	wg.Wait()
	after := vmKB(t, pid, "VmHWM")
	t.Logf("gateway VmHWM %d kB before, %d kB after %d commands of 2x%d bytes", before, after, n, printed)
	if after > 300<<10 {
		t.Errorf("gateway peak RSS %d kB, want under 300 MB", after)
	}
}

// The memory bound queues a command briefly, then refuses it: 429 past the
// tenant's share, 503 past the gateway's; a tenant may still run 64
// commands at once with the defaults.
func TestRESTCommandsMemoryBound(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		g := startGateway(t, "--api-key", "a:ka", "--api-key", "b:kb", "--api-key", "c:kc",
			"--command-memory", "5MiB", "--command-memory-per-tenant", "3MiB", "--command-queue", "300ms")
		ids := map[string]string{"ka": createAs(t, g, "ka"), "kb": createAs(t, g, "kb"), "kc": createAs(t, g, "kc")}
		// 1 MiB per stream: 2 MiB + 64 KiB charged while it runs.
		sleeper := map[string]any{"command": "touch started; sleep 4", "maxOutputBytes": 1 << 20}
		var wg sync.WaitGroup
		for _, k := range []string{"ka", "kb"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if status, body := postCommand(t, g, k, ids[k], sleeper, ""); status != http.StatusOK {
					t.Errorf("%s: %d %s", k, status, body)
				}
			}()
			waitStarted(t, g, k, ids[k])
		}
		status, body := postCommand(t, g, "ka", ids["ka"], map[string]any{"command": "true", "maxOutputBytes": 1 << 20}, "")
		if status != http.StatusTooManyRequests || errorCode(body) != "too_many_commands" {
			t.Errorf("tenant a's second command: %d %s", status, body)
		}
		status, body = postCommand(t, g, "kc", ids["kc"], map[string]any{"command": "true", "maxOutputBytes": 1 << 20}, "")
		if status != http.StatusServiceUnavailable || errorCode(body) != "commands_unavailable" {
			t.Errorf("tenant c past the gateway's bound: %d %s", status, body)
		}
		// A small command fits beside them.
		if status, body := postCommand(t, g, "kc", ids["kc"], map[string]any{"command": "true", "maxOutputBytes": 1000}, ""); status != http.StatusOK {
			t.Errorf("tenant c's small command: %d %s", status, body)
		}
		wg.Wait()
	})
	t.Run("queued", func(t *testing.T) {
		g := startGateway(t, "--command-memory-per-tenant", "3MiB", "--command-queue", "2m")
		id := g.createSession(t).SessionID
		done := make(chan struct{})
		go func() {
			defer close(done)
			if status, body := postCommand(t, g, g.Token, id, map[string]any{"command": "touch started; sleep 2", "maxOutputBytes": 1 << 20}, ""); status != http.StatusOK {
				t.Errorf("first: %d %s", status, body)
			}
		}()
		waitStarted(t, g, g.Token, id)
		if status, body := postCommand(t, g, g.Token, id, map[string]any{"command": "echo second", "maxOutputBytes": 1 << 20}, ""); status != http.StatusOK {
			t.Errorf("second, queued: %d %s", status, body)
		}
		<-done
	})
	t.Run("64 at once", func(t *testing.T) {
		g := startGateway(t)
		id := g.createSession(t).SessionID
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, body := postCommand(t, g, g.Token, id, map[string]any{"command": "sleep 2; echo " + strconv.Itoa(i)}, "")
				if status != http.StatusOK {
					t.Errorf("command %d: %d %s", i, status, body)
				}
			}()
		}
		wg.Wait()
	})
}

// waitStarted waits for a command to have touched "started" in the
// workspace, then removes it.
func waitStarted(t *testing.T, g *gatewayProc, token, id string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions/"+id+"/files?path=started", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				req, _ := http.NewRequest(http.MethodDelete, g.URL+"/v1/sessions/"+id+"/files?path=started", nil)
				req.Header.Set("Authorization", "Bearer "+token)
				if res, err := http.DefaultClient.Do(req); err == nil {
					res.Body.Close()
				}
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the command did not start in 60s")
}

// Issue 35 item 10: SIGTERM ended a still-running command's connection
// with no answer. At the end of the drain it gets one: JSON, 503
// shutting_down with the output so far; NDJSON, a closing error line.
func TestRESTCommandAnsweredAtShutdown(t *testing.T) {
	g := startGateway(t, "--shutdown-timeout", "1s")
	id := g.createSession(t).SessionID
	type answer struct {
		status int
		body   []byte
	}
	jsonDone, ndDone := make(chan answer, 1), make(chan answer, 1)
	go func() {
		status, body := postCommand(t, g, g.Token, id, map[string]any{"command": "echo so far; touch started; sleep 120"}, "")
		jsonDone <- answer{status, body}
	}()
	waitStarted(t, g, g.Token, id)
	// The stream: read its first line before the signal.
	b, _ := json.Marshal(map[string]any{"command": "echo streamed; sleep 120"})
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+g.Token)
	req.Header.Set("Accept", "application/x-ndjson")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, "streamed") {
		t.Fatalf("first line %q: %v", first, err)
	}
	go func() {
		rest, _ := io.ReadAll(br)
		ndDone <- answer{res.StatusCode, rest}
	}()
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	got := make([]answer, 2)
	for i, c := range []chan answer{jsonDone, ndDone} {
		select {
		case got[i] = <-c:
		case <-time.After(60 * time.Second):
			t.Fatal("no answer 60s after SIGTERM")
		}
	}
	<-g.done
	a, n := got[0], got[1]
	var body struct {
		Error  struct{ Code string } `json:"error"`
		Stdout *string               `json:"stdout"`
	}
	if err := json.Unmarshal(a.body, &body); err != nil || a.status != http.StatusServiceUnavailable ||
		body.Error.Code != "shutting_down" || body.Stdout == nil || *body.Stdout != "so far\n" {
		t.Errorf("JSON answer: %d %q (%v)", a.status, a.body, err)
	}
	lines := strings.Split(strings.TrimSuffix(string(n.body), "\n"), "\n")
	if last := lines[len(lines)-1]; errorCode([]byte(last)) != "shutting_down" {
		t.Errorf("stream's last line %q (all: %q)", last, n.body)
	}
}
