//go:build unix

package egress

import "syscall"

// nofileLimit is the process's soft RLIMIT_NOFILE; 0 when unknown.
func nofileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return uint64(rl.Cur)
}
