//go:build linux || darwin || openbsd

package sshd

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// iovMax is the most slices one writev(2) takes (IOV_MAX on Linux and
// macOS; more is EINVAL).
const iovMax = 1024

// haveWritev: copyIn can hand a channel's packets to a descriptor.
const haveWritev = true

// writeBuffers writes every byte of bufs to rc's descriptor with as few
// writev(2) calls as it takes, waiting (in the runtime's poller) while a
// non-blocking descriptor is full. It returns the bytes written, all of
// them unless there is an error.
func writeBuffers(rc syscall.RawConn, bufs [][]byte) (int, error) {
	total := 0
	var werr error
	err := rc.Write(func(fd uintptr) bool {
		for len(bufs) > 0 {
			n, err := unix.Writev(int(fd), bufs[:min(len(bufs), iovMax)])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // full: wait until it is writable
			case err != nil:
				werr = err
				return true
			}
			total += n
			bufs = advanceBuffers(bufs, n)
		}
		return true
	})
	if werr != nil {
		return total, werr
	}
	return total, err
}
