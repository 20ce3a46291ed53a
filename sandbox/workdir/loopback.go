package workdir

import (
	"context"
	"fmt"
	"net"
	"strconv"
)

// DialLoopback implements sandbox.LoopbackDialer with the host's loopback:
// workdir processes share the host's network, so `ssh -L` into a workdir
// session reaches whatever listens on the host's 127.0.0.1 (or ::1),
// which is no boundary: workdir isolates nothing.
func (s *workdirSandbox) DialLoopback(ctx context.Context, network string, port int) (net.Conn, error) {
	host, err := loopbackHost(network, port)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, network, net.JoinHostPort(host, strconv.Itoa(port)))
}

func loopbackHost(network string, port int) (string, error) {
	if port < 1 || port > 65535 {
		return "", fmt.Errorf("port %d out of range", port)
	}
	switch network {
	case "tcp4":
		return "127.0.0.1", nil
	case "tcp6":
		return "::1", nil
	}
	return "", fmt.Errorf("network %q: want tcp4 or tcp6", network)
}
