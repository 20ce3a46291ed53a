package sandbox

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// CommandTagEnv is the variable a driver may set in each command's
// environment to find the command's whole tree when it kills it (the
// workdir driver, whose commands share the host's process table). It is
// the command's own: a persistent shell that restores the variables its
// predecessor exported keeps its own value, or the next command would
// carry the old tree's tag and end with it.
const CommandTagEnv = "SANDGATE_COMMAND"

// KillGrace is how long Process.Kill waits after SIGHUP before SIGKILL, in
// every driver.
const KillGrace = 2 * time.Second

// BaseEnv is the clean environment every sandbox process starts from.
func BaseEnv(home, shell string) []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + home,
		"USER=sandbox",
		"LOGNAME=sandbox",
		"SHELL=" + shell,
		"LANG=C.UTF-8",
	}
}

// CommandEnv is the environment of a sandbox command: BaseEnv, then the
// image's (nil for none), then the client's (already filtered), then TERM
// for a terminal; a later KEY=VALUE overrides an earlier one of the same
// key, and each key appears once.
func CommandEnv(home, shell string, image, client []string, pty *PTY) []string {
	var term []string
	if pty != nil && pty.Term != "" {
		term = []string{"TERM=" + pty.Term}
	}
	return mergeEnv(BaseEnv(home, shell), image, client, term)
}

// WithTTY is env with SSH_TTY set to tty, the command's terminal, as
// OpenSSH sets it for a session with a PTY (after the client's variables:
// the client cannot set it).
func WithTTY(env []string, tty string) []string {
	return mergeEnv(env, []string{"SSH_TTY=" + tty})
}

// mergeEnv joins environment lists: each list's KEY=VALUE entries
// override the earlier lists' of the same key, each key once.
func mergeEnv(lists ...[]string) []string {
	var out []string
	at := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := at[k]; ok {
				out[i] = kv
				continue
			}
			at[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// FindShell returns the shell of sandbox processes in the current root:
// bash where there is one, else /bin/sh.
func FindShell() string {
	for _, s := range []string{"/bin/bash", "/usr/bin/bash", "/bin/sh"} {
		if _, err := os.Stat(s); err == nil {
			return s
		}
	}
	return "/bin/sh"
}

// ValidID accepts the ids the gateway generates: lowercase letters, digits, '-'.
func ValidID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ListIDs returns the names of the directories in dir that are valid
// sandbox ids: where a driver keeps one directory per sandbox.
func ListIDs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// ShortID is the short form of a session id: its hostname in a sandbox.
func ShortID(id string) string {
	s := strings.TrimPrefix(id, "sbx-")
	if len(s) > 12 {
		s = s[:12]
	}
	if s == "" {
		return "sandbox"
	}
	return s
}

// ExitFromState converts an os.ProcessState into an Exit.
func ExitFromState(st *os.ProcessState) Exit {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok {
		return Exit{Code: st.ExitCode()}
	}
	return ExitFromWaitStatus(ws)
}

// ExitFromWaitStatus converts a wait status into an Exit.
func ExitFromWaitStatus(ws syscall.WaitStatus) Exit {
	if ws.Signaled() {
		if name := SignalName(ws.Signal()); name != "" {
			return Exit{Signal: name, CoreDumped: ws.CoreDump()}
		}
		return Exit{Code: 128 + int(ws.Signal())}
	}
	return Exit{Code: ws.ExitStatus()}
}
