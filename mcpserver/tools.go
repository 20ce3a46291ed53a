package mcpserver

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// shellName is the persistent shell run_command uses in every session.
const shellName = "mcp"

const sessionArgDoc = "Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."

// --- create_session ---

// CreateSessionInput is create_session's arguments.
type CreateSessionInput struct {
	Name   string   `json:"name,omitempty" jsonschema:"A name to refer to the session by in other tools' session argument, here and in later MCP connections: 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit, unique among your live sessions. A named session is NOT deleted when the MCP client disconnects: it lives until its ttl ends, it is idle (no tool call) for the gateway's idle timeout (30 min by default), or delete_session."`
	Image  string   `json:"image,omitempty" jsonschema:"Root filesystem: 'default' (the gateway's own, the default) or an OCI image reference the gateway allows, e.g. python:3.12-slim."`
	TTL    int      `json:"ttl,omitempty" jsonschema:"Lifetime in seconds, 60 to 28800 (default 3600)."`
	Egress []string `json:"egress,omitempty" jsonschema:"Network destinations the sandbox may reach through its HTTP(S) proxy: hostnames (pypi.org), wildcards (*.pythonhosted.org), optional :port. Empty: no network at all."`
	// EgressMode is "deny" or "ask".
	EgressMode string `json:"egressMode,omitempty" jsonschema:"deny (default): a connection to a destination outside egress is refused. ask: it waits (up to the gateway's --egress-ask-timeout, 60 s by default) for a person to allow or deny it: see list_egress_pending and decide_egress."`
}

// CreateSessionOutput is create_session's result.
type CreateSessionOutput struct {
	SessionID string `json:"sessionId"`
	Name      string `json:"name,omitempty"`
	Image     string `json:"image"`
	ExpiresAt string `json:"expiresAt"`
	Egress    []any  `json:"egress"`
	Kept      bool   `json:"keptAfterDisconnect" jsonschema:"Whether the session survives the MCP client's disconnect."`
}

func (s *Server) createSession(ctx context.Context, _ *mcp.CallToolRequest, in CreateSessionInput) (*mcp.CallToolResult, CreateSessionOutput, error) {
	var out CreateSessionOutput
	if in.Name != "" && s.sess.nameTaken(in.Name) {
		return nil, out, fmt.Errorf("a session is already named %q here; pick another name or delete it first", in.Name)
	}
	meta := map[string]any{"createdBy": "sandgate mcp"}
	if in.Name != "" {
		meta["name"] = in.Name
	}
	sess, err := s.client.CreateSession(ctx, CreateSessionRequest{Name: in.Name, TTL: in.TTL, Image: in.Image, Egress: in.Egress, EgressMode: in.EgressMode, Metadata: meta})
	if err != nil {
		return nil, out, err
	}
	s.sess.created(sess.SessionID, in.Name)
	s.log.Info("mcp_session_created", "session", sess.SessionID, "name", in.Name)
	out = CreateSessionOutput{SessionID: sess.SessionID, Name: in.Name, Image: sess.Image, ExpiresAt: sess.ExpiresAt, Egress: sess.Egress.Allow, Kept: in.Name != ""}
	if out.Egress == nil {
		out.Egress = []any{}
	}
	return nil, out, nil
}

// --- delete_session ---

// DeleteSessionInput is delete_session's arguments.
type DeleteSessionInput struct {
	Session string `json:"session,omitempty" jsonschema:"Session id or name to delete. Omit it to delete this connection's default session (a new one is created by the next tool call that needs it)."`
}

// DeleteSessionOutput is delete_session's result.
type DeleteSessionOutput struct {
	Deleted string `json:"deleted"`
}

func (s *Server) deleteSession(ctx context.Context, _ *mcp.CallToolRequest, in DeleteSessionInput) (*mcp.CallToolResult, DeleteSessionOutput, error) {
	var out DeleteSessionOutput
	id, err := s.existing(in.Session)
	if err != nil {
		return nil, out, err
	}
	if err := s.client.DeleteSession(ctx, id); err != nil && !IsGone(err) {
		return nil, out, err
	}
	s.sess.deleted(id) // deleted now, or gone already (expired, deleted elsewhere)
	return nil, DeleteSessionOutput{Deleted: id}, nil
}

// existing resolves a session argument without creating a default session.
func (s *Server) existing(arg string) (string, error) {
	if arg != "" {
		return s.sess.resolve(context.Background(), arg) // never creates with an argument
	}
	s.sess.mu.Lock()
	id := s.sess.defaultID
	s.sess.mu.Unlock()
	if id == "" {
		return "", errors.New("there is no default session yet; nothing to delete")
	}
	return id, nil
}

// --- run_command ---

// RunCommandInput is run_command's arguments.
type RunCommandInput struct {
	Command string  `json:"command" jsonschema:"Shell command line (bash when the image has it, else sh). Pipes, redirections, && and cd work."`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"Seconds before the command is killed (default 45). A killed command answers exit code 124."`
	Session string  `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// RunCommandOutput is run_command's result.
type RunCommandOutput struct {
	ExitCode   *int   `json:"exitCode" jsonschema:"Exit status; 124 when the command timed out; null when a signal ended it."`
	ExitSignal string `json:"exitSignal,omitempty"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	Cwd        string `json:"cwd" jsonschema:"The shell's working directory after the command."`
	TimedOut   bool   `json:"timedOut"`
	Truncated  bool   `json:"truncated" jsonschema:"Output was cut: each stream keeps its head and tail."`
	DurationMs int64  `json:"durationMs"`
	Session    string `json:"session"`
}

func (s *Server) runCommand(ctx context.Context, _ *mcp.CallToolRequest, in RunCommandInput) (*mcp.CallToolResult, RunCommandOutput, error) {
	var out RunCommandOutput
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	r, err := s.client.RunCommand(ctx, id, CommandRequest{Command: in.Command, Timeout: cmp.Or(in.Timeout, answerWithin.Seconds()), MaxOutputBytes: s.outBytes, Shell: shellName})
	if err != nil {
		return nil, out, err
	}
	out = RunCommandOutput{
		ExitCode: r.ExitCode, Stdout: text(r.Stdout, r.StdoutBase64), Stderr: text(r.Stderr, r.StderrBase64),
		Cwd: r.Cwd, TimedOut: r.TimedOut, Truncated: r.Truncated, DurationMs: r.DurationMs, Session: id,
	}
	if r.ExitSignal != nil {
		out.ExitSignal = *r.ExitSignal
	}
	return nil, out, nil
}

// text is a stream as text: non-UTF-8 bytes become U+FFFD.
func text(s string, b64 []byte) string {
	if len(b64) > 0 {
		return strings.ToValidUTF8(string(b64), "\uFFFD")
	}
	return s
}

// --- run_python ---

// RunPythonInput is run_python's arguments.
type RunPythonInput struct {
	Code    string  `json:"code" jsonschema:"Python source, run like a notebook cell; the value of a final expression is returned as result (its repr)."`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"Seconds (default 45). On timeout the code gets KeyboardInterrupt; code that does not stop within 2 s is killed and the kernel restarts, losing its state."`
	Kernel  string  `json:"kernel,omitempty" jsonschema:"Kernel name (default 'default'): separate kernels have separate variables."`
	Session string  `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// RunPythonOutput is run_python's result.
type RunPythonOutput struct {
	Stdout      string       `json:"stdout"`
	Stderr      string       `json:"stderr"`
	Result      *string      `json:"result" jsonschema:"repr of the final expression's value; null if none."`
	Error       *PythonError `json:"error" jsonschema:"The uncaught exception (name, value, traceback); null if none."`
	TimedOut    bool         `json:"timedOut"`
	Interrupted bool         `json:"interrupted"`
	Restarted   bool         `json:"restarted"`
	StateLost   bool         `json:"stateLost" jsonschema:"The kernel restarted: earlier variables and imports are gone."`
	Truncated   bool         `json:"truncated"`
	DurationMs  int64        `json:"durationMs"`
	Session     string       `json:"session"`
}

func (s *Server) runPython(ctx context.Context, _ *mcp.CallToolRequest, in RunPythonInput) (*mcp.CallToolResult, RunPythonOutput, error) {
	var out RunPythonOutput
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	r, err := s.client.RunPython(ctx, id, PythonRequest{Code: in.Code, Timeout: cmp.Or(in.Timeout, answerWithin.Seconds()), Kernel: in.Kernel, MaxOutputBytes: s.outBytes})
	if IsStatus(err, http.StatusNotImplemented) {
		return nil, out, fmt.Errorf("this sandgate gateway lacks the persistent Python kernel (POST /python answered 501 not_implemented); use run_command with python3 instead: %w", err)
	}
	if err != nil {
		return nil, out, err
	}
	return nil, RunPythonOutput{
		Stdout: text(r.Stdout, r.StdoutBase64), Stderr: text(r.Stderr, r.StderrBase64),
		Result: r.Result, Error: r.Error, TimedOut: r.TimedOut, Interrupted: r.Interrupted,
		Restarted: r.Restarted, StateLost: r.StateLost, Truncated: r.Truncated, DurationMs: r.DurationMs, Session: id,
	}, nil
}

// --- read_file / write_file / list_files ---

// ReadFileInput is read_file's arguments.
type ReadFileInput struct {
	Path    string `json:"path" jsonschema:"File path: relative to the workspace (/workspace) or absolute inside the sandbox."`
	Offset  int64  `json:"offset,omitempty" jsonschema:"Byte offset to start at (default 0), to page through large files."`
	Session string `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// ReadFileOutput is read_file's result.
type ReadFileOutput struct {
	Content    string `json:"content"`
	Encoding   string `json:"encoding" jsonschema:"'utf-8', or 'base64' when the bytes are not UTF-8 text."`
	SizeBytes  int64  `json:"sizeBytes" jsonschema:"The whole file's size."`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"nextOffset"`
	Truncated  bool   `json:"truncated" jsonschema:"More of the file follows: call again with offset=nextOffset."`
}

func (s *Server) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	var out ReadFileOutput
	if in.Offset < 0 {
		return nil, out, errors.New("offset must not be negative")
	}
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	data, size, err := s.client.ReadFile(ctx, id, in.Path, in.Offset, int64(s.readMax))
	if err != nil {
		return nil, out, err
	}
	out = ReadFileOutput{Encoding: "utf-8", SizeBytes: size, Offset: in.Offset, NextOffset: in.Offset + int64(len(data))}
	out.Truncated = out.NextOffset < size
	if out.Truncated {
		// Do not cut a character in two: stop before an incomplete one.
		if cut := validPrefix(data); cut > 0 && cut < len(data) && cut >= len(data)-utf8.UTFMax {
			data = data[:cut]
			out.NextOffset = in.Offset + int64(cut)
		}
	}
	if utf8.Valid(data) {
		out.Content = string(data)
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	}
	return nil, out, nil
}

// validPrefix is the length of data's longest prefix that ends on a
// character boundary (assuming the rest is UTF-8).
func validPrefix(data []byte) int {
	for i := len(data); i > 0 && i > len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i-1]) {
			if utf8.FullRune(data[i-1:]) {
				return len(data)
			}
			return i - 1
		}
	}
	return len(data)
}

// WriteFileInput is write_file's arguments.
type WriteFileInput struct {
	Path     string `json:"path" jsonschema:"File path: relative to the workspace (/workspace) or absolute inside the sandbox. Missing parent directories are created; an existing file is replaced atomically."`
	Content  string `json:"content" jsonschema:"The file's whole content."`
	Encoding string `json:"encoding,omitempty" jsonschema:"'utf-8' (default) or 'base64' for binary content."`
	Session  string `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// WriteFileOutput is write_file's result.
type WriteFileOutput struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"sizeBytes"`
	Mode      string `json:"mode"`
}

func (s *Server) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	var out WriteFileOutput
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8", "utf8", "text":
	case "base64":
		b, err := base64.StdEncoding.DecodeString(in.Content)
		if err != nil {
			return nil, out, fmt.Errorf("content is not valid base64: %w", err)
		}
		data = b
	default:
		return nil, out, fmt.Errorf("encoding %q: use utf-8 or base64", in.Encoding)
	}
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	e, err := s.client.WriteFile(ctx, id, in.Path, data)
	if err != nil {
		return nil, out, err
	}
	return nil, WriteFileOutput{Path: e.Path, SizeBytes: e.SizeBytes, Mode: e.Mode}, nil
}

// ListFilesInput is list_files's arguments.
type ListFilesInput struct {
	Path      string `json:"path,omitempty" jsonschema:"Directory: relative to the workspace or absolute (default '.', the workspace)."`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"Walk subdirectories too (breadth first)."`
	Session   string `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// ListEntry is one listed file.
type ListEntry struct {
	Path      string `json:"path"`
	Type      string `json:"type" jsonschema:"file, dir, symlink or other"`
	SizeBytes int64  `json:"sizeBytes"`
	Mode      string `json:"mode"`
	Mtime     string `json:"mtime"`
}

// ListFilesOutput is list_files's result.
type ListFilesOutput struct {
	Entries   []ListEntry `json:"entries"`
	Truncated bool        `json:"truncated" jsonschema:"More entries exist than were returned."`
}

func (s *Server) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	var out ListFilesOutput
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	path := in.Path
	if path == "" {
		path = "."
	}
	entries, truncated, err := s.client.ListFiles(ctx, id, path, in.Recursive)
	if err != nil {
		return nil, out, err
	}
	if len(entries) > DefaultListEntries {
		entries, truncated = entries[:DefaultListEntries], true
	}
	out = ListFilesOutput{Entries: make([]ListEntry, 0, len(entries)), Truncated: truncated}
	for _, e := range entries {
		out.Entries = append(out.Entries, ListEntry{Path: e.Path, Type: e.Type, SizeBytes: e.SizeBytes, Mode: e.Mode, Mtime: e.Mtime})
	}
	return nil, out, nil
}

// --- start_process / process_output ---

// StartProcessInput is start_process's arguments.
type StartProcessInput struct {
	Command string `json:"command" jsonschema:"Shell command line (sh -c) to run in the background, e.g. a server or a long build."`
	Cwd     string `json:"cwd,omitempty" jsonschema:"Where it starts: relative to the workspace or absolute (default the workspace; NOT run_command's current directory)."`
	Name    string `json:"name,omitempty" jsonschema:"A label for your own use."`
	Session string `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// StartProcessOutput is start_process's result.
type StartProcessOutput struct {
	ProcessID string `json:"processId" jsonschema:"Pass it to process_output."`
	Pid       int    `json:"pid,omitempty" jsonschema:"The pid inside the sandbox (for kill in run_command)."`
	Status    string `json:"status"`
	Session   string `json:"session"`
}

func (s *Server) startProcess(ctx context.Context, _ *mcp.CallToolRequest, in StartProcessInput) (*mcp.CallToolResult, StartProcessOutput, error) {
	var out StartProcessOutput
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	p, err := s.client.StartProcess(ctx, id, StartProcessRequest{Command: in.Command, Cwd: in.Cwd, Name: in.Name})
	if err != nil {
		return nil, out, err
	}
	return nil, StartProcessOutput{ProcessID: p.ProcessID, Pid: p.Pid, Status: p.Status, Session: id}, nil
}

// ProcessOutputInput is process_output's arguments.
type ProcessOutputInput struct {
	ProcessID string  `json:"processId" jsonschema:"The processId start_process returned (p1, p2...)."`
	Offset    int64   `json:"offset,omitempty" jsonschema:"Byte offset to read from (default 0: from the start); pass the previous call's nextOffset to get only new output."`
	Wait      float64 `json:"wait,omitempty" jsonschema:"Seconds to wait for the process to end before reading (default 0: read at once; at most 45, under the 60 s many MCP clients wait for an answer)."`
	Session   string  `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// ProcessOutputOutput is process_output's result.
type ProcessOutputOutput struct {
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	Status       string `json:"status" jsonschema:"running, exited or killed"`
	ExitCode     *int   `json:"exitCode,omitempty"`
	ExitSignal   string `json:"exitSignal,omitempty"`
	NextOffset   int64  `json:"nextOffset" jsonschema:"Where the next call should read from."`
	More         bool   `json:"more" jsonschema:"More output is already available past nextOffset (the read was capped)."`
	DroppedBytes int64  `json:"droppedBytes,omitempty" jsonschema:"Output older than the gateway keeps (16 MiB) that was lost."`
}

// answerWithin bounds how long a tool waits by default (run_command's and
// run_python's timeout when the call gives none) and at most
// (process_output's wait): under the 60 s that many MCP clients (those on
// the TypeScript SDK) wait for a tool's answer, so a command that times
// out answers exit code 124 rather than the client giving up.
const answerWithin = 45 * time.Second

var errCapped = errors.New("output cap reached")

func (s *Server) processOutput(ctx context.Context, _ *mcp.CallToolRequest, in ProcessOutputInput) (*mcp.CallToolResult, ProcessOutputOutput, error) {
	var out ProcessOutputOutput
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	p, err := s.waitProcess(ctx, id, in.ProcessID, time.Duration(min(in.Wait, answerWithin.Seconds())*float64(time.Second)))
	if err != nil {
		return nil, out, err
	}
	var stdout, stderr []byte
	var done bool
	var doneLine OutputLine
	out.NextOffset = in.Offset
	budget := s.outBytes
	err = s.client.ProcessOutput(ctx, id, in.ProcessID, in.Offset, func(l OutputLine) error {
		switch {
		case l.DroppedBytes > 0:
			out.DroppedBytes += l.DroppedBytes
			out.NextOffset = l.Offset
			return nil
		case l.Done != nil:
			out.NextOffset = l.NextOffset
			done = *l.Done
			doneLine = l
			return nil
		}
		var b []byte
		dst := &stdout
		switch {
		case l.Stdout != nil:
			b = []byte(*l.Stdout)
		case l.StdoutBase64 != nil:
			b = l.StdoutBase64
		case l.Stderr != nil:
			b, dst = []byte(*l.Stderr), &stderr
		case l.StderrBase64 != nil:
			b, dst = l.StderrBase64, &stderr
		}
		if len(b) > budget {
			n := budget
			if l.Stdout != nil || l.Stderr != nil {
				// Text: do not cut a character in two.
				if c := validPrefix(b[:budget]); c > 0 {
					n = c
				}
			}
			b = b[:n]
			*dst = append(*dst, b...)
			out.NextOffset = l.Offset + int64(len(b))
			out.More = true
			return errCapped
		}
		budget -= len(b)
		*dst = append(*dst, b...)
		out.NextOffset = l.Offset + int64(len(b))
		return nil
	})
	if err != nil && !errors.Is(err, errCapped) {
		return nil, out, err
	}
	out.Stdout = strings.ToValidUTF8(string(stdout), "\uFFFD")
	out.Stderr = strings.ToValidUTF8(string(stderr), "\uFFFD")
	out.Status, out.ExitCode, out.ExitSignal = p.Status, p.ExitCode, p.ExitSignal
	if done { // it ended while we read: the last line says how
		out.Status, out.ExitCode, out.ExitSignal = "exited", doneLine.ExitCode, doneLine.ExitSignal
		if doneLine.ExitSignal != "" {
			out.Status = "killed"
		}
	}
	return nil, out, nil
}

// waitProcess polls the process until it is no longer running or wait has
// passed, and returns its last state.
func (s *Server) waitProcess(ctx context.Context, id, pid string, wait time.Duration) (*Process, error) {
	deadline := time.Now().Add(wait)
	for {
		p, err := s.client.GetProcess(ctx, id, pid)
		if err != nil {
			return nil, err
		}
		if p.Status != "running" || !time.Now().Before(deadline) {
			return p, nil
		}
		t := time.NewTimer(min(250*time.Millisecond, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
