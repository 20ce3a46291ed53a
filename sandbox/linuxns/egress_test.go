//go:build linux

package linuxns_test

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

const testPEM = "-----BEGIN CERTIFICATE-----\nc2FuZGdhdGUgdGVzdA==\n-----END CERTIFICATE-----\n"

// The proxy listener lives in the sandbox's network namespace: its own
// processes reach it on loopback, another sandbox's do not, and the host's
// loopback has nothing on that port because of it.
func TestLinuxProxyListener(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	ctx := context.Background()
	var sbs [2]sandbox.Sandbox
	for i, id := range []string{"sbx-proxy-a", "sbx-proxy-b"} {
		sb, err := d.Create(ctx, sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		sbs[i] = sb
	}
	ln, addr, err := sbs[0].(sandbox.ProxyListener).ListenProxy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if addr != "127.0.0.1:3128" {
		t.Errorf("proxy address %q", addr)
	}
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
	probe := `exec 3<>/dev/tcp/127.0.0.1/3128 && echo hello >&3 && head -n1 <&3 || echo unreachable`
	if out, _, _ := runIn(t, sbs[0], "bash -c '"+probe+"'"); out != "got hello\n" {
		t.Errorf("own sandbox through its proxy listener: %q", out)
	}
	if out, _, _ := runIn(t, sbs[1], "bash -c '"+probe+"' 2>/dev/null"); out != "unreachable\n" {
		t.Errorf("another sandbox reached the proxy listener: %q", out)
	}
	if c, err := net.Dial("tcp", "127.0.0.1:3128"); err == nil {
		c.Close()
		// Something of the host's own may listen there; ours must not.
		t.Log("the host has a listener on 127.0.0.1:3128 (not the sandbox's)")
	}
}

// TrustPEM reaches the sandbox's trust bundle and the root's trust store,
// for the default root and for an image root, and the host's store is
// untouched.
func TestLinuxTrust(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-trust", TrustPEM: []byte(testPEM)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	out, stderr, _ := runIn(t, sb, "grep -c c2FuZGdhdGUgdGVzdA== "+sandbox.TrustBundle+" /etc/ssl/certs/ca-certificates.crt; grep -c 'BEGIN CERT' "+sandbox.TrustBundle)
	lines := strings.Fields(out)
	if len(lines) != 3 || !strings.HasSuffix(lines[0], ":1") || !strings.HasSuffix(lines[1], ":1") {
		t.Fatalf("trust in the default root: %q %q", out, stderr)
	}
	if lines[2] == "1" {
		t.Errorf("the bundle holds only the session CA, not the system roots")
	}
	if out, _, _ := runIn(t, sb, "echo x >> "+sandbox.TrustBundle+" 2>/dev/null || echo read-only"); out != "read-only\n" {
		t.Errorf("the default root's bundle is writable: %q", out)
	}

	base := busyboxLayer(t)
	img := &sandbox.Image{Name: "test/busybox", Layers: []string{base}, Env: []string{"PATH=/bin"}}
	isb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-trust-image", Image: img, TrustPEM: []byte(testPEM)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = isb.Destroy(context.Background()) })
	if out, stderr, _ := runIn(t, isb, "grep -c c2FuZGdhdGUgdGVzdA== "+sandbox.TrustBundle); out != "1\n" {
		t.Errorf("trust in an image root without a store: %q %q", out, stderr)
	}
}
