package egress

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestDialPublic(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello")
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	portStr := func(host string) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

	open, _ := newTestProxy(t, Config{
		AllowCIDRs: loopback,
		Resolver:   noDNS,
		Hosts: map[string][]netip.Addr{
			"svc.test":  {netip.MustParseAddr("127.0.0.1")},
			"meta.test": {netip.MustParseAddr("169.254.169.254")},
		},
	})
	closed, _ := newTestProxy(t, Config{
		Resolver: noDNS,
		Hosts: map[string][]netip.Addr{
			"svc.test":  {netip.MustParseAddr("127.0.0.1")},
			"meta.test": {netip.MustParseAddr("169.254.169.254")},
		},
	})
	for _, tc := range []struct {
		name    string
		p       *Proxy
		network string
		addr    string
		wantErr string // "" = dials and reads "hello"
	}{
		{"allowed CIDR literal", open, "tcp", portStr("127.0.0.1"), ""},
		{"allowed CIDR by name, case and trailing dot", open, "tcp", portStr("SVC.test."), ""},
		{"mapped IPv6 of an allowed address", open, "tcp", portStr("::ffff:127.0.0.1"), ""},
		{"loopback refused", closed, "tcp", portStr("127.0.0.1"), "private address 127.0.0.1"},
		{"name resolving to loopback refused", closed, "tcp", portStr("svc.test"), "svc.test:" + strconv.Itoa(port) + ": resolves to a private address"},
		{"metadata refused even with loopback allowed", open, "tcp", "meta.test:80", "dial meta.test:80: resolves to a private address"},
		{"metadata literal refused", closed, "tcp", "169.254.169.254:80", "private address 169.254.169.254"},
		{"mapped loopback refused", closed, "tcp", portStr("::ffff:127.0.0.1"), "private address 127.0.0.1"},
		{"private RFC 1918 refused", closed, "tcp", "10.1.2.3:443", "private address 10.1.2.3"},
		{"IPv6 loopback refused", closed, "tcp", "[::1]:443", "private address ::1"},
		{"unresolvable", closed, "tcp", "nowhere.test:80", "cannot resolve"},
		{"no port", closed, "tcp", "example.com", "missing port"},
		{"port zero", closed, "tcp", "example.com:0", "invalid port"},
		{"zone", closed, "tcp", "[fe80::1%eth0]:80", "invalid host"},
		{"bad name", closed, "tcp", "exa_mple.com:80", "invalid host"},
		{"udp", open, "udp", portStr("127.0.0.1"), "network not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.p.DialPublic(context.Background(), tc.network, tc.addr)
			if tc.wantErr != "" {
				if err == nil {
					_ = c.Close()
					t.Fatalf("DialPublic(%q) succeeded, want error %q", tc.addr, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DialPublic(%q) = %v, want error containing %q", tc.addr, err, tc.wantErr)
				}
				if strings.HasSuffix(tc.addr, ".test:80") || strings.Contains(tc.addr, ".test:") {
					if strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "169.254") {
						t.Fatalf("DialPublic(%q) = %v: shows the address the name resolved to", tc.addr, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("DialPublic(%q): %v", tc.addr, err)
			}
			defer c.Close()
			b, err := io.ReadAll(c)
			if err != nil || string(b) != "hello" {
				t.Fatalf("read %q, %v", b, err)
			}
		})
	}
}

// CheckPublic is DialPublic's rule without the dial.
func TestCheckPublic(t *testing.T) {
	hosts := map[string][]netip.Addr{"svc.test": {netip.MustParseAddr("127.0.0.1")}, "pub.test": {netip.MustParseAddr("93.184.216.34")}}
	open, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hosts})
	closed, _ := newTestProxy(t, Config{Hosts: hosts})
	for _, tc := range []struct {
		p       *Proxy
		addr    string
		wantErr string
	}{
		{open, "svc.test:80", ""},
		{closed, "pub.test:443", ""},
		{closed, "svc.test:80", "check svc.test:80: resolves to a private address"},
		{closed, "100.100.100.200:80", "check 100.100.100.200:80: private address 100.100.100.200"},
		{closed, "nowhere.test:80", "cannot resolve"},
		{closed, "example.com", "missing port"},
	} {
		err := tc.p.CheckPublic(context.Background(), tc.addr)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckPublic(%q) = %v; want %q", tc.addr, err, tc.wantErr)
		}
	}
}
