//go:build linux || darwin || openbsd

package rawio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// HaveWritev: Writev works here.
const HaveWritev = true

// writev is an ordinary writev(2), for a blocking descriptor (or where
// raw calls are not supported).
func writev(fd uintptr, bufs [][]byte) (int, syscall.Errno) {
	n, err := unix.Writev(int(fd), bufs)
	if err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return n, e
		}
		return n, syscall.EIO
	}
	return n, 0
}
