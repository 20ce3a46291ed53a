//go:build !linux

package egress

import "net"

// relay copies src to dst until src's EOF (nil) or an error; moved is
// called with every count of bytes written to dst.
func relay(dst, src net.Conn, moved func(int64)) error {
	return copyRelay(dst, src, moved)
}

// discardBuffered would drop what c has received so far; elsewhere than
// Linux it does nothing.
func discardBuffered(net.Conn) {}
