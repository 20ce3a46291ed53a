//go:build !linux

package piperelay

import (
	"io"
	"net"
)

// Relay is Linux only: elsewhere it moves nothing and the caller copies.
func Relay(io.Writer, io.Reader, io.Writer) (bool, error) { return false, nil }

// GrowPipe does nothing here.
func GrowPipe(io.Writer) {}

// RelayWebSocket is Linux only: elsewhere it takes nothing and the caller copies.
func RelayWebSocket(func() (net.Conn, bool), io.Reader, io.Writer) (bool, error) {
	return false, nil
}
