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

// bufPool lends the large copy buffers, so that a copy moving between
// bursts and quiet spells does not allocate one each time.
type bufPool struct{ p sync.Pool }

func (b *bufPool) get() *[]byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return v
	}
	buf := make([]byte, copyBufMax)
	return &buf
}

func (b *bufPool) put(buf *[]byte) { b.p.Put(buf) }

// copyStream copies src to dst like io.Copy, but switches to a large
// buffer while reads fill the small one, and back after a read that fills
// less than half of the large one. It never uses dst's ReadFrom or src's
// WriteTo: for an SSH channel reader every Read also sends a window
// adjustment, so one large read in place of several small ones saves both
// the adjustments and the writes into the process's pipe.
func copyStream(dst io.Writer, src io.Reader, pool *bufPool) (int64, error) {
	small := make([]byte, copyBufMin)
	buf := small
	var large *[]byte
	defer func() {
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
