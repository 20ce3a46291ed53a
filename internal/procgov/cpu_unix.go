//go:build unix

package procgov

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time the process has used, user and system,
// over all its threads (getrusage(2), RUSAGE_SELF).
func ProcessCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
