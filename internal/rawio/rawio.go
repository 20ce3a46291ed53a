// Package rawio moves bulk data through non-blocking descriptors with
// raw system calls, waiting for them in the runtime's poller, for the
// gateway's hot paths (a tunnel's socket, a command's stdin pipe).
//
// An ordinary system call hands its P to the scheduler for the call's
// length; a read or write of a few hundred KiB runs longer than sysmon's
// 20 µs tick, so sysmon takes the P back and wakes another thread to run
// it, and the caller waits for a P again when the call returns. On a bulk
// transfer that happens thousands of times a second (perf of the gateway,
// 1 GiB up an exec channel: sysmon alone 9.7% of its CPU, mostly in its
// 20 µs sleeps, and another 10% in threads parking and waking). A raw
// call keeps the P: the scheduler sees the goroutine running. That is
// only safe for a call that cannot block, so every descriptor here must
// be non-blocking (NonBlocking): a full or empty one returns EAGAIN and
// the wait is the poller's, as for any Go socket.
package rawio

import (
	"errors"
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
// any other connection (TLS, a pipe) as it is.
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

func (c *Conn) Read(p []byte) (int, error) {
	n, err := Read(c.rc, p)
	if err != nil && err != io.EOF {
		err = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, err
}

func (c *Conn) Write(p []byte) (int, error) {
	n, err := Write(c.rc, p)
	if err != nil {
		err = &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, err
}

// File is a pipe's *os.File whose Read is a raw call: the gateway's end
// of a command's stdout or stderr.
type File struct {
	*os.File
	rc syscall.RawConn
}

// WrapFile returns f as a *File where raw calls are supported, f as it
// is elsewhere (or when its SyscallConn fails).
func WrapFile(f *os.File) io.ReadCloser {
	if !Supported {
		return f
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return f
	}
	return &File{File: f, rc: rc}
}

// Read is a raw read(2) when the descriptor is non-blocking, an ordinary
// one when it is not (its Fd method was called): see Read.
func (f *File) Read(p []byte) (int, error) {
	n, err := Read(f.rc, p)
	if err == nil || err == io.EOF {
		return n, err
	}
	var se *os.SyscallError
	if !errors.As(err, &se) && !errors.Is(err, os.ErrDeadlineExceeded) {
		// The poller's only other answer for a file: closed. It reads
		// as an *os.File's does.
		err = os.ErrClosed
	}
	return n, &os.PathError{Op: "read", Path: f.Name(), Err: err}
}

// Read reads once from rc's descriptor into p, waiting in the poller
// while there is nothing to read: a raw read(2) when the descriptor is
// non-blocking, an ordinary one when it is not (checked at every call, as
// Writev does). It returns io.EOF at the
// end, and the poller's error (a closed descriptor: net.ErrClosed; a
// deadline) or the call's (an *os.SyscallError) otherwise.
func Read(rc syscall.RawConn, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := rc.Read(func(fd uintptr) bool {
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
		return 0, err
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p to rc's non-blocking descriptor (NonBlocking), waiting in the
// poller while it is full.
func Write(rc syscall.RawConn, p []byte) (int, error) {
	total := 0
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		for len(p) > 0 {
			var n int
			n, errno = rawWrite(fd, p)
			switch errno {
			case 0:
				total += n
				p = p[n:]
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
		return total, os.NewSyscallError("write", errno)
	}
	return total, err
}

// Writev writes every byte of bufs to rc's descriptor with as few
// writev(2) calls as it takes (at most IovMax slices each), waiting in
// the poller while it is full. It checks the descriptor's mode at every
// call, as a pipe's *os.File turns blocking when its Fd method is called:
// a blocking descriptor gets ordinary calls, as every descriptor does
// where raw calls are not supported.
func Writev(rc syscall.RawConn, bufs [][]byte) (int, error) {
	total := 0
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		call := rawWritev
		if !nonBlocking(fd) {
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
		return total, os.NewSyscallError("writev", errno)
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
