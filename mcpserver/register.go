package mcpserver

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// lifecycle is said in every tool that takes a session argument.
const lifecycle = `Without a "session" argument the tool uses this MCP connection's default session, created on first use and deleted, with its files and processes, when the MCP client disconnects.`

func ptr[T any](v T) *T { return &v }

// bind runs a tool's handler in a context that also ends when the server
// is asked to stop (Run's context), so a signal ends a call in progress
// (its command is killed by the gateway as the request goes) instead of
// waiting for it: the SDK's shutdown waits for its handlers, whose
// contexts it does not cancel.
func bind[In, Out any](s *Server, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(s.halt, cancel)()
		return h(ctx, req, in)
	}
}

// addTools registers the tools with their descriptions, written for a
// model: what persists, the limits, and what the answers mean.
func (s *Server) addTools() {
	kib := s.outBytes >> 10
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  "create_session",
		Title: "Create a sandbox session",
		Description: `Creates an isolated Linux sandbox session and returns its sessionId. Usually unnecessary: every other tool creates a default session on first use.
Use it for a specific image (e.g. python:3.12-slim), network access (egress: the sandbox has NO network unless you list destinations), a longer ttl, or a session that outlives this connection.
With a "name", the session is kept when the MCP client disconnects (it lives until its ttl, default 3600 s, ends, it is idle for the gateway's idle timeout, 30 min by default, or delete_session) and other tools accept the name as their "session" argument, in later connections too. Without a name, it is deleted when the client disconnects, like the default session.
Files, the shell's working directory and environment, and Python variables persist within a session until it ends.`,
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, bind(s, s.createSession))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  "run_command",
		Title: "Run a shell command",
		Description: fmt.Sprintf(`Runs a shell command line in the sandbox and returns exitCode, stdout, stderr and cwd.
Commands run one at a time in ONE persistent shell per session (bash if present, else sh): "cd", exported variables, functions and aliases carry over to the next run_command call, and cwd in the answer is the shell's directory afterwards. The shell starts in the workspace (/workspace); files persist for the session's lifetime.
Limits: timeout defaults to 45 s, under the 60 s many MCP clients wait for a tool's answer (ask for more only if yours waits longer; for long work use start_process); a command that runs longer is killed with its child processes and answers exitCode 124 with timedOut true (the shell is then restarted, keeping its directory and exported variables but not unexported ones). Standard input is empty: do not run interactive programs. Each of stdout and stderr is capped at %d KiB: beyond that truncated is true and the stream holds its head and its tail.
For long-running programs (servers, watchers), use start_process instead. %s`, kib, lifecycle),
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, bind(s, s.runCommand))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  "run_python",
		Title: "Run Python in a persistent kernel",
		Description: fmt.Sprintf(`Runs Python code in a persistent interpreter in the sandbox, like a notebook cell: variables, imports and definitions persist between calls to the same kernel. If the code ends with an expression, result is its repr; an uncaught exception is in error (name, value, traceback) and the kernel keeps its state.
Limits: timeout defaults to 45 s (under the 60 s many MCP clients wait for an answer); then the code gets KeyboardInterrupt (timedOut and interrupted true, state kept); code that does not stop within 2 s more is killed and the kernel restarts (stateLost true: redefine what you need). stdout and stderr are capped at %d KiB each. input() raises EOFError.
Needs python3 in the session's image and a gateway with the kernel; otherwise the tool answers an error saying so (use run_command with python3 then). %s`, kib, lifecycle),
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, bind(s, s.runPython))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  "read_file",
		Title: "Read a file",
		Description: fmt.Sprintf(`Reads a file of the sandbox. Relative paths start at the workspace (/workspace, where run_command's shell starts), NOT at the shell's current directory; absolute paths are inside the sandbox.
Returns at most %d KiB per call: when truncated is true, call again with offset=nextOffset. Text comes back as it is (encoding "utf-8"); other bytes as base64 (encoding "base64"). %s`, s.readMax>>10, lifecycle),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, bind(s, s.readFile))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "write_file",
		Title:       "Write a file",
		Description: `Writes a whole file in the sandbox, atomically, creating missing parent directories and replacing an existing file. Relative paths start at the workspace (/workspace), NOT at the shell's current directory. Content is text, or base64 with encoding "base64" for binary files. The gateway caps file sizes (its --max-file-bytes; the error says file_too_large), and one MCP message is at most 64 MiB: write a larger file in parts with run_command, or through the gateway's REST API. Files persist for the session's lifetime. ` + lifecycle,
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, bind(s, s.writeFile))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "list_files",
		Title:       "List a directory",
		Description: fmt.Sprintf(`Lists a directory of the sandbox (default: the workspace, /workspace): each entry's path, type (file, dir, symlink, other), size, mode and modification time. With recursive true it walks subdirectories (never through symlinks). At most %d entries are returned (truncated then says there were more). %s`, DefaultListEntries, lifecycle),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, bind(s, s.listFiles))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "start_process",
		Title:       "Start a background process",
		Description: `Starts a command in the background (sh -c) and returns at once with its processId; it runs until it exits, you kill it (run_command "kill <pid>"), or the session ends. Use it for servers, watchers and long builds; read what it printed with process_output. It does NOT run in run_command's shell: it starts in the workspace (or cwd) with the session's base environment, not the shell's exported variables. The gateway keeps the last 16 MiB of its output. ` + lifecycle,
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, bind(s, s.startProcess))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "process_output",
		Title:       "Read a background process's output",
		Description: fmt.Sprintf(`Returns a background process's stdout and stderr from offset on, its status (running, exited, killed) and exitCode once it ended. Pass the previous answer's nextOffset as offset to read only what is new. With wait (seconds, at most %d) it first waits for the process to end. At most %d KiB per call: when more is true, call again at once with offset=nextOffset. %s`, int(answerWithin.Seconds()), kib, lifecycle),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, bind(s, s.processOutput))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "list_egress_pending",
		Title:       "List connections waiting for approval",
		Description: `Lists the sandbox's network connections waiting for approval: a session created with egressMode "ask" parks a connection to a destination outside its egress list until it is allowed or denied (through the gateway's API or console, or decide_egress when this MCP server offers it), or until the gateway's ask timeout (60 s by default), which denies it. Each has an id, host, port, since, via (proxy or transparent) and, for proxy requests, the userAgent. With wait (seconds, at most 45) it waits until at least one is waiting. ` + lifecycle,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, bind(s, s.listEgressPending))
	if s.decide { // sandgate mcp --egress-decisions (Options.EgressDecisions)
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name:        "decide_egress",
			Title:       "Allow or deny a waiting connection",
			Description: `Allows or denies a connection list_egress_pending returned. Opening the network is the user's decision: ask the user before allowing a destination. With remember, the session keeps the decision for that host:port (allow adds it to the egress list, deny to a deny list), and other connections waiting for it get the same answer. A connection that no longer waits (decided, timed out) answers pending_not_found. Without a "session" argument it uses this connection's default session, if any.`,
			Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
		}, bind(s, s.decideEgress))
	}
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "delete_session",
		Title:       "Delete a sandbox session",
		Description: `Deletes a session now: kills all its processes and removes its files; it cannot be undone. Without a "session" argument it deletes this connection's default session (the next tool call without one creates a fresh default session). Sessions are also deleted when the MCP client disconnects, except named ones and one attached with sandgate mcp --session.`,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, bind(s, s.deleteSession))
}
