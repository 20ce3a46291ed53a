//go:build linux

package linuxns_test

import (
	"bufio"
	"context"
	"net"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

// DialLoopback reaches a listener in the sandbox's own network namespace
// (here the proxy listener, which the gateway holds there), not another
// sandbox's, and answers port errors and closed ports with an error.
func TestLinuxDialLoopback(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	ctx := context.Background()
	var sbs [2]sandbox.Sandbox
	for i, id := range []string{"sbx-dial-a", "sbx-dial-b"} {
		sb, err := d.Create(ctx, sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		sbs[i] = sb
	}
	ln, _, err := sbs[0].(sandbox.ProxyListener).ListenProxy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			_, _ = c.Write([]byte("got " + line))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	c, err := sbs[0].(sandbox.LoopbackDialer).DialLoopback(ctx, "tcp4", port)
	if err != nil {
		t.Fatalf("dial the sandbox's loopback: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(c).ReadString('\n'); line != "got hello\n" {
		t.Fatalf("answer %q", line)
	}
	// The other sandbox's loopback has nothing on that port.
	if c, err := sbs[1].(sandbox.LoopbackDialer).DialLoopback(ctx, "tcp4", port); err == nil {
		c.Close()
		t.Fatal("another sandbox's loopback reached the listener")
	}
	// ::1 exists in the namespace, with nothing listening there.
	if c, err := sbs[0].(sandbox.LoopbackDialer).DialLoopback(ctx, "tcp6", port); err == nil {
		c.Close()
		t.Fatal("tcp6 reached a tcp4-only listener")
	}
	for _, bad := range []struct {
		network string
		port    int
	}{{"tcp4", 0}, {"tcp4", 65536}, {"udp", port}, {"tcp", port}} {
		if c, err := sbs[0].(sandbox.LoopbackDialer).DialLoopback(ctx, bad.network, bad.port); err == nil {
			c.Close()
			t.Errorf("DialLoopback(%s, %d) succeeded", bad.network, bad.port)
		}
	}
}
