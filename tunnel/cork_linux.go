package tunnel

import "golang.org/x/sys/unix"

// setCork sets or clears TCP_CORK on the socket fd (see wsClientConn.Write).
func setCork(fd uintptr, on bool) error {
	v := 0
	if on {
		v = 1
	}
	return unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, v)
}
