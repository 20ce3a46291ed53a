package sshd

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/sandgate/sandgate/internal/rawio"
)

// readAhead sits between a tunnel and x/crypto/ssh's transport, whose
// bufio.Reader holds 4 KiB: for every 32 KiB packet it makes a 4 KiB read
// and then one or more reads for the rest, each a read(2) and often a
// trip through the poller. After a read that fills the transport's whole
// request (bulk data is flowing), the next read takes up to copyBufMax
// at once into a buffer lent by the pool, and the transport's reads are
// served from it. It takes the buffer only when the socket has data ready
// (ready), so it never blocks holding one; the buffer goes back as soon as
// it is served. An idle connection holds no pooled buffer: it blocks in a
// read into the transport's own. A source whose socket cannot be probed
// gets no read-ahead. A tunnel that says itself how much a read returns
// without waiting (ReadAvailable: a WebSocket, whose library reads a
// frame's payload in full up to the size asked) is read ahead only when
// that is more than the caller asks, and no further than it.
type readAhead struct {
	src   io.Reader
	pool  *bufPool
	ahead bool    // the last read into the caller's buffer filled it
	big   *[]byte // lent by pool until (*big)[r:w] is served
	r, w  int
	err   error // the source's error, returned with the last byte of big
	// ready reports whether a read of src returns without waiting; nil:
	// readyOf(src), unless src has avail.
	ready func() bool
	// avail, for a src that has ReadAvailable, is it.
	avail  func() int
	probed bool
}

// readAheadMin is the smallest full read that turns read-ahead on: the
// transport's bufio.Reader refills 4 KiB at a time, and reads the rest of
// a larger packet directly.
const readAheadMin = 4 << 10

func (b *readAhead) Read(p []byte) (int, error) {
	if b.big == nil && b.ahead {
		b.ahead = false
		if !b.probed {
			b.probed = true
			if b.ready == nil {
				if r := readAvailableOf(b.src); r != nil {
					b.avail = r.ReadAvailable
				} else {
					b.ready = readyOf(b.src)
				}
			}
		}
		want := 0
		if b.avail != nil {
			want = b.avail()
		} else if b.ready() {
			want = copyBufMax
		}
		if want > len(p) {
			b.big = b.pool.get()
			n, err := b.src.Read((*b.big)[:min(want, len(*b.big))])
			if n == 0 {
				b.pool.put(b.big)
				b.big = nil
				return 0, err
			}
			b.r, b.w, b.err = 0, n, err
		}
	}
	if b.big != nil {
		n := copy(p, (*b.big)[b.r:b.w])
		b.r += n
		if b.r < b.w {
			return n, nil
		}
		err := b.err
		b.pool.put(b.big)
		b.big, b.err = nil, nil
		return n, err
	}
	n, err := b.src.Read(p)
	b.ahead = err == nil && n >= readAheadMin && n == len(p)
	return n, err
}

// readyOf returns a probe of whether src's socket has data (or an end or
// an error) to read now: a non-blocking MSG_PEEK of one byte. src is the
// socket (a syscall.Conn) or a layer over one that names it (NetConn, as
// *tls.Conn does; its record may still be arriving, a short wait). A
// layer's own buffered bytes are not seen: then the probe says no, and
// the read goes into the caller's buffer, which it fills at once. A src
// with no socket: never ready (no read-ahead).
func readyOf(src io.Reader) func() bool {
	rc := rawConnOf(src)
	if rc == nil {
		return func() bool { return false }
	}
	if rawio.Supported {
		return func() bool { return rawio.Ready(rc) }
	}
	return func() bool {
		ready := false
		var b [1]byte
		err := rc.Read(func(fd uintptr) bool {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			ready = !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR)
			return true // never wait
		})
		return ready || err != nil
	}
}

// readAvailableOf returns the layer of src (src itself, or one under the
// layers that name what they wrap) that tells how much a read returns
// without waiting: a WebSocket tunnel, whose bytes may sit in its
// library's buffer, whose socket also carries frame headers, and whose
// reads wait for a frame's payload in full. Nil without one.
func readAvailableOf(src any) interface{ ReadAvailable() int } {
	for range 8 {
		if r, ok := src.(interface{ ReadAvailable() int }); ok {
			return r
		}
		nc, ok := src.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		src = nc.NetConn()
	}
	return nil
}

// rawConnOf returns the socket under src: src itself (a syscall.Conn), or
// the one under the layers over it that name what they wrap (NetConn, as
// *tls.Conn and the gateway's byte counters do); nil without one.
func rawConnOf(src any) syscall.RawConn {
	for range 8 {
		switch c := src.(type) {
		case syscall.Conn:
			rc, err := c.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		case interface{ NetConn() net.Conn }:
			src = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}
