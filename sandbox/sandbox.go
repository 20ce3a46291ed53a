// Package sandbox isolates a session's processes and files.
//
// A Driver creates one Sandbox per session. Every process of the session
// (exec, shell, sftp-server) is started through Sandbox.Start, so callers never
// learn which driver they run on: adding a driver changes no caller.
package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"syscall"
)

// ErrClosed is returned by Start once the sandbox has been destroyed.
var ErrClosed = errors.New("sandbox is closed")

// Spec describes the sandbox to create for one session.
type Spec struct {
	// ID is the session id; it names the workdir and, where supported, the
	// hostname (its short form) and the cgroup.
	ID string
}

// Driver creates sandboxes. Implementations must be safe for concurrent use.
type Driver interface {
	// Name is the driver's name as given to `serve --sandbox`.
	Name() string
	// Create makes a new sandbox. On error nothing of it is left behind.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// Sandbox is one session's isolated environment.
type Sandbox interface {
	// Workdir is the host path of the session's workspace directory.
	Workdir() string
	// Start runs a process inside the sandbox.
	Start(ctx context.Context, cmd Cmd) (Process, error)
	// Destroy kills every process of the sandbox and removes everything it
	// owns on the host (workdir, cgroup, mounts). It is idempotent.
	Destroy(ctx context.Context) error
}

// Window is a terminal size in character cells.
type Window struct {
	Cols, Rows uint16
}

// PTY asks for a pseudo-terminal.
type PTY struct {
	Term   string
	Window Window
}

// Cmd describes a process to start in a sandbox.
type Cmd struct {
	// Command is run by the sandbox's shell with -c. Empty means an
	// interactive login shell.
	Command string
	// Subsystem, when set, names a built-in subsystem to run instead of
	// Command. Only "sftp" exists.
	Subsystem string
	// Env holds extra KEY=VALUE pairs on top of the sandbox's clean
	// environment (already filtered by the caller).
	Env []string
	// PTY, when non-nil, runs the process on a new pseudo-terminal as its
	// controlling terminal. Stdout then carries the terminal output and Stderr is nil.
	PTY *PTY
}

// Exit is how a process ended.
type Exit struct {
	// Code is the exit status, valid when Signal is empty.
	Code int
	// Signal is the signal name without "SIG" ("KILL", "TERM") when the
	// process was killed by a signal.
	Signal     string
	CoreDumped bool
}

// Process is a running process inside a sandbox.
type Process interface {
	// Stdin is the process's standard input. Closing it sends EOF
	// (no-op with a PTY).
	Stdin() io.WriteCloser
	// Stdout is the process's standard output (the terminal with a PTY).
	Stdout() io.ReadCloser
	// Stderr is the process's standard error, nil with a PTY.
	Stderr() io.ReadCloser
	// Resize changes the terminal size; an error without a PTY.
	Resize(w Window) error
	// Signal sends sig to the process's group.
	Signal(sig syscall.Signal) error
	// Wait waits for the process to exit. It may be called once.
	Wait() (Exit, error)
	// Kill ends the process's group: SIGHUP, then SIGKILL shortly after.
	Kill()
}

// exitFromState converts an os.ProcessState into an Exit.
func exitFromState(st *os.ProcessState) Exit {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok {
		return Exit{Code: st.ExitCode()}
	}
	return exitFromWaitStatus(ws)
}

// exitFromWaitStatus converts a wait status into an Exit.
func exitFromWaitStatus(ws syscall.WaitStatus) Exit {
	if ws.Signaled() {
		if name := SignalName(ws.Signal()); name != "" {
			return Exit{Signal: name, CoreDumped: ws.CoreDump()}
		}
		return Exit{Code: 128 + int(ws.Signal())}
	}
	return Exit{Code: ws.ExitStatus()}
}
