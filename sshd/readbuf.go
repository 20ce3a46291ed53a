package sshd

import "io"

// readAhead sits between a tunnel and x/crypto/ssh's transport, whose
// bufio.Reader holds 4 KiB: for every 32 KiB packet it makes a 4 KiB read
// and then one or more reads for the rest, each a read(2) and often a
// trip through the poller. After a read that fills the transport's whole
// request (bulk data is flowing), the next read takes up to copyBufMax
// at once into a buffer lent by the pool, and the transport's reads are
// served from it. The buffer goes back to the pool as soon as it is
// served, so a connection holds one only while data is arriving: an idle
// one blocks in a read into the transport's own buffer.
type readAhead struct {
	src   io.Reader
	pool  *bufPool
	ahead bool    // the last read into the caller's buffer filled it
	big   *[]byte // lent by pool until (*big)[r:w] is served
	r, w  int
	err   error // the source's error, returned with the last byte of big
}

// readAheadMin is the smallest full read that turns read-ahead on: the
// transport's bufio.Reader refills 4 KiB at a time, and reads the rest of
// a larger packet directly.
const readAheadMin = 4 << 10

func (b *readAhead) Read(p []byte) (int, error) {
	if b.big == nil && b.ahead {
		b.ahead = false
		b.big = b.pool.get()
		n, err := b.src.Read(*b.big)
		if n == 0 {
			b.pool.put(b.big)
			b.big = nil
			return 0, err
		}
		b.r, b.w, b.err = 0, n, err
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
