package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/gwtest"
)

// wsOpts are sshOpts with sandgate proxy on another transport.
func wsOpts(g *gatewayProc, t *testing.T, s sessionJSON, transport string) []string {
	opts := g.sshOpts(t, s)
	for i, o := range opts {
		if strings.HasPrefix(o, "ProxyCommand=") {
			opts[i] = "ProxyCommand=" + sandgateBin + " proxy --transport " + transport + " %h"
		}
	}
	return opts
}

// OpenSSH through sandgate proxy --transport websocket: the SSH stream in
// a WebSocket reaches the session, and its tunnel is audited and counted
// as a CONNECT's is.
func TestOpenSSHOverWebSocket(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	opts := append(wsOpts(g, t, s, "websocket"), s.SessionID)
	payload := strings.Repeat("x", 200<<10)
	out, errOut, code := runClient(t, g.clientEnv(), strings.NewReader(payload), ssh, append(opts, "wc -c; echo done >&2; exit 3")...)
	if strings.TrimSpace(out) != "204800" || errOut != "done\n" || code != 3 {
		t.Fatalf("ssh over websocket = (%q, %q, %d)", out, errOut, code)
	}
	if !strings.Contains(g.stderr.String(), "transport=websocket") {
		t.Errorf("no tunnel_opened with transport=websocket in the log")
	}
	// The tunnel's bytes count in the session's stats...
	var st struct {
		Tunnel struct{ BytesIn, BytesOut int64 } `json:"tunnel"`
	}
	if c := g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID+"/stats", nil, &st); c != http.StatusOK {
		t.Fatalf("stats: %d", c)
	}
	if st.Tunnel.BytesIn < int64(len(payload)) || st.Tunnel.BytesOut == 0 {
		t.Errorf("stats tunnel bytes = %+v, want at least %d in", st.Tunnel, len(payload))
	}
	// ... and in the audit's tunnel.close, after a tunnel.open.
	auditPath := filepath.Join(g.DataDir, "audit.log")
	var events []audit.Event
	for deadline := time.Now().Add(20 * time.Second); ; {
		events = readAudit(t, auditPath)
		if len(find(events, audit.Event{Kind: audit.KindTunnelClose, Session: s.SessionID})) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	closed := requireOne(t, events, audit.Event{Kind: audit.KindTunnelClose, Session: s.SessionID})
	if closed.BytesIn < int64(len(payload)) || closed.BytesOut == 0 || closed.RequestID == "" {
		t.Errorf("tunnel.close = %+v", closed)
	}
	requireOne(t, events, audit.Event{Kind: audit.KindTunnelOpen, RequestID: closed.RequestID})

	// The proxy ends quietly when ssh is done: no "context canceled" from
	// the read it was in when ssh closed its stdin.
	for range 10 {
		if out, errOut, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "echo q")...); out != "q\n" || errOut != "" || code != 0 {
			t.Fatalf("ssh over websocket = (%q, %q, %d)", out, errOut, code)
		}
	}
}

// The WebSocket endpoint's refusals: a bad token 401, a foreign Origin
// (another site, or a preview origin) 403, the gateway's own Origin
// accepted, a GET with no Upgrade 400 websocket_required.
func TestSSHWebSocketRefusals(t *testing.T) {
	g := startGateway(t)
	s := g.createSession(t)
	u, _ := url.Parse(g.URL)
	path := "/v1/sessions/" + s.SessionID + "/ssh"
	dial := func(token, origin string) (int, string) {
		t.Helper()
		h := http.Header{}
		if token != "" {
			h.Set("Authorization", "Bearer "+token)
		}
		if origin != "" {
			h.Set("Origin", origin)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, g.URL+path, &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			c.CloseNow()
			return http.StatusSwitchingProtocols, ""
		}
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	tests := []struct {
		name, token, origin string
		status              int
		code                string
	}{
		{"bad token", "wrong", "", http.StatusUnauthorized, "unauthorized"},
		{"no token", "", "", http.StatusUnauthorized, "unauthorized"},
		{"foreign origin", g.Token, "https://evil.example", http.StatusForbidden, "origin_not_allowed"},
		{"preview origin", g.Token, "http://3000-" + s.SessionID + ".localhost:" + u.Port(), http.StatusForbidden, "origin_not_allowed"},
		{"own origin", g.Token, "http://" + u.Host, http.StatusSwitchingProtocols, ""},
		{"no origin", g.Token, "", http.StatusSwitchingProtocols, ""},
	}
	for _, tt := range tests {
		status, body := dial(tt.token, tt.origin)
		if status != tt.status || !strings.Contains(body, tt.code) {
			t.Errorf("%s: %d %s, want %d %s", tt.name, status, body, tt.status, tt.code)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, g.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(b.String(), "websocket_required") {
		t.Errorf("plain GET: %d %s", resp.StatusCode, b.String())
	}
}

// --transport auto through a front end that refuses CONNECT (as many
// ingresses do) falls back to the WebSocket; --transport connect fails
// there, with the front end's status.
func TestProxyAutoFallsBackToWebSocket(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	front := noConnectFront(t, g)
	env := append(cleanEnv(), "SANDBOX_API_URL="+front.URL, "SANDBOX_API_TOKEN="+g.Token)

	out, errOut, code := runClient(t, env, nil, ssh, append(wsOpts(g, t, s, "auto"), s.SessionID, "echo via-$((40+2))")...)
	if out != "via-42\n" || code != 0 {
		t.Fatalf("auto through a front end without CONNECT = (%q, %q, %d)", out, errOut, code)
	}
	// The environment twin of --transport.
	out, _, code = runClient(t, append(env, "SANDBOX_TRANSPORT=websocket"), nil, ssh, append(g.sshOpts(t, s), s.SessionID, "echo env")...)
	if out != "env\n" || code != 0 {
		t.Errorf("SANDBOX_TRANSPORT=websocket: (%q, %d)", out, code)
	}
	_, errOut, code = runClient(t, env, strings.NewReader(""), sandgateBin, "proxy", "--transport", "connect", s.SessionID)
	if code == 0 || !strings.Contains(errOut, "405") {
		t.Errorf("connect through the front end: code %d, %q", code, errOut)
	}
	_, errOut, code = runClient(t, env, strings.NewReader(""), sandgateBin, "proxy", "--transport", "bogus", s.SessionID)
	if code != 2 || !strings.Contains(errOut, "unknown transport") {
		t.Errorf("--transport bogus: code %d, %q", code, errOut)
	}
}

// noConnectFront is a reverse proxy in front of g that answers 405 to
// CONNECT, as many ingresses do, and passes everything else (WebSocket
// upgrades too).
func noConnectFront(t *testing.T, g *gatewayProc) *httptest.Server {
	t.Helper()
	target, _ := url.Parse(g.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			http.Error(w, "CONNECT is not passed here", http.StatusMethodNotAllowed)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	return front
}

// A WebSocket tunnel ends with its session, as a CONNECT does.
func TestWebSocketTunnelEndsWithSession(t *testing.T) {
	g := startGateway(t)
	s := g.createSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, g.URL+"/v1/sessions/"+s.SessionID+"/ssh",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + g.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, msg, err := c.Read(ctx); err != nil || !bytes.HasPrefix(msg, []byte("SSH-2.0-")) {
		t.Fatalf("first message %q, %v", msg, err)
	}
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	for {
		if _, _, err := c.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatal("the WebSocket outlived its session")
			}
			break
		}
	}
}

// The terminal WebSocket: a shell on a PTY that follows resize messages,
// and tells its exit status before it closes.
func TestTerminalWebSocket(t *testing.T) {
	g := startGateway(t)
	s := g.createSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, g.URL+"/v1/sessions/"+s.SessionID+"/terminal",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + g.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":101,"rows":37}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("stty size; echo sum=$((40+2)); exit 5\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var exit string
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("read: %v (output %q)", err, out.String())
			}
			break
		}
		if typ == websocket.MessageText {
			exit = string(msg)
			continue
		}
		out.Write(msg)
	}
	if !strings.Contains(out.String(), "37 101") || !strings.Contains(out.String(), "sum=42") {
		t.Errorf("terminal output %q, want stty size 37 101 and sum=42", out.String())
	}
	if exit != `{"type":"exit","code":5}` {
		t.Errorf("exit message %q", exit)
	}
}

// A terminal's shell is audited as an SSH shell, and the client going
// away hangs it up (everything it runs is killed), as with SSH.
func TestTerminalAuditAndHangup(t *testing.T) {
	g := startGateway(t)
	s := g.createSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *websocket.Conn {
		c, _, err := websocket.Dial(ctx, g.URL+"/v1/sessions/"+s.SessionID+"/terminal",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + g.Token}}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := dial()
	_ = c.Write(ctx, websocket.MessageBinary, []byte("exit 6\n"))
	for {
		if _, _, err := c.Read(ctx); err != nil {
			break
		}
	}
	c.CloseNow()
	auditPath := filepath.Join(g.DataDir, "audit.log")
	var sh []audit.Event
	for deadline := time.Now().Add(20 * time.Second); len(sh) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		sh = find(readAudit(t, auditPath), audit.Event{Kind: audit.KindCommand, Source: "shell", Session: s.SessionID})
	}
	if len(sh) != 1 || sh[0].ExitCode == nil || *sh[0].ExitCode != 6 {
		t.Errorf("shell audit events: %+v", sh)
	}

	c = dial()
	_ = c.Write(ctx, websocket.MessageBinary, []byte("echo started; exec sleep 12345\n"))
	var out bytes.Buffer
	for !bytes.Contains(out.Bytes(), []byte("started\r\n")) {
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (output %q)", err, out.String())
		}
		out.Write(msg)
	}
	sleeping := func() bool {
		for _, p := range sessionProcesses([]string{s.SessionID}) {
			if strings.Contains(p, "sleep 12345") {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(20 * time.Second); !sleeping(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the shell's sleep never showed up")
		}
	}
	c.CloseNow() // the client goes away
	for deadline := time.Now().Add(30 * time.Second); sleeping(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the terminal's shell outlived its client")
		}
	}
}

// A browser's way in: a ticket in place of the bearer token, with the
// gateway's own Origin, once.
func TestTerminalWithTicket(t *testing.T) {
	g := startGateway(t)
	s := g.createSession(t)
	var tk struct{ Ticket string }
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/tickets", nil, &tk); code != http.StatusCreated || tk.Ticket == "" {
		t.Fatalf("ticket: %d %+v", code, tk)
	}
	u, _ := url.Parse(g.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	target := g.URL + "/v1/sessions/" + s.SessionID + "/terminal?ticket=" + tk.Ticket
	opts := &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://" + u.Host}}}
	c, _, err := websocket.Dial(ctx, target, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	_ = c.Write(ctx, websocket.MessageBinary, []byte("exit 0\n"))
	var exit string
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageText {
			exit = string(msg)
		}
	}
	if exit != `{"type":"exit","code":0}` {
		t.Errorf("exit message %q", exit)
	}
	if _, resp, err := websocket.Dial(ctx, target, opts); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a used ticket: %v", err)
	}
}
