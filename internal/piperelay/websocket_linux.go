package piperelay

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// RelayWebSocket is Relay for a WebSocket client (sandgate proxy
// --transport websocket over plain http): take hands over the TCP socket
// under the WebSocket, at the start of the gateway's first frame, and up
// sends one binary message (the WebSocket library's writer, which masks).
// One loop on one thread, as Relay's, moves the payload of the gateway's
// data frames to ssh with splice(2), reading only their headers, instead
// of copying every byte through the library and a buffer of ours; it
// answers a ping, and ends at the gateway's close frame (answered) or its
// end of the connection. EOF on stdin sends a close frame (a WebSocket
// has no half close); what the gateway sends until its own close still
// reaches ssh. ssh's bytes go up through up, a message per read.
//
// It reports false, having taken nothing, when stdin or stdout is not a
// pipe or take hands over no socket; the caller copies then.
func RelayWebSocket(take func() (net.Conn, bool), up io.Writer, stdin io.Reader, stdout io.Writer) (handled bool, err error) {
	in, ok := stdin.(*os.File)
	if !ok || !isPipe(in) {
		return false, nil
	}
	out, ok := stdout.(*os.File)
	if !ok || !isPipe(out) {
		return false, nil
	}
	conn, ok := take()
	if !ok {
		return false, nil
	}
	sock := -1
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) { sock = int(fd) })
		}
	}
	if sock < 0 {
		return true, errors.New("websocket relay: the connection is no socket")
	}
	setPipeMax(in)
	setPipeMax(out)
	err = wsRelayLoop(int(in.Fd()), int(out.Fd()), sock, up)
	runtime.KeepAlive(conn)
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	return true, err
}

// WebSocket opcodes (RFC 6455 §5.2).
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

// wsDown follows the gateway's frames as the relay reads them.
type wsDown struct {
	hdr  [14]byte
	hn   int   // header bytes read
	left int64 // payload bytes of the current frame still to come
	op   byte  // the current frame's opcode
	ctl  [125]byte
	cn   int // a control frame's payload bytes read
}

// wsEvent is what a step of the downstream reached.
type wsEvent int

const (
	wsAgain   wsEvent = iota // the socket is empty: wait for it
	wsOutFull                // ssh's pipe has no room: wait for it
	wsEnd                    // the gateway ended (close frame or EOF), or ssh went
)

// wsRelayLoop is RelayWebSocket's loop over the raw descriptors: in and
// out are pipes, sock a non-blocking TCP socket at a frame's start.
func wsRelayLoop(in, out, sock int, up io.Writer) error {
	upOpen := true     // stdin has not reached EOF, nor did either side close
	closeSent := false // our close frame went to the gateway
	upBuf := make([]byte, upBufSize)
	var d wsDown
	downWaitsOut := false
	pfdBuf := make([]unix.PollFd, 0, 3)
	for {
		pfds := pfdBuf[:0]
		iIn, iSock, iOut := -1, -1, -1
		if upOpen {
			iIn = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(in), Events: unix.POLLIN})
		}
		if downWaitsOut {
			iOut = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(out), Events: unix.POLLOUT})
		} else {
			iSock = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(sock), Events: unix.POLLIN})
		}
		if err := wait(pfds); err != nil {
			if err == unix.EINTR {
				continue
			}
			return err
		}
		ready := func(i int, ev int16) bool {
			return i >= 0 && pfds[i].Revents&(ev|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
		// Upstream: ssh → gateway, one binary message per read, through
		// the library (it masks; its write waits for room).
		if ready(iIn, unix.POLLIN) {
			n, err := readFD(in, upBuf)
			switch {
			case err == unix.EAGAIN:
			case err != nil:
				return err
			case n == 0: // EOF on stdin: close, keep reading to the gateway's close
				upOpen, closeSent = false, true
				if err := writeControl(sock, opClose, []byte{0x03, 0xe8}); err != nil && err != unix.EPIPE {
					return err
				}
			default:
				if _, err := up.Write(upBuf[:n]); err != nil {
					// The gateway closed: what it sent before is still
					// read below, to its close frame or end.
					upOpen = false
				}
			}
		}
		// Downstream: gateway → ssh.
		if ready(iSock, unix.POLLIN) || ready(iOut, unix.POLLOUT) {
			downWaitsOut = false
			ev, err := d.step(sock, out, closeSent)
			if err != nil {
				return err
			}
			switch ev {
			case wsOutFull:
				downWaitsOut = true
			case wsEnd:
				return nil
			}
		}
	}
}

// step moves what the socket holds: headers and control frames read,
// data frames' payload spliced to out, until the socket is empty, out is
// full, or the gateway ended.
func (d *wsDown) step(sock, out int, closeSent bool) (wsEvent, error) {
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	for {
		if d.left > 0 && d.op == opBinary {
			n, err := spliceN(sock, out, min(d.left, pipeMax), flags)
			switch {
			case err == unix.EAGAIN:
				// The socket empty, or ssh's pipe full: tell which.
				if socketReadable(sock) {
					return wsOutFull, nil
				}
				return wsAgain, nil
			case err == unix.EPIPE:
				return wsEnd, nil // ssh has gone
			case err != nil:
				return 0, err
			case n == 0:
				return wsEnd, nil // the gateway closed the connection
			}
			d.left -= n
			continue
		}
		if d.left > 0 { // a control frame's payload
			n, err := readFD(sock, d.ctl[d.cn:d.cn+int(d.left)])
			if ev, done := endOf(n, err); done {
				return ev, errOf(err)
			}
			d.cn += n
			d.left -= int64(n)
			if d.left > 0 {
				continue
			}
			if ev, err := d.control(sock, closeSent); ev != wsAgain || err != nil {
				return ev, err
			}
			continue
		}
		// A header: its first two bytes, then the rest they ask for.
		need := 2
		if d.hn >= 2 {
			need = wsHeaderLen(d.hdr[:2])
		}
		n, err := readFD(sock, d.hdr[d.hn:need])
		if ev, done := endOf(n, err); done {
			return ev, errOf(err)
		}
		d.hn += n
		if d.hn < 2 || d.hn < wsHeaderLen(d.hdr[:2]) {
			continue
		}
		if err := d.begin(); err != nil {
			return 0, err
		}
		if d.left == 0 && d.op != opBinary {
			if ev, err := d.control(sock, closeSent); ev != wsAgain || err != nil {
				return ev, err
			}
		}
	}
}

// begin starts the frame whose header d.hdr holds.
func (d *wsDown) begin() error {
	h := d.hdr[:d.hn]
	d.hn, d.cn = 0, 0
	if h[0]&0x70 != 0 {
		return errors.New("websocket relay: a frame with reserved bits set (no extension was agreed)")
	}
	if h[1]&0x80 != 0 {
		return errors.New("websocket relay: a masked frame from the gateway")
	}
	var n uint64
	switch l := h[1] & 0x7f; l {
	case 126:
		n = uint64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		n = binary.BigEndian.Uint64(h[2:10])
	default:
		n = uint64(l)
	}
	if n > 1<<62 {
		return errors.New("websocket relay: a frame length out of range")
	}
	op := h[0] & 0x0f
	switch op {
	case opBinary, opContinuation:
		op = opBinary // a message's later frames carry its bytes as well
	case opClose, opPing, opPong:
		if n > 125 || h[0]&0x80 == 0 {
			return fmt.Errorf("websocket relay: a control frame (opcode %d) of %d bytes or fragmented", op, n)
		}
	default:
		return fmt.Errorf("websocket relay: unexpected frame (opcode %d): want binary messages", op)
	}
	d.op, d.left = op, int64(n)
	return nil
}

// control acts on the control frame just read in full: a ping is
// answered, a close ends the relay (answered unless ours went first).
func (d *wsDown) control(sock int, closeSent bool) (wsEvent, error) {
	payload := d.ctl[:d.cn]
	d.cn = 0
	switch d.op {
	case opPing:
		if err := writeControl(sock, opPong, payload); err != nil && err != unix.EPIPE {
			return 0, err
		}
	case opClose:
		if !closeSent {
			code := payload[:min(len(payload), 2)] // echo the status, as RFC 6455 §5.5.1 suggests
			_ = writeControl(sock, opClose, code)
		}
		return wsEnd, nil
	}
	return wsAgain, nil
}

// wsHeaderLen is the length of the header whose first two bytes are h.
func wsHeaderLen(h []byte) int {
	n := 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4
	}
	return n
}

// endOf tells whether a read of the socket ended the step: nothing in
// (wsAgain), the gateway's end (wsEnd), or an error.
func endOf(n int, err error) (wsEvent, bool) {
	switch {
	case err == unix.EAGAIN:
		return wsAgain, true
	case err != nil:
		return wsEnd, true
	case n == 0:
		return wsEnd, true
	}
	return 0, false
}

// errOf is a read's error that the relay reports (not EAGAIN).
func errOf(err error) error {
	if err == nil || err == unix.EAGAIN {
		return nil
	}
	return err
}

// writeControl sends a control frame (masked, as a client's must be),
// waiting for room in the socket if it has none.
func writeControl(sock int, op byte, payload []byte) error {
	var f [2 + 4 + 125]byte
	f[0] = 0x80 | op
	f[1] = 0x80 | byte(len(payload))
	if _, err := rand.Read(f[2:6]); err != nil {
		return err
	}
	for i, b := range payload {
		f[6+i] = b ^ f[2+i%4]
	}
	p := f[:6+len(payload)]
	for len(p) > 0 {
		n, err := writeFD(sock, p)
		if err == unix.EAGAIN {
			pfd := []unix.PollFd{{Fd: int32(sock), Events: unix.POLLOUT}}
			if _, err := unix.Poll(pfd, -1); err != nil && err != unix.EINTR {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// socketReadable reports whether sock has bytes to read now.
func socketReadable(sock int) bool {
	pfd := []unix.PollFd{{Fd: int32(sock), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0 && pfd[0].Revents&unix.POLLIN != 0
}

// spliceN is one splice(2) of up to n bytes, retried on EINTR.
func spliceN(from, to int, n int64, flags int) (int64, error) {
	for {
		m, err := unix.Splice(from, nil, to, nil, int(n), flags)
		if err != unix.EINTR {
			return m, err
		}
	}
}
