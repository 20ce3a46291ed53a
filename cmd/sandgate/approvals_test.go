package main

import (
	"bufio"
	"bytes"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

type pendingItem struct {
	ID        string `json:"id"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Since     string `json:"since"`
	Via       string `json:"via"`
	UserAgent string `json:"userAgent"`
}

// TestLinuxEgressApprovals (issue 42 item 5): a session created with
// egressMode "ask" parks a connection to a host outside its list until a
// decision through the API: approved, it completes; denied, it is refused;
// undecided, it is refused at --egress-ask-timeout. Through the explicit
// proxy (curl with HTTP(S)_PROXY) and transparent TCP (a Python socket);
// each decision is audited, a follower sees it come and go, and a
// remembered approval adds the host:port to the session's list.
func TestLinuxEgressApprovals(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	g := startGateway(t, append(f.args, "--egress-ask-timeout", "3s")...)
	hp, tp := ":"+f.httpPort, ":"+f.tlsPort

	var e apiError
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egressMode": "maybe"}, &e); code != http.StatusBadRequest || e.Error.Code != "invalid_egress_mode" {
		t.Errorf("egressMode maybe: %d %+v, want 400 invalid_egress_mode", code, e)
	}
	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"pypi.test" + hp}, "egressMode": "ask"}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	base := "/v1/sessions/" + s.SessionID + "/egress/pending"

	// A follower of the pending connections, from the start.
	req, _ := http.NewRequest(http.MethodGet, g.URL+base+"?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("follow: %d %q", resp.StatusCode, ct)
	}
	events := make(chan string, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "event: ") || strings.HasPrefix(l, "data: ") {
				events <- l
			}
		}
	}()

	// start runs cmd in the sandbox in the background; the channel gives
	// its stdout and stderr when it ends.
	start := func(cmd string) <-chan string {
		c := exec.Command(ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, cmd)...)
		c.Env = g.clientEnv()
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan string, 1)
		go func() {
			timer := time.AfterFunc(90*time.Second, func() { c.Process.Kill() })
			c.Wait()
			timer.Stop()
			done <- out.String()
		}()
		return done
	}
	wait := func(ch <-chan string) string {
		select {
		case out := <-ch:
			return out
		case <-time.After(120 * time.Second):
			t.Fatal("the sandbox command did not end")
			return ""
		}
	}
	waitPending := func(port string) pendingItem {
		t.Helper()
		for range 1200 {
			var page struct {
				Pending []pendingItem `json:"pending"`
			}
			if code := g.api(t, http.MethodGet, base, nil, &page); code != http.StatusOK {
				t.Fatalf("pending: %d", code)
			}
			for _, p := range page.Pending {
				if p.Host == "other.test" && ":"+strconv.Itoa(p.Port) == port {
					return p
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no connection to other.test%s parked", port)
		return pendingItem{}
	}
	decide := func(id, decision string, remember bool) int {
		t.Helper()
		var out map[string]any
		return g.api(t, http.MethodPost, base+"/"+id, map[string]any{"decision": decision, "remember": remember}, &out)
	}
	noProxy := "env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy "
	pySocket := noProxy + `python3 -c "import socket
s=socket.create_connection(('other.test', ` + f.httpPort + `), timeout=60); s.sendall(b'GET /hello HTTP/1.0\r\nHost: other.test` + hp + `\r\n\r\n')
try:
    print(s.recv(1000).decode().split('\r\n')[0] or 'refused')
except OSError:
    print('refused')"`

	// 1. Through HTTP_PROXY (a plain http:// URI), approved: it completes.
	out := start("curl -sS --max-time 60 http://other.test" + hp + "/hello")
	p := waitPending(hp)
	if p.Via != "proxy" || !strings.HasPrefix(p.UserAgent, "curl/") || p.Since == "" {
		t.Errorf("pending %+v: want via proxy, curl's User-Agent, since", p)
	}
	if code := decide(p.ID, "allow", false); code != http.StatusOK {
		t.Errorf("allow: %d", code)
	}
	if got := wait(out); got != "hello from other.test"+hp+"\n" {
		t.Errorf("approved through the proxy: %q", got)
	}
	// 2. Through HTTPS_PROXY (CONNECT), denied: refused.
	out = start("curl -sS -k --max-time 60 https://other.test" + tp + "/hello")
	p = waitPending(tp)
	if code := decide(p.ID, "deny", false); code != http.StatusOK {
		t.Errorf("deny: %d", code)
	}
	if got := wait(out); !strings.Contains(got, "CONNECT tunnel failed, response 403") {
		t.Errorf("denied through the proxy: %q", got)
	}
	// 3. Transparent TCP (a Python socket: the name resolves in ask mode),
	// undecided: refused at the timeout.
	out = start(pySocket)
	if p = waitPending(hp); p.Via != "transparent" {
		t.Errorf("pending %+v: want via transparent", p)
	}
	if got := wait(out); got != "refused\n" {
		t.Errorf("timed out: %q", got)
	}
	if code := decide(p.ID, "allow", false); code != http.StatusNotFound {
		t.Errorf("deciding a timed-out connection: %d, want 404", code)
	}
	// 4. Transparent, approved and remembered: it completes, the list
	// keeps other.test:port, and the next connection is not parked.
	out = start(pySocket)
	p = waitPending(hp)
	if code := decide(p.ID, "allow", true); code != http.StatusOK {
		t.Errorf("allow and remember: %d", code)
	}
	if got := wait(out); got != "HTTP/1.0 200 OK\n" && got != "HTTP/1.1 200 OK\n" {
		t.Errorf("approved transparent: %q", got)
	}
	var got egressSession
	g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &got)
	if !strings.Contains(strings.Join(got.Egress.Allow, " "), "other.test"+hp) {
		t.Errorf("egress.allow after a remembered approval: %v", got.Egress.Allow)
	}
	if got := wait(start(pySocket)); got != "HTTP/1.0 200 OK\n" && got != "HTTP/1.1 200 OK\n" {
		t.Errorf("after a remembered approval: %q", got)
	}
	// Bad decisions.
	if code := g.api(t, http.MethodPost, base+"/nope", map[string]any{"decision": "allow"}, &e); code != http.StatusNotFound || e.Error.Code != "pending_not_found" {
		t.Errorf("unknown pending: %d %+v", code, e)
	}
	if code := g.api(t, http.MethodPost, base+"/nope", map[string]any{"decision": "maybe"}, &e); code != http.StatusBadRequest || e.Error.Code != "invalid_decision" {
		t.Errorf("decision maybe: %d %+v", code, e)
	}

	// Each decision is audited: approved (twice), denied, timeout.
	var page struct {
		Events []struct{ Kind, Op, Result, Host string } `json:"events"`
	}
	results := map[string]int{}
	for range 200 {
		g.api(t, http.MethodGet, "/v1/audit?limit=1000&session="+s.SessionID, nil, &page)
		results = map[string]int{}
		for _, ev := range page.Events {
			if ev.Kind == "egress" && ev.Op == "ask" && ev.Host == "other.test" {
				results[ev.Result]++
			}
		}
		if results["approved"] == 2 && results["denied"] == 1 && results["timeout"] == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if results["approved"] != 2 || results["denied"] != 1 || results["timeout"] != 1 {
		t.Errorf("audited approvals %v, want approved 2, denied 1, timeout 1", results)
	}
	// The follower saw four connections parked and resolved.
	var lines []string
	for len(lines) < 16 {
		select {
		case l, ok := <-events:
			if !ok {
				t.Fatalf("the follow stream ended: %q", lines)
			}
			lines = append(lines, l)
			continue
		case <-time.After(30 * time.Second):
		}
		break
	}
	stream := strings.Join(lines, "\n")
	if strings.Count(stream, "event: pending") != 4 || strings.Count(stream, "event: resolved") != 4 || !strings.Contains(stream, `"host":"other.test"`) {
		t.Errorf("follow stream: %s", stream)
	}
}

// TestLinuxEgressAskClientGone: a parked transparent connection whose
// client closes it (here a Python socket that gives up after 2 s) is let
// go at once, not at --egress-ask-timeout (5 minutes here): it leaves the
// pending list, its descriptor is released, and no decision is recorded.
func TestLinuxEgressAskClientGone(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	f := newEgressFixture(t)
	g := startGateway(t, append(f.args, "--egress-ask-timeout", "5m")...)
	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"pypi.test:" + f.httpPort}, "egressMode": "ask"}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	base := "/v1/sessions/" + s.SessionID + "/egress/pending"
	pending := func() int {
		var page struct {
			Pending []pendingItem `json:"pending"`
		}
		if code := g.api(t, http.MethodGet, base, nil, &page); code != http.StatusOK {
			t.Fatalf("pending: %d", code)
		}
		return len(page.Pending)
	}
	cmd := `env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy python3 -c "import socket
s=socket.create_connection(('other.test', ` + f.httpPort + `), timeout=30); s.sendall(b'GET / HTTP/1.0\r\n\r\n'); s.settimeout(2)
try:
    s.recv(100)
except OSError:
    pass
s.close(); print('left')"`
	c := exec.Command(ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, cmd)...)
	c.Env = g.clientEnv()
	done := make(chan []byte, 1)
	go func() { out, _ := c.CombinedOutput(); done <- out }()
	parked := false
	for range 1200 {
		if pending() == 1 {
			parked = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !parked {
		t.Fatal("the connection was not parked")
	}
	select {
	case out := <-done:
		if !strings.Contains(string(out), "left") {
			t.Fatalf("the client: %s", out)
		}
	case <-time.After(120 * time.Second):
		c.Process.Kill()
		t.Fatal("the client did not end")
	}
	for range 120 { // a minute, far below the ask timeout (and the API's rate limit)
		if pending() == 0 {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatal("the client left, but its connection stays parked")
}
