package main

import (
	"io"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// pipeMax is the size the proxy asks for its stdin and stdout pipes, and
// the most one splice(2) moves (Linux caps a pipe at
// /proc/sys/fs/pipe-max-size, 1 MiB by default).
const pipeMax = 1 << 20

// relayPipes moves bytes both ways between ssh's pipes (stdin, stdout)
// and the gateway's socket, in the kernel: one loop on one thread waits
// with poll(2) and moves with splice(2), pipe → socket and socket → pipe,
// so no byte passes through a buffer here and no goroutine hands work to
// another. It returns when the gateway ends the connection (EOF on stdin
// half-closes it, as ssh expects), or on an error either way.
//
// It reports false, having moved nothing, when stdin or stdout is not a
// pipe or conn not a socket; the caller copies then.
func relayPipes(conn io.Writer, stdin io.Reader, stdout io.Writer) (handled bool, err error) {
	in, ok := stdin.(*os.File)
	if !ok || !isPipe(in) {
		return false, nil
	}
	out, ok := stdout.(*os.File)
	if !ok || !isPipe(out) {
		return false, nil
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, nil
	}
	sock := -1
	if err := raw.Control(func(fd uintptr) { sock = int(fd) }); err != nil || sock < 0 {
		return false, nil
	}
	// The socket is the runtime's (non-blocking); conn stays open, and
	// unused elsewhere, until this returns.

	// Larger pipes let each side hand over more per wake-up.
	setPipeMax(in)
	setPipeMax(out)
	err = relayLoop(int(in.Fd()), int(out.Fd()), sock)
	// The loop used raw descriptors: keep their owners open until now.
	runtime.KeepAlive(conn)
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	return true, err
}

// relayLoop is relayPipes' loop over the raw descriptors: in and out are
// pipes, sock a non-blocking stream socket.
func relayLoop(in, out, sock int) error {
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	upOpen := true        // stdin has not reached EOF
	upWaitsSock := false  // stdin has data, the socket had no room
	downWaitsOut := false // the socket has data, ssh's pipe had no room
	pfdBuf := make([]unix.PollFd, 0, 3)
	for {
		pfds := pfdBuf[:0]
		iIn, iSock, iOut := -1, -1, -1
		if upOpen && !upWaitsSock {
			iIn = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(in), Events: unix.POLLIN})
		}
		var sockEv int16
		if !downWaitsOut {
			sockEv |= unix.POLLIN
		}
		if upOpen && upWaitsSock {
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
		if _, err := unix.Poll(pfds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return err
		}
		ready := func(i int, ev int16) bool {
			return i >= 0 && pfds[i].Revents&(ev|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
		// Upstream: ssh → gateway.
		if ready(iIn, unix.POLLIN) || ready(iSock, unix.POLLOUT) && upWaitsSock {
			upWaitsSock = false
			n, err := spliceOnce(in, sock, flags)
			switch {
			case err == unix.EAGAIN:
				// stdin said readable, so the socket has no room: wait
				// for it. (A pipe that said readable keeps its data.)
				upWaitsSock = true
			case err == unix.EPIPE:
				// The gateway closed its side; what it sent before is
				// still read below, where the relay ends.
				upOpen = false
			case err != nil:
				return err
			case n == 0: // EOF on stdin: half-close, keep reading
				upOpen = false
				if err := unix.Shutdown(sock, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
					return err
				}
			}
		}
		// Downstream: gateway → ssh.
		if ready(iSock, unix.POLLIN) && !downWaitsOut || ready(iOut, unix.POLLOUT) {
			downWaitsOut = false
			n, err := spliceOnce(sock, out, flags)
			switch {
			case err == unix.EAGAIN:
				// The socket said readable, so ssh's pipe is full: wait
				// for room. (TCP keeps what it said was readable.)
				downWaitsOut = true
			case err == unix.EPIPE:
				// ssh has gone (it closes its end once the session is
				// over, while the gateway may still be sending): the
				// end of the relay, not a failure to report.
				return nil
			case err != nil:
				return err
			case n == 0: // the gateway closed the connection
				return nil
			}
		}
	}
}

// spliceOnce is one splice(2) of up to pipeMax bytes, retried on EINTR.
func spliceOnce(from, to, flags int) (int64, error) {
	for {
		n, err := unix.Splice(from, nil, to, nil, pipeMax, flags)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// growPipe asks for a larger pipe when w is one (ssh's stdout pipe), so
// that the copy from the socket hands ssh more per wake-up.
func growPipe(w io.Writer) {
	if f, ok := w.(*os.File); ok && isPipe(f) {
		setPipeMax(f)
	}
}

// setPipeMax asks for a pipeMax pipe (best effort: the kernel may refuse).
func setPipeMax(f *os.File) {
	_, _ = unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, pipeMax)
}

func isPipe(f *os.File) bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFIFO
}
