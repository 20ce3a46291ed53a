package tunnel

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peekWait copies the bytes at the head of the socket under rc into p
// without taking them (recv(2) with MSG_PEEK), waiting until there is at
// least one, or the peer's end (0).
func peekWait(rc syscall.RawConn, p []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
				unix.MSG_PEEK, 0, 0)
			switch e {
			case unix.EINTR:
				continue // again now: waiting for readability could miss bytes already in
			case unix.EAGAIN:
				return false // wait for the socket to be readable
			}
			n, errno = int(r), e
			return true
		}
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return n, nil
}

// canPeek: recv(2) with MSG_PEEK is here.
const canPeek = true
