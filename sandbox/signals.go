package sandbox

import "syscall"

// signalNames maps SSH signal names (RFC 4254 §6.10, without "SIG") to signals.
var signalNames = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT,
	"ALRM": syscall.SIGALRM,
	"FPE":  syscall.SIGFPE,
	"HUP":  syscall.SIGHUP,
	"ILL":  syscall.SIGILL,
	"INT":  syscall.SIGINT,
	"KILL": syscall.SIGKILL,
	"PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV,
	"TERM": syscall.SIGTERM,
	"USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

// ParseSignal returns the signal for an SSH signal name such as "TERM".
func ParseSignal(name string) (syscall.Signal, bool) {
	s, ok := signalNames[name]
	return s, ok
}

// SignalName returns the SSH name of sig ("KILL"), or "" for signals SSH
// has no name for, which are reported as their number by callers.
func SignalName(sig syscall.Signal) string {
	for name, s := range signalNames {
		if s == sig {
			return name
		}
	}
	return ""
}
