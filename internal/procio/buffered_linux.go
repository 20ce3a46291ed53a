//go:build linux

package procio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Buffered is how many bytes were written to stream (a pipe, a socket or
// a terminal's master: FIONREAD, TIOCINQ on linux) that nobody has read
// yet; 0 when that cannot be known (stream is no syscall.Conn).
func Buffered(stream any) int {
	sc, ok := stream.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	if rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) != nil {
		return 0
	}
	return max(n, 0)
}
