package egress

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// pipeSize is what a tunnel asks for its pipe (the kernel may give
// less): the most one splice(2) moves.
const pipeSize = 1 << 20

// relay copies src to dst until src's EOF (nil) or an error, with
// splice(2) through a pipe of the tunnel's own. Unlike the standard
// library's splice, whose pipes are pooled and closed only by a garbage
// collection, the pipe is made when src first has bytes (a tunnel that
// waits holds none) and closed before relay returns. moved is called
// with every count of bytes written to dst.
func relay(dst, src net.Conn, moved func(int64)) error {
	sc, ok1 := src.(syscall.Conn)
	dc, ok2 := dst.(syscall.Conn)
	if !ok1 || !ok2 {
		return copyRelay(dst, src, moved)
	}
	sraw, err := sc.SyscallConn()
	if err != nil {
		return copyRelay(dst, src, moved)
	}
	draw, err := dc.SyscallConn()
	if err != nil {
		return copyRelay(dst, src, moved)
	}
	var p pipe
	defer p.close()
	for {
		var (
			n      int
			eof    bool
			opErr  error
			noPipe bool // splice is not supported here: copy instead
		)
		err := sraw.Read(func(fd uintptr) bool {
			if !p.ok {
				// Wait for bytes (or EOF) without a pipe.
				var b [1]byte
				k, _, e := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
				switch {
				case e == unix.EAGAIN || e == unix.EINTR:
					return false
				case e != nil:
					opErr = e
					return true
				case k == 0:
					eof = true
					return true
				}
				if opErr = p.open(); opErr != nil {
					return true
				}
			}
			for {
				k, e := unix.Splice(int(fd), nil, p.w, nil, pipeSize, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				switch {
				case e == unix.EINTR:
					continue
				case e == unix.EAGAIN:
					return false
				case e == unix.EINVAL && !p.used:
					noPipe = true
				case e != nil:
					opErr = e
				case k == 0:
					eof = true
				default:
					n = int(k)
					p.used = true
				}
				return true
			}
		})
		switch {
		case err != nil:
			return err
		case noPipe:
			p.close()
			return copyRelay(dst, src, moved)
		case opErr != nil:
			return opErr
		case eof:
			closeWrite(dst)
			return nil
		}
		for n > 0 {
			var k int
			err := draw.Write(func(fd uintptr) bool {
				for {
					w, e := unix.Splice(p.r, nil, int(fd), nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
					switch {
					case e == unix.EINTR:
						continue
					case e == unix.EAGAIN:
						return false
					case e != nil:
						opErr = e
					default:
						k = int(w)
					}
					return true
				}
			})
			if err == nil {
				err = opErr
			}
			if err != nil {
				return err
			}
			if k == 0 {
				return errors.New("splice to the destination moved nothing")
			}
			n -= k
			moved(int64(k))
		}
	}
}

// pipe is a tunnel direction's pipe; zero: none yet.
type pipe struct {
	r, w int
	ok   bool // open
	used bool // bytes went through it: splice works here
}

func (p *pipe) open() error {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return err
	}
	p.r, p.w, p.ok = fds[0], fds[1], true
	// Best effort: a smaller pipe only means more splices.
	_, _ = unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, pipeSize)
	return nil
}

func (p *pipe) close() {
	if !p.ok {
		return
	}
	unix.Close(p.r)
	unix.Close(p.w)
	p.ok = false
}

// discardBuffered reads and drops what c has received so far, without
// waiting.
func discardBuffered(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	var buf [4 << 10]byte
	raw.Read(func(fd uintptr) bool {
		for range 16 {
			n, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_DONTWAIT)
			if err != nil || n <= 0 {
				break
			}
		}
		return true
	})
}
