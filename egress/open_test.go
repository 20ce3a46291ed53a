package egress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// OpenTo sees a tunnel from when it is established until it ends, and
// only for destinations the list given allows.
func TestOpenTo(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(io.Discard, c) // until the client goes (one Read would end at its first bytes)
			}()
		}
	}()
	port := portOf(t, up.Addr().String())
	p, _ := newTestProxy(t, Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, Hosts: hostsFor("git.test", "other.test")})
	target := fmt.Sprintf("git.test:%d", port)
	s, proxy := startSession(t, p, "open", Policy{Allow: mustList(t, target, "other.test")}, nil)
	git, other := mustList(t, target), mustList(t, "other.test", "git.test:1")
	waitOpen := func(l List, want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); s.OpenTo(l) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("OpenTo(%v) stays %v", l.Entries(), !want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if s.OpenTo(git) {
		t.Fatal("open before any tunnel")
	}
	resp, _, c, _ := rawConnect(t, proxy, target)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	c.Write([]byte("SSH-2.0-test\r\n")) // the client speaks first, as SSH's does
	waitOpen(git, true)
	if s.OpenTo(other) {
		t.Error("open to another destination")
	}
	c.Close()
	waitOpen(git, false)
}
