package sandbox

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

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
