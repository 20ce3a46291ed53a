package tunnel

import (
	"net"
	"time"
)

// WithLingerWait sets the bound of a tunnel's end (lingerWait) for a test.
func WithLingerWait(d time.Duration) Option { return func(t *Server) { t.lingerWait = d } }

// LingerMaxBytes is lingerMaxBytes, for the tests.
const LingerMaxBytes = lingerMaxBytes

// NewLingerConn returns c as a tunnel's end closes it (lingerConn), with
// its Done.
func NewLingerConn(c net.Conn, wait time.Duration) (net.Conn, <-chan struct{}) {
	l := newLingerConn(c, wait)
	return l, l.Done()
}
