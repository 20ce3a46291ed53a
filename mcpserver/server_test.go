package mcpserver_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/mcpserver"
)

func TestMain(m *testing.M) {
	gwtest.Dispatch() // the workdir driver re-executes the test binary as sftp-server
	os.Exit(m.Run())
}

// connect runs srv over an in-memory MCP connection and returns the
// client side, and a function that returns Run's error once the client is
// gone and the server has cleaned up.
func connect(t *testing.T, srv *mcpserver.Server) (*mcp.ClientSession, func() error) {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() { done <- srv.Run(context.Background(), st) }()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	cs, err := client.Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait := sync.OnceValue(func() error { return <-done })
	t.Cleanup(func() { _ = cs.Close(); _ = wait() })
	return cs, wait
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !res.IsError && out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func sessionCount(t *testing.T, st *gwtest.Stack) int {
	t.Helper()
	var l struct {
		Total int `json:"total"`
	}
	if code := st.Do(t, st.Token, http.MethodGet, "/v1/sessions", nil, &l); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	return l.Total
}

// TestServerInProcess drives the server through the SDK's client over an
// in-memory transport against an in-process gateway (under -race): calls
// in parallel share one lazily created default session, and the session
// is deleted once the client disconnects.
func TestServerInProcess(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	srv := mcpserver.New(mcpserver.Options{
		Client: &mcpserver.Client{BaseURL: st.URL + "/v1", Token: st.Token},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	cs, done := connect(t, srv)

	sessions := make(chan string, 4)
	for range cap(sessions) {
		go func() {
			var r mcpserver.RunCommandOutput
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "echo hi"}})
			if err == nil && !res.IsError {
				b, _ := json.Marshal(res.StructuredContent)
				err = json.Unmarshal(b, &r)
			}
			if err != nil || res.IsError || r.Stdout != "hi\n" {
				t.Errorf("run_command: %v %+v %+v", err, res, r)
			}
			sessions <- r.Session
		}()
	}
	first := <-sessions
	for range cap(sessions) - 1 {
		if s := <-sessions; s != first {
			t.Errorf("parallel calls used sessions %s and %s", first, s)
		}
	}
	if n := sessionCount(t, st); n != 1 {
		t.Errorf("%d sessions, want 1", n)
	}

	var w mcpserver.WriteFileOutput
	if res := call(t, cs, "write_file", map[string]any{"path": "a/b.txt", "content": "x"}, &w); res.IsError {
		t.Fatal(text(res))
	}
	var r mcpserver.RunCommandOutput
	call(t, cs, "run_command", map[string]any{"command": "cd a && cat b.txt"}, &r)
	call(t, cs, "run_command", map[string]any{"command": "cat b.txt"}, &r)
	if r.Stdout != "x" || !strings.HasSuffix(r.Cwd, "/a") {
		t.Errorf("cd did not persist: %+v", r)
	}

	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := done(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := sessionCount(t, st); n != 0 {
		t.Errorf("%d sessions after the client left, want 0", n)
	}
}

// TestServerUnreachableGateway: every failure is a tool error; the
// server keeps serving.
func TestServerUnreachableGateway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := mcpserver.New(mcpserver.Options{Client: &mcpserver.Client{BaseURL: "http://" + addr}})
	cs, _ := connect(t, srv)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"command": "true"}, "create the default session"},
		{"read_file", map[string]any{"path": "x", "session": "sbx-x"}, "connection refused"},
		{"write_file", map[string]any{"path": "x", "content": "%%", "encoding": "base64"}, "not valid base64"},
		{"write_file", map[string]any{"path": "x", "content": "", "encoding": "utf-16"}, "use utf-8 or base64"},
		{"read_file", map[string]any{"path": "x", "offset": -1}, "negative"},
		{"delete_session", map[string]any{}, "no default session"},
		{"run_python", map[string]any{"code": "1", "session": "sbx-x"}, "connection refused"},
	} {
		res := call(t, cs, tc.tool, tc.args, nil)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s(%v): error %v %q, want %q", tc.tool, tc.args, res.IsError, text(res), tc.want)
		}
	}
}

func TestClientBaseURL(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	for _, base := range []string{st.URL, st.URL + "/", st.URL + "/v1", st.URL + "/v1/"} {
		c := &mcpserver.Client{BaseURL: base, Token: st.Token}
		_, err := c.GetSession(context.Background(), "sbx-aaaaaaaaaaaaaaaaaaaa")
		if !mcpserver.IsStatus(err, http.StatusNotFound) || !strings.Contains(err.Error(), "not_found") {
			t.Errorf("base %q: %v, want a 404 not_found", base, err)
		}
	}
	c := &mcpserver.Client{BaseURL: st.URL, Token: "wrong"}
	if _, err := c.GetSession(context.Background(), "sbx-aaaaaaaaaaaaaaaaaaaa"); !mcpserver.IsStatus(err, http.StatusUnauthorized) {
		t.Errorf("bad token: %v", err)
	}
}
