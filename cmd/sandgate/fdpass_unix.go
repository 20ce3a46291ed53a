//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/tunnel"
)

// maxConnectHead bounds the CONNECT answer's status line and headers.
const maxConnectHead = 64 << 10

// proxyFdpass is `sandgate proxy --fdpass`: it opens the tunnel, reads the
// CONNECT answer without reading one byte past it, and hands the connected
// socket to ssh over out (OpenSSH's ProxyUseFdpass). ssh then talks to the
// gateway directly: no proxy process stays behind copying every byte.
// Plain http:// gateways only; with TLS the session state lives in the proxy.
func proxyFdpass(ctx context.Context, d *tunnel.Dialer, id string, out *os.File) error {
	u, err := url.Parse(d.APIURL)
	if err != nil || u.Host == "" {
		return fmt.Errorf("invalid API URL %q", d.APIURL)
	}
	if u.Scheme != "http" {
		return errors.New("--fdpass needs an http:// gateway URL: over https the TLS session cannot leave the proxy")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	nc, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("connect to gateway: %w", err)
	}
	conn := nc.(*net.TCPConn)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if err := tunnel.WriteConnect(conn, u.Host, tunnel.ConnectPath(u.Path, id), d.Token); err != nil {
		return err
	}
	// The gateway's SSH banner follows the answer at once: read the head a
	// byte at a time so that it stays in the socket for ssh.
	head := make([]byte, 0, 128)
	one := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if len(head) >= maxConnectHead {
			return errors.New("read CONNECT response: header too large")
		}
		if _, err := io.ReadFull(conn, one); err != nil {
			return fmt.Errorf("read CONNECT response: %w", err)
		}
		head = append(head, one[0])
	}
	if err := tunnel.ReadConnectResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(head), conn))); err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Time{})
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	if err := raw.Control(func(fd uintptr) {
		sendErr = unix.Sendmsg(int(out.Fd()), []byte{0}, unix.UnixRights(int(fd)), nil, 0)
	}); err != nil {
		return err
	}
	if sendErr != nil {
		return fmt.Errorf("pass the socket to ssh (is ProxyUseFdpass yes set?): %w", sendErr)
	}
	return nil
}
