package egress

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// The TCP states (include/net/tcp_states.h) in which the peer has sent
// its FIN or reset the connection.
const (
	tcpClose     = 7
	tcpCloseWait = 8
	tcpLastAck   = 9
)

// peerClosed reports whether c's peer has closed (FIN) or reset the
// connection, read from the socket's TCP_INFO without consuming a byte
// (bytes the client sent meanwhile stay queued for whoever reads them).
// False when c is not a TCP socket or its state cannot be read.
func peerClosed(c net.Conn) bool {
	sc, ok := rawConn(c).(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var state uint8
	var serr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if serr == nil {
			state = info.State
		}
	}); err != nil || serr != nil {
		return false
	}
	switch state {
	case tcpClose, tcpCloseWait, tcpLastAck:
		return true
	}
	return false
}
