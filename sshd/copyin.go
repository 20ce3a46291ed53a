package sshd

import (
	"errors"
	"io"
	"syscall"

	"github.com/sandgate/sandgate/internal/rawio"
)

// bufferReader is the copy-free read of the patched x/crypto's channels
// (third_party/README.md): the channel lends its packets' bytes in place
// to write and drops what write reports written.
type bufferReader interface {
	ReadBuffers(max int, write func([][]byte) (int, error)) (int, error)
}

// copyIn copies a channel's data (what the client sends) to dst, the
// command's stdin or a forwarded connection, until the channel's EOF. see,
// when set, is shown every byte before dst gets it (the SFTP tap); touch
// is called for every batch (session activity).
//
// When the channel lends its packets and dst is a descriptor itself (a
// pipe or a socket, not a layer over one), each batch, up to copyBufMax
// bytes of whole packets as they arrived, goes into dst with one
// writev(2), never passing through a buffer of ours; otherwise it is
// copyStream.
func copyIn(dst io.Writer, ch io.Reader, see func([]byte), touch func(), pool *bufPool) (int64, error) {
	br, lends := ch.(bufferReader)
	rc := descriptorOf(dst)
	if !lends || rc == nil || !rawio.HaveWritev {
		return copyStream(observed(dst, see), touchReader{ch, touch}, pool)
	}
	var written int64
	write := func(bufs [][]byte) (int, error) {
		touch()
		if see != nil {
			for _, b := range bufs {
				see(b)
			}
		}
		return rawio.Writev(rc, bufs)
	}
	for {
		n, err := br.ReadBuffers(copyBufMax, write)
		written += int64(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return written, nil
			}
			return written, err
		}
	}
}

// descriptorOf returns the descriptor w is itself (a pipe's *os.File, a
// *net.TCPConn), or nil: a layer over one (TLS, a byte counter) must see
// its writes, so it is never looked through.
func descriptorOf(w io.Writer) syscall.RawConn {
	sc, ok := w.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// observed is w, showing see each write first; w itself when see is nil.
func observed(w io.Writer, see func([]byte)) io.Writer {
	if see == nil {
		return w
	}
	return tapWriter{w, see}
}

// touchReader calls touch after every read that returned data.
type touchReader struct {
	r     io.Reader
	touch func()
}

func (r touchReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.touch()
	}
	return n, err
}
