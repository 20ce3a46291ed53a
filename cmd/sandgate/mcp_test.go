package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandgate/sandgate/mcpserver"
)

// mcpConn is an MCP client connected to a `sandgate mcp` process.
type mcpConn struct {
	cs  *mcp.ClientSession
	cmd *exec.Cmd
}

// connectMCP runs `sandgate mcp args...` against g and connects the
// go-sdk's MCP client to it over stdio.
func connectMCP(t *testing.T, g *gatewayProc, args ...string) *mcpConn {
	t.Helper()
	cmd := newCmd(g.clientEnv(), sandgateBin, append([]string{"mcp"}, args...)...)
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "sandgate-test", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	c := &mcpConn{cs: cs, cmd: cmd}
	t.Cleanup(func() {
		c.close(t)
		if t.Failed() {
			t.Logf("sandgate mcp stderr:\n%s", stderr)
		}
	})
	return c
}

// close disconnects: stdin EOF, then waits for the server to exit.
func (c *mcpConn) close(t *testing.T) {
	t.Helper()
	if c.cs == nil {
		return
	}
	if err := c.cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	c.cs = nil
}

// call calls a tool and decodes its structured result into out (when not
// an error). It returns the result.
func (c *mcpConn) call(t *testing.T, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	if !res.IsError && out != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decode %s: %v", name, b, err)
		}
	}
	return res
}

// mustCall is call for a call that must succeed.
func (c *mcpConn) mustCall(t *testing.T, name string, args map[string]any, out any) {
	t.Helper()
	if res := c.call(t, name, args, out); res.IsError {
		t.Fatalf("%s(%v): tool error: %s", name, args, resultText(res))
	}
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// sessionList is the ids of the gateway's sessions, through REST.
func (g *gatewayProc) sessionList(t *testing.T) []string {
	t.Helper()
	var l struct {
		Sessions []struct {
			SessionID string `json:"sessionId"`
		} `json:"sessions"`
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions?limit=100", nil, &l); code != http.StatusOK {
		t.Fatalf("list sessions: %d", code)
	}
	var ids []string
	for _, s := range l.Sessions {
		ids = append(ids, s.SessionID)
	}
	return ids
}

func TestMCPTools(t *testing.T) {
	g := startGateway(t)
	c := connectMCP(t, g)
	res, err := c.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{ // tool -> required arguments
		"create_session": nil,
		"run_command":    {"command"},
		"run_python":     {"code"},
		"read_file":      {"path"},
		"write_file":     {"path", "content"},
		"list_files":     nil,
		"start_process":  {"command"},
		"process_output": {"processId"},
		"delete_session": nil,
		// decide_egress only with --egress-decisions.
		"list_egress_pending": nil,
	}
	seen := map[string]bool{}
	for _, tool := range res.Tools {
		seen[tool.Name] = true
		req, ok := want[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %q", tool.Name)
			continue
		}
		if len(tool.Description) < 100 {
			t.Errorf("%s: description too short for a model: %q", tool.Name, tool.Description)
		}
		schema, _ := tool.InputSchema.(map[string]any)
		if schema["type"] != "object" {
			t.Errorf("%s: input schema %v is not an object", tool.Name, tool.InputSchema)
		}
		props, _ := schema["properties"].(map[string]any)
		if tool.Name != "delete_session" && tool.Name != "create_session" {
			if _, ok := props["session"]; !ok {
				t.Errorf("%s: no session argument: %v", tool.Name, props)
			}
		}
		for _, p := range props {
			if d, _ := p.(map[string]any)["description"].(string); d == "" {
				t.Errorf("%s: an argument without a description: %v", tool.Name, p)
			}
		}
		var got []string
		if r, ok := schema["required"].([]any); ok {
			for _, x := range r {
				got = append(got, x.(string))
			}
		}
		slices.Sort(got)
		slices.Sort(req)
		if !slices.Equal(got, req) {
			t.Errorf("%s: required %v, want %v", tool.Name, got, req)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("tool %s missing", name)
		}
	}
	if ids := g.sessionList(t); len(ids) != 0 {
		t.Errorf("listing tools created sessions: %v", ids)
	}
}

func TestMCPDefaultSession(t *testing.T) {
	g := startGateway(t)
	c := connectMCP(t, g)

	// The shell persists: cd carries over.
	var r mcpserver.RunCommandOutput
	c.mustCall(t, "run_command", map[string]any{"command": "cd /tmp && export MCPVAR=kept"}, &r)
	if r.ExitCode == nil || *r.ExitCode != 0 || r.Cwd != "/tmp" {
		t.Fatalf("cd /tmp: %+v", r)
	}
	ids := g.sessionList(t)
	if len(ids) != 1 || r.Session != ids[0] {
		t.Fatalf("default session %q, gateway has %v", r.Session, ids)
	}
	c.mustCall(t, "run_command", map[string]any{"command": "pwd; echo $MCPVAR; echo oops >&2; exit 3"}, &r)
	if r.Stdout != "/tmp\nkept\n" || r.Stderr != "oops\n" || r.ExitCode == nil || *r.ExitCode != 3 || r.Cwd != "/tmp" {
		t.Fatalf("pwd: %+v", r)
	}

	// A timeout is exit code 124.
	c.mustCall(t, "run_command", map[string]any{"command": "echo started; sleep 30", "timeout": 1}, &r)
	if r.ExitCode == nil || *r.ExitCode != 124 || !r.TimedOut || !strings.Contains(r.Stdout, "started") {
		t.Fatalf("timeout: %+v", r)
	}
	c.mustCall(t, "run_command", map[string]any{"command": "pwd"}, &r)
	if r.Stdout != "/tmp\n" {
		t.Errorf("after the timeout the shell is in %q, want /tmp", r.Stdout)
	}

	// Files: write, read back, list.
	var w mcpserver.WriteFileOutput
	c.mustCall(t, "write_file", map[string]any{"path": "dir/sub/hello.txt", "content": "héllo\nworld\n"}, &w)
	if w.SizeBytes != int64(len("héllo\nworld\n")) {
		t.Errorf("write: %+v", w)
	}
	var rf mcpserver.ReadFileOutput
	c.mustCall(t, "read_file", map[string]any{"path": "dir/sub/hello.txt"}, &rf)
	if rf.Content != "héllo\nworld\n" || rf.Encoding != "utf-8" || rf.Truncated || rf.SizeBytes != w.SizeBytes {
		t.Errorf("read: %+v", rf)
	}
	c.mustCall(t, "read_file", map[string]any{"path": "dir/sub/hello.txt", "offset": 7}, &rf)
	if rf.Content != "world\n" || rf.NextOffset != w.SizeBytes {
		t.Errorf("read at offset 7: %+v", rf)
	}
	c.mustCall(t, "write_file", map[string]any{"path": "bin.dat", "content": "AP8A/w==", "encoding": "base64"}, &w)
	c.mustCall(t, "read_file", map[string]any{"path": "bin.dat"}, &rf)
	if rf.Encoding != "base64" || rf.Content != "AP8A/w==" {
		t.Errorf("binary read: %+v", rf)
	}
	c.mustCall(t, "run_command", map[string]any{"command": "cat /workspace/dir/sub/hello.txt 2>/dev/null || cat ~/dir/sub/hello.txt"}, &r)
	if r.Stdout != "héllo\nworld\n" {
		t.Errorf("the shell sees %q", r.Stdout)
	}
	var lf mcpserver.ListFilesOutput
	c.mustCall(t, "list_files", map[string]any{"path": "dir", "recursive": true}, &lf)
	var paths []string
	for _, e := range lf.Entries {
		paths = append(paths, e.Path+":"+e.Type)
	}
	if !slices.Contains(paths, "dir/sub:dir") || !slices.Contains(paths, "dir/sub/hello.txt:file") {
		t.Errorf("list: %v", paths)
	}
	res := c.call(t, "read_file", map[string]any{"path": "no/such/file"}, nil)
	if !res.IsError || !strings.Contains(resultText(res), "file_not_found") {
		t.Errorf("missing file: error %v %q", res.IsError, resultText(res))
	}

	// Background processes.
	var sp mcpserver.StartProcessOutput
	c.mustCall(t, "start_process", map[string]any{"command": "echo out; echo err >&2; sleep 0.5; echo late; exit 7"}, &sp)
	if sp.ProcessID == "" {
		t.Fatalf("start: %+v", sp)
	}
	var po mcpserver.ProcessOutputOutput
	c.mustCall(t, "process_output", map[string]any{"processId": sp.ProcessID, "wait": 20}, &po)
	if po.Status != "exited" || po.ExitCode == nil || *po.ExitCode != 7 || po.Stdout != "out\nlate\n" || po.Stderr != "err\n" || po.More {
		t.Errorf("process output: %+v", po)
	}
	next := po.NextOffset
	c.mustCall(t, "process_output", map[string]any{"processId": sp.ProcessID, "offset": next}, &po)
	if po.Stdout != "" || po.Stderr != "" || po.NextOffset != next {
		t.Errorf("output from nextOffset: %+v", po)
	}
	res = c.call(t, "process_output", map[string]any{"processId": "p999"}, nil)
	if !res.IsError || !strings.Contains(resultText(res), "process_not_found") {
		t.Errorf("unknown process: %v %q", res.IsError, resultText(res))
	}

	// The Python kernel: it works, or the gateway says it has none.
	var py mcpserver.RunPythonOutput
	c.mustCall(t, "run_python", map[string]any{"code": "x = 20"}, &py)
	c.mustCall(t, "run_python", map[string]any{"code": "print('hi')\nx * 2 + 2"}, &py)
	if py.Result == nil || *py.Result != "42" || py.Stdout != "hi\n" {
		t.Errorf("python: %+v", py)
	}

	// Arguments the schema refuses are errors, not crashes.
	res, err := c.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"timeout": 1}})
	if err == nil && !res.IsError {
		t.Errorf("run_command without command: %+v", res)
	}
	c.mustCall(t, "run_command", map[string]any{"command": "true"}, &r)

	// Disconnecting deletes the default session.
	c.close(t)
	if ids := g.sessionList(t); len(ids) != 0 {
		t.Errorf("after disconnect the gateway still has %v", ids)
	}
}

func TestMCPNamedSessions(t *testing.T) {
	g := startGateway(t)
	c := connectMCP(t, g)

	var named, unnamed mcpserver.CreateSessionOutput
	c.mustCall(t, "create_session", map[string]any{"name": "keep", "ttl": 600}, &named)
	if !named.Kept || named.SessionID == "" {
		t.Fatalf("named: %+v", named)
	}
	c.mustCall(t, "create_session", map[string]any{}, &unnamed)
	if unnamed.Kept {
		t.Errorf("unnamed kept: %+v", unnamed)
	}
	res := c.call(t, "create_session", map[string]any{"name": "keep"}, nil)
	if !res.IsError {
		t.Errorf("a second session named keep: %s", resultText(res))
	}
	res = c.call(t, "create_session", map[string]any{"ttl": 5}, nil)
	if !res.IsError || !strings.Contains(resultText(res), "invalid_ttl") {
		t.Errorf("ttl 5: %v %q", res.IsError, resultText(res))
	}

	var r mcpserver.RunCommandOutput
	c.mustCall(t, "run_command", map[string]any{"command": "echo named > f.txt", "session": "keep"}, &r)
	if r.Session != named.SessionID {
		t.Errorf("session keep ran in %s, want %s", r.Session, named.SessionID)
	}
	var rf mcpserver.ReadFileOutput
	c.mustCall(t, "read_file", map[string]any{"path": "f.txt", "session": named.SessionID}, &rf)
	if rf.Content != "named\n" {
		t.Errorf("read by id: %+v", rf)
	}
	res = c.call(t, "read_file", map[string]any{"path": "f.txt", "session": unnamed.SessionID}, nil)
	if !res.IsError {
		t.Errorf("f.txt visible in another session")
	}
	res = c.call(t, "run_command", map[string]any{"command": "true", "session": "sbx-aaaaaaaaaaaaaaaaaaaa"}, nil)
	if !res.IsError || !strings.Contains(resultText(res), "not_found") {
		t.Errorf("unknown session: %v %q", res.IsError, resultText(res))
	}

	// delete_session, by id and for the default session.
	var d mcpserver.DeleteSessionOutput
	c.mustCall(t, "run_command", map[string]any{"command": "true"}, &r)
	def := r.Session
	c.mustCall(t, "delete_session", map[string]any{}, &d)
	if d.Deleted != def {
		t.Errorf("deleted %s, want the default %s", d.Deleted, def)
	}
	c.mustCall(t, "run_command", map[string]any{"command": "true"}, &r)
	if r.Session == def || r.Session == "" {
		t.Errorf("after delete_session the default session is %q", r.Session)
	}
	if ids := g.sessionList(t); len(ids) != 3 || slices.Contains(ids, def) {
		t.Errorf("sessions %v: want named, unnamed and the new default", ids)
	}
	// A default session that ends on the gateway's side (here deleted over
	// REST; or expired) is replaced by the next call without a session.
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+r.Session, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete the default session over REST: %d", code)
	}
	gone := r.Session
	if res := c.call(t, "run_command", map[string]any{"command": "true"}, nil); !res.IsError || !strings.Contains(resultText(res), "session_gone") {
		t.Errorf("a call on the deleted default session: %v %q", res.IsError, resultText(res))
	}
	c.mustCall(t, "run_command", map[string]any{"command": "true"}, &r)
	if r.Session == gone || r.Session == "" {
		t.Errorf("the default session after it was deleted elsewhere: %q", r.Session)
	}
	c.close(t)
	if ids := g.sessionList(t); !slices.Equal(ids, []string{named.SessionID}) {
		t.Errorf("after disconnect: %v, want only the named %s", ids, named.SessionID)
	}

	// The name works in a later connection too: the gateway keeps it.
	b := connectMCP(t, g)
	b.mustCall(t, "read_file", map[string]any{"path": "f.txt", "session": "keep"}, &rf)
	if rf.Content != "named\n" {
		t.Errorf("read by name in a new connection: %+v", rf)
	}
	if res := b.call(t, "create_session", map[string]any{"name": "keep"}, nil); !res.IsError || !strings.Contains(resultText(res), "name_taken") {
		t.Errorf("the name again in a new connection: %v %q", res.IsError, resultText(res))
	}
	b.close(t)

	// --session attaches to an existing session and never deletes it.
	a := connectMCP(t, g, "--session", named.SessionID)
	a.mustCall(t, "read_file", map[string]any{"path": "f.txt"}, &rf)
	if rf.Content != "named\n" {
		t.Errorf("attached read: %+v", rf)
	}
	a.close(t)
	if ids := g.sessionList(t); !slices.Equal(ids, []string{named.SessionID}) {
		t.Errorf("after the attached client left: %v", ids)
	}
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+named.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete the named session: %d", code)
	}
}

func TestMCPBadGateway(t *testing.T) {
	g := startGateway(t)
	env := append(cleanEnv(), "SANDBOX_API_URL="+g.URL, "SANDBOX_API_TOKEN=wrong")
	cmd := newCmd(env, sandgateBin, "mcp")
	client := mcp.NewClient(&mcp.Implementation{Name: "sandgate-test", Version: "v0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(resultText(res), "401") {
		t.Errorf("bad token: %v %q", res.IsError, resultText(res))
	}
	// The server is still up.
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Errorf("after a tool error: %v", err)
	}
}

// TestMCPSIGTERM: a server stopped by a signal ends the call in progress
// and still deletes its default session before it exits.
func TestMCPSIGTERM(t *testing.T) {
	g := startGateway(t)
	c := connectMCP(t, g)
	var r mcpserver.RunCommandOutput
	c.mustCall(t, "run_command", map[string]any{"command": "true"}, &r)
	if ids := g.sessionList(t); len(ids) != 1 {
		t.Fatalf("sessions: %v", ids)
	}
	go func() { // answered by the connection's end
		_, _ = c.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_command",
			Arguments: map[string]any{"command": "sleep 120", "timeout": 300}})
	}()
	time.Sleep(time.Second)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Well before the command's end: the call does not hold the exit.
	deadline := time.Now().Add(30 * time.Second)
	for len(g.sessionList(t)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the default session outlived SIGTERM: %v", g.sessionList(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.close(t) // reaps the process
}
