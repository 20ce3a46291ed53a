//go:build unix

package main

import (
	"log/slog"
	"syscall"
)

// raiseNofile lifts the soft RLIMIT_NOFILE to the hard one and logs the
// bound: every tunnel, SSH channel and sandbox process holds descriptors.
// (Go's runtime does the same for its own process; this makes it explicit
// and visible. Processes the gateway starts get the limit back.)
func raiseNofile(log *slog.Logger) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		log.Warn("rlimit_nofile", "err", err)
		return
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			log.Warn("rlimit_nofile", "err", err)
		}
	}
	log.Info("rlimit_nofile", "soft", rl.Cur, "hard", rl.Max)
}
