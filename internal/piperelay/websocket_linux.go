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
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// RelayWebSocket is Relay for a WebSocket client (sandgate proxy
// --transport websocket over plain http): take hands over the TCP socket
// under the WebSocket, at the start of the gateway's first frame, and
// from then on the relay alone reads and writes it (the library no
// longer does either). One loop on one thread, as Relay's, moves the
// payload of the gateway's data frames to ssh with splice(2), reading
// only their headers, instead of copying every byte through the library
// and a buffer of ours; each read of ssh's pipe goes up as one masked
// binary message, written without blocking, so that the gateway's frames
// still reach ssh while the gateway reads nothing (a single writer to
// the socket: a pong or close frame never lands inside a data frame). It
// answers a ping, and ends at the gateway's close frame (answered) or its
// end of the connection. EOF on stdin sends a close frame (a WebSocket
// has no half close); what the gateway sends until its own close still
// reaches ssh. A frame RFC 6455 forbids ends the relay with an error,
// after a close frame naming the reason (1002, or 1007 for a close
// reason that is not UTF-8).
//
// It reports false, having taken nothing, when stdin or stdout is not a
// pipe or take hands over no socket; the caller copies then.
func RelayWebSocket(take func() (net.Conn, bool), stdin io.Reader, stdout io.Writer) (handled bool, err error) {
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
	err = wsRelayLoop(int(in.Fd()), int(out.Fd()), sock)
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

// Close status codes the relay sends (RFC 6455 §7.4.1).
const (
	closeNormal   = 1000
	closeProtocol = 1002
	closeBadData  = 1007
)

// wsProtoError is a frame RFC 6455 forbids: the relay fails the
// connection with code in its close frame.
type wsProtoError struct {
	code uint16
	msg  string
}

func (e *wsProtoError) Error() string { return "websocket relay: " + e.msg }

func protoErr(format string, a ...any) error {
	return &wsProtoError{code: closeProtocol, msg: fmt.Sprintf(format, a...)}
}

// wsDown follows the gateway's frames as the relay reads them.
type wsDown struct {
	hdr   [14]byte
	hn    int   // header bytes read
	left  int64 // payload bytes of the current frame still to come
	op    byte  // the current frame's opcode
	inMsg bool  // a fragmented data message is under way (its last frame not yet begun)
	ctl   [125]byte
	cn    int // a control frame's payload bytes read
}

// wsEvent is what a step of the downstream reached.
type wsEvent int

const (
	wsAgain   wsEvent = iota // the socket is empty: wait for it
	wsOutFull                // ssh's pipe has no room: wait for it
	wsEnd                    // the gateway ended (close frame or EOF), or ssh went
)

// wsMaxHeader is the longest header of a client's frame: 2 bytes, a
// 64-bit length, the masking key.
const wsMaxHeader = 2 + 8 + 4

// wsUp is what the relay writes to the socket, all of it, in order: a
// data frame (ssh's read, masked in place behind its header) and the
// control frames queued behind it.
type wsUp struct {
	buf    []byte // wsMaxHeader bytes of room, then ssh's read
	pend   []byte // the data frame's bytes not yet written
	ctl    []byte // control frames not yet written, behind pend
	ctlBuf []byte
	fresh  bool // a frame was queued since the last flush
	broken bool // a write failed: the gateway reads no more
}

// wsCtlMax bounds the control frames queued while the gateway does not
// read: past it, a ping's answer is dropped (the peer waits for the
// latest anyway, RFC 6455 §5.5.3).
const wsCtlMax = 4 << 10

func (u *wsUp) pending() bool { return len(u.pend) > 0 || len(u.ctl) > 0 }

// data makes buf's n bytes after the header room one binary message.
func (u *wsUp) data(n int) error {
	p := u.buf[wsMaxHeader : wsMaxHeader+n]
	var h [wsMaxHeader]byte
	hl := 2
	h[0] = 0x80 | opBinary
	switch {
	case n < 126:
		h[1] = 0x80 | byte(n)
	case n < 1<<16:
		h[1] = 0x80 | 126
		binary.BigEndian.PutUint16(h[2:], uint16(n))
		hl += 2
	default:
		h[1] = 0x80 | 127
		binary.BigEndian.PutUint64(h[2:], uint64(n))
		hl += 8
	}
	if _, err := rand.Read(h[hl : hl+4]); err != nil {
		return err
	}
	maskBytes(h[hl:hl+4], p)
	hl += 4
	start := wsMaxHeader - hl
	copy(u.buf[start:], h[:hl])
	u.pend = u.buf[start : wsMaxHeader+n]
	u.fresh = true
	return nil
}

// control queues a control frame (masked, as a client's must be).
func (u *wsUp) control(op byte, payload []byte) error {
	if op == opPong && len(u.ctl) > wsCtlMax {
		return nil
	}
	var f [2 + 4 + 125]byte
	f[0] = 0x80 | op
	f[1] = 0x80 | byte(len(payload))
	if _, err := rand.Read(f[2:6]); err != nil {
		return err
	}
	n := copy(f[6:], payload)
	maskBytes(f[2:6], f[6:6+n])
	if len(u.ctl) == 0 {
		u.ctl = u.ctlBuf[:0]
	}
	u.ctl = append(u.ctl, f[:6+n]...)
	u.fresh = true
	return nil
}

// flush writes what it can without waiting: the data frame's rest, then
// the control frames. A peer that reset or closed the connection makes
// the writer broken (what it sent before is still read).
func (u *wsUp) flush(sock int) error {
	u.fresh = false
	for u.pending() && !u.broken {
		p := &u.pend
		if len(u.pend) == 0 {
			p = &u.ctl
		}
		n, err := writeFD(sock, *p)
		switch {
		case err == unix.EAGAIN:
			return nil
		case err == unix.EPIPE || err == unix.ECONNRESET:
			u.broken, u.pend, u.ctl = true, nil, nil
			return nil
		case err != nil:
			return err
		}
		*p = (*p)[n:]
	}
	return nil
}

// drain writes what is pending, waiting for room up to wsDrainWait: the
// relay's last frames (a close frame, behind a data frame's rest).
func (u *wsUp) drain(sock int) {
	deadline := time.Now().Add(wsDrainWait)
	for u.pending() && !u.broken {
		if err := u.flush(sock); err != nil || !u.pending() {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		pfd := []unix.PollFd{{Fd: int32(sock), Events: unix.POLLOUT}}
		if _, err := unix.Poll(pfd, int(left/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return
		}
	}
}

// wsDrainWait bounds how long the relay, at its end, waits for the
// socket to take its last frames.
const wsDrainWait = 5 * time.Second

// maskBytes masks (or unmasks) p with the 4-byte key, 8 bytes at a time.
func maskBytes(key []byte, p []byte) {
	k4 := binary.LittleEndian.Uint32(key)
	k8 := uint64(k4) | uint64(k4)<<32
	i := 0
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], binary.LittleEndian.Uint64(p[i:])^k8)
	}
	for ; i < len(p); i++ {
		p[i] ^= key[i%4]
	}
}

// wsRelayLoop is RelayWebSocket's loop over the raw descriptors: in and
// out are pipes, sock a non-blocking TCP socket at a frame's start.
func wsRelayLoop(in, out, sock int) error {
	upOpen := true     // stdin has not reached EOF
	closeSent := false // our close frame is queued (or went) to the gateway
	u := wsUp{buf: make([]byte, wsMaxHeader+upBufSize), ctlBuf: make([]byte, 0, 256)}
	var d wsDown
	downWaitsOut := false // the socket has data, ssh's pipe had no room
	pfdBuf := make([]unix.PollFd, 0, 3)
	// fail sends a close frame naming a protocol error, best effort.
	fail := func(err error) error {
		var pe *wsProtoError
		if errors.As(err, &pe) && !closeSent {
			if u.control(opClose, binary.BigEndian.AppendUint16(nil, pe.code)) == nil {
				u.drain(sock)
			}
		}
		return err
	}
	for {
		pfds := pfdBuf[:0]
		iIn, iSock, iOut := -1, -1, -1
		if upOpen && !u.pending() {
			iIn = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(in), Events: unix.POLLIN})
		}
		var sockEv int16
		if !downWaitsOut {
			sockEv |= unix.POLLIN
		}
		if u.pending() && !u.broken {
			sockEv |= unix.POLLOUT
		}
		if sockEv != 0 {
			iSock = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(sock), Events: sockEv})
		}
		if downWaitsOut {
			iOut = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(out), Events: unix.POLLOUT})
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
		// Upstream: ssh → gateway, one binary message per read.
		if ready(iIn, unix.POLLIN) {
			n, err := readFD(in, u.buf[wsMaxHeader:])
			switch {
			case err == unix.EAGAIN:
			case err != nil:
				return err
			case n == 0: // EOF on stdin: close, keep reading to the gateway's close
				upOpen, closeSent = false, true
				if err := u.control(opClose, binary.BigEndian.AppendUint16(nil, closeNormal)); err != nil {
					return err
				}
			default:
				if u.broken {
					break // the gateway reads no more: what it sent is still read below
				}
				if err := u.data(n); err != nil {
					return err
				}
			}
		}
		if u.fresh || ready(iSock, unix.POLLOUT) {
			if err := u.flush(sock); err != nil {
				return err
			}
		}
		// Downstream: gateway → ssh.
		if ready(iSock, unix.POLLIN) && !downWaitsOut || ready(iOut, unix.POLLOUT) {
			downWaitsOut = false
			ev, err := d.step(sock, out, &u, closeSent)
			if err != nil {
				return fail(err)
			}
			switch ev {
			case wsOutFull:
				downWaitsOut = true
			case wsEnd:
				u.drain(sock)
				return nil
			}
			if u.fresh { // a ping's answer
				if err := u.flush(sock); err != nil {
					return err
				}
			}
		}
	}
}

// step moves what the socket holds: headers and control frames read,
// data frames' payload spliced to out, until the socket is empty, out is
// full, or the gateway ended. Control frames' answers are queued on u.
func (d *wsDown) step(sock, out int, u *wsUp, closeSent bool) (wsEvent, error) {
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
				return 0, d.cutShort()
			}
			d.left -= n
			continue
		}
		if d.left > 0 { // a control frame's payload
			n, err := readFD(sock, d.ctl[d.cn:d.cn+int(d.left)])
			if ev, done, err := d.endOf(n, err); done {
				return ev, err
			}
			d.cn += n
			d.left -= int64(n)
			if d.left > 0 {
				continue
			}
			if ev, err := d.control(u, closeSent); ev != wsAgain || err != nil {
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
		if ev, done, err := d.endOf(n, err); done {
			return ev, err
		}
		d.hn += n
		if d.hn < 2 || d.hn < wsHeaderLen(d.hdr[:2]) {
			continue
		}
		if err := d.begin(); err != nil {
			return 0, err
		}
		if d.left == 0 && d.op != opBinary {
			if ev, err := d.control(u, closeSent); ev != wsAgain || err != nil {
				return ev, err
			}
		}
	}
}

// cutShort is the error for the gateway's end of the connection inside a
// frame or a fragmented message (at a message's boundary, the end is the
// relay's too, as a CONNECT tunnel's).
func (d *wsDown) cutShort() error {
	if d.hn > 0 || d.left > 0 || d.inMsg {
		return fmt.Errorf("websocket relay: the gateway's connection ended inside a frame: %w", io.ErrUnexpectedEOF)
	}
	return nil
}

// endOf tells whether a read of the socket ended the step: nothing in
// (wsAgain), the gateway's end (wsEnd, an error inside a frame), or an
// error.
func (d *wsDown) endOf(n int, err error) (wsEvent, bool, error) {
	switch {
	case err == unix.EAGAIN:
		return wsAgain, true, nil
	case err != nil:
		return wsEnd, true, err
	case n == 0:
		if err := d.cutShort(); err != nil {
			return 0, true, err
		}
		return wsEnd, true, nil
	}
	return 0, false, nil
}

// begin starts the frame whose header d.hdr holds.
func (d *wsDown) begin() error {
	h := d.hdr[:d.hn]
	d.hn, d.cn = 0, 0
	if h[0]&0x70 != 0 {
		return protoErr("a frame with reserved bits set (no extension was agreed)")
	}
	if h[1]&0x80 != 0 {
		return protoErr("a masked frame from the gateway")
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
	if n>>63 != 0 {
		return protoErr("a frame length with its most significant bit set")
	}
	fin := h[0]&0x80 != 0
	op := h[0] & 0x0f
	switch op {
	case opBinary:
		if d.inMsg {
			return protoErr("a new message before the last frame of a fragmented one")
		}
		d.inMsg = !fin
	case opContinuation:
		if !d.inMsg {
			return protoErr("a continuation frame with no fragmented message to continue")
		}
		d.inMsg = !fin
		op = opBinary // a message's later frames carry its bytes as well
	case opClose, opPing, opPong:
		if n > 125 || !fin {
			return protoErr("a control frame (opcode %d) of %d bytes or fragmented", op, n)
		}
	default:
		return protoErr("unexpected frame (opcode %d): want binary messages", op)
	}
	d.op, d.left = op, int64(n)
	return nil
}

// control acts on the control frame just read in full: a ping is
// answered, a close ends the relay (answered unless ours went first).
func (d *wsDown) control(u *wsUp, closeSent bool) (wsEvent, error) {
	payload := d.ctl[:d.cn]
	d.cn = 0
	switch d.op {
	case opPing:
		if !closeSent {
			if err := u.control(opPong, payload); err != nil {
				return 0, err
			}
		}
	case opClose:
		code, err := closeCode(payload)
		if err != nil {
			return 0, err
		}
		if !closeSent {
			var answer []byte // no status in, none out (1005 is never sent)
			if code != 0 {
				answer = binary.BigEndian.AppendUint16(nil, code) // echo it, as RFC 6455 §5.5.1 suggests
			}
			if err := u.control(opClose, answer); err != nil {
				return 0, err
			}
		}
		return wsEnd, nil
	}
	return wsAgain, nil
}

// closeCode is the status of a close frame's payload (0: none), checked
// as RFC 6455 §5.5.1 and §7.4 ask: two bytes of a code a peer may send,
// then a UTF-8 reason.
func closeCode(p []byte) (uint16, error) {
	switch {
	case len(p) == 0:
		return 0, nil
	case len(p) == 1:
		return 0, protoErr("a close frame with a 1-byte payload")
	}
	code := binary.BigEndian.Uint16(p)
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1014, code >= 3000 && code <= 4999:
	default:
		return 0, protoErr("a close frame with status %d, which a peer may not send", code)
	}
	if !utf8.Valid(p[2:]) {
		return 0, &wsProtoError{code: closeBadData, msg: "a close frame whose reason is not UTF-8"}
	}
	return code, nil
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
