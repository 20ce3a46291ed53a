package sshd

import (
	"errors"
	"io"
)

// Copy buffer sizes. A copy starts small so that an idle shell holds little
// memory, and grows once a read fills its buffer, which means bulk data is
// queued behind it.
const (
	copyBufMin = 32 << 10
	copyBufMax = 256 << 10
)

// copyStream copies src to dst like io.Copy, but with a buffer that grows
// from copyBufMin to copyBufMax while reads keep filling it. It never uses
// dst's ReadFrom or src's WriteTo: for an SSH channel reader every Read also
// sends a window adjustment, so one large read in place of several small
// ones saves both the adjustments and the writes into the process's pipe.
func copyStream(dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, copyBufMin)
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
			if n == len(buf) && len(buf) < copyBufMax {
				buf = make([]byte, min(2*len(buf), copyBufMax))
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
