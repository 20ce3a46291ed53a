// Package rawio moves bulk data through non-blocking sockets with raw
// system calls, waiting for them in the runtime's poller, for the
// gateway's hot paths (a tunnel's socket, a forwarded connection).
//
// An ordinary system call hands its P to the scheduler for the call's
// length; a read or write of a few hundred KiB runs longer than sysmon's
// 20 µs tick, so sysmon takes the P back and wakes another thread to run
// it, and the caller waits for a P again when the call returns. On a bulk
// transfer that happens thousands of times a second (perf of the gateway,
// 1 GiB up an exec channel: sysmon alone 9.7% of its CPU, mostly in its
// 20 µs sleeps, and another 10% in threads parking and waking). A raw
// call keeps the P: the scheduler sees the goroutine running. That is
// only safe for a call that cannot sleep, so the raw calls are made only
// on non-blocking sockets (a full or empty one returns EAGAIN and the
// wait is the poller's, as for any Go socket); anything else gets
// ordinary calls. Not pipes: a read or write of a pipe takes the pipe's
// mutex, an uninterruptible sleep for as long as the other end holds it
// for its own copy, which a sandboxed process (throttled by its CPU
// limit, faulting, reclaiming at its memory limit) can make long on
// purpose; a raw call would sleep holding its P, and a stop-the-world
// would wait for it. A socket's peer holds only its own socket's lock.
package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn is a TCP connection whose Read and Write are raw system calls
// (see the package's doc); everything else is the *net.TCPConn's.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// Wrap returns c as a *Conn when it is a *net.TCPConn (whose socket the
// runtime always makes non-blocking) and raw calls are supported here;
// any other connection (TLS, a pipe) as it is. Use the *Conn's Read and
// Write: its ReadFrom and WriteTo are the *net.TCPConn's, ordinary calls.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok || !Supported {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil || !NonBlocking(rc) {
		return c
	}
	return &Conn{TCPConn: tc, rc: rc}
}

// NetConn returns the *net.TCPConn under c.
func (c *Conn) NetConn() net.Conn { return c.TCPConn }

// Read is a raw read(2), or an ordinary one if the socket has been made
// blocking (its mode is checked at every call: the socket type is known).
// It returns io.EOF at the end; errors read as a *net.TCPConn's.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		call := rawRead
		if !nonBlocking(fd) {
			call = read
		}
		for {
			n, errno = call(fd, p)
			switch errno {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			return true
		}
	})
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, as Read makes its calls.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := writeAll(c.rc, [][]byte{p}, "write", nonBlocking)
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

// opError is err as a *net.TCPConn's Read or Write reports it: a
// *net.OpError around the cause (the poller's answers come wrapped in
// one of their own, "raw-read" or "raw-write", which is taken off).
func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Writev writes every byte of bufs to rc's descriptor with as few
// writev(2) calls as it takes (at most IovMax slices each), waiting in
// the poller while it is full: raw calls when the descriptor is a
// non-blocking socket (a forwarded connection), ordinary ones otherwise
// (a command's stdin pipe; everything where raw calls are not
// supported), checked at every call.
func Writev(rc syscall.RawConn, bufs [][]byte) (int, error) {
	return writeAll(rc, bufs, "writev", rawSafe)
}

// writeAll is Conn.Write and Writev: raw calls where safe(fd) says so;
// op names the call in an error.
func writeAll(rc syscall.RawConn, bufs [][]byte, op string, safe func(uintptr) bool) (int, error) {
	total := 0
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		call := rawWritev
		if !safe(fd) {
			call = writev
		}
		for len(bufs) > 0 {
			var n int
			n, errno = call(fd, bufs[:min(len(bufs), IovMax)])
			switch errno {
			case 0:
				total += n
				bufs = advance(bufs, n)
				continue
			case syscall.EINTR:
				errno = 0
				continue
			case syscall.EAGAIN:
				errno = 0
				return false
			}
			return true
		}
		return true
	})
	if errno != 0 {
		return total, os.NewSyscallError(op, errno)
	}
	return total, err
}

// IovMax is the most slices one writev(2) takes (IOV_MAX on Linux; more
// is EINVAL).
const IovMax = 1024

// advance drops the first n bytes of bufs: whole slices, then the front
// of the next.
func advance(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n < len(bufs[0]) {
			bufs[0] = bufs[0][n:]
			return bufs
		}
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	for len(bufs) > 0 && len(bufs[0]) == 0 {
		bufs = bufs[1:]
	}
	return bufs
}
