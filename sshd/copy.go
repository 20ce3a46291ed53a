package sshd

import (
	"errors"
	"io"
	"sync"
)

// Copy buffer sizes. A copy reads into a small buffer, so that an idle
// shell holds little memory, and into a large one from a pool while reads
// fill the small one, which means bulk data is queued behind them.
const (
	copyBufMin = 32 << 10
	copyBufMax = 256 << 10
)

// bufPool lends the copy buffers, small and large, so that neither a
// copy moving between bursts and quiet spells nor every short command
// (three copies each) allocates and clears its buffers anew.
type bufPool struct{ small, large sync.Pool }

func (b *bufPool) get() *[]byte { return poolGet(&b.large, copyBufMax) }

func (b *bufPool) put(buf *[]byte) { b.large.Put(buf) }

func (b *bufPool) getSmall() *[]byte { return poolGet(&b.small, copyBufMin) }

func (b *bufPool) putSmall(buf *[]byte) { b.small.Put(buf) }

func poolGet(p *sync.Pool, size int) *[]byte {
	if v, ok := p.Get().(*[]byte); ok {
		return v
	}
	buf := make([]byte, size)
	return &buf
}

// copyStream copies src to dst like io.Copy, but switches to a large
// buffer while reads fill the small one, and back after a read that fills
// less than half of the large one. It never uses dst's ReadFrom or src's
// WriteTo: for an SSH channel reader every Read also sends a window
// adjustment, so one large read in place of several small ones saves both
// the adjustments and the writes into the process's pipe.
func copyStream(dst io.Writer, src io.Reader, pool *bufPool) (int64, error) {
	smallBuf := pool.getSmall()
	small := *smallBuf
	buf := small
	var large *[]byte
	defer func() {
		pool.putSmall(smallBuf)
		if large != nil {
			pool.put(large)
		}
	}()
	var written int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			written += int64(w)
			if werr != nil {
				return written, werr
			}
			if w != n {
				return written, io.ErrShortWrite
			}
			switch {
			case large == nil && n == len(small):
				large = pool.get()
				buf = *large
			case large != nil && n < copyBufMax/2:
				pool.put(large)
				large, buf = nil, small
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return written, nil
			}
			return written, rerr
		}
	}
}
