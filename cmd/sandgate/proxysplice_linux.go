package main

import (
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// pipeMax is the size the proxy asks for its stdin and stdout pipes
// (Linux caps it at /proc/sys/fs/pipe-max-size, 1 MiB by default).
const pipeMax = 1 << 20

// spliceIn moves stdin to conn with splice(2) when stdin is a pipe (ssh's
// ProxyCommand gives it one) and conn a socket: the bytes go from the
// pipe to the socket in the kernel, with no read and write through a
// buffer here. It reports false, having moved nothing, when either end
// is something else; the caller copies then.
func spliceIn(conn io.Writer, stdin io.Reader) (handled bool, err error) {
	in, ok := stdin.(*os.File)
	if !ok || !isPipe(in) {
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
	// A larger pipe lets ssh hand over more per wake-up (best effort).
	_, _ = unix.FcntlInt(in.Fd(), unix.F_SETPIPE_SZ, pipeMax)
	src := int(in.Fd())
	for {
		// Wait for ssh's next write here, holding no reference to the
		// socket: a splice that blocked on the pipe inside raw.Write
		// would hold one, and the socket's Close (when the gateway ends
		// the connection) would wait for it forever, so the proxy would
		// never exit and ssh never learn the connection is gone.
		if err := waitReadable(src); err != nil {
			return true, err
		}
		var n int64
		var serr error
		// The pipe has data (or its writer is gone: splice says 0), so a
		// non-blocking splice takes some; EAGAIN then means the socket's
		// buffer is full, and the poller waits for room.
		werr := raw.Write(func(fd uintptr) bool {
			for {
				n, serr = unix.Splice(src, nil, int(fd), nil, pipeMax, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				if serr != unix.EINTR {
					return serr != unix.EAGAIN
				}
			}
		})
		switch {
		case werr != nil:
			return true, werr
		case serr != nil:
			return true, serr
		case n == 0:
			return true, nil // EOF on stdin
		}
	}
}

// waitReadable blocks until fd has data to read, or its writer closed.
func waitReadable(fd int) error {
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, err := unix.Poll(pfd, -1)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// growPipe asks for a larger pipe when w is one (ssh's stdout pipe), so
// that the copy from the socket hands ssh more per wake-up.
func growPipe(w io.Writer) {
	if f, ok := w.(*os.File); ok && isPipe(f) {
		_, _ = unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, pipeMax)
	}
}

func isPipe(f *os.File) bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFIFO
}
