//go:build linux

package dataplane

import (
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// buffered reports whether stream (a pipe or socket: FIONREAD, TIOCINQ on linux) has bytes written
// to it that nobody has read yet.
func buffered(stream io.Closer) bool {
	sc, ok := stream.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) != nil {
		return false
	}
	return n > 0
}
