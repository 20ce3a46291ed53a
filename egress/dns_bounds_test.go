package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The resolver's TCP connections count against the session's connection
// bound, as the proxy's do: a sandbox cannot hold open more descriptors
// of the gateway than MaxConns by opening connections to its resolver.
func TestResolverTCPConnsBounded(t *testing.T) {
	p, _ := newTestProxy(t, Config{MaxConns: 2, RefusalsPerSecond: 1 << 20})
	s, _ := startSession(t, p, "dnsconns", Policy{Allow: mustList(t, "pypi.test")}, nil)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.ServeDNS(pc, ln) }()
	addr := ln.Addr().String()
	// Two connections held open, each answered once.
	var held []*dns.Conn
	for range 2 {
		c, err := dns.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m := new(dns.Msg)
		m.SetQuestion("pypi.test.", dns.TypeA)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		if r, err := c.ReadMsg(); err != nil || len(r.Answer) != 1 {
			t.Fatalf("answer %v %v", r, err)
		}
		held = append(held, c)
	}
	// A third is refused and closed at once, not served.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("the third connection was not closed: %v (read %q)", err, b)
	}
	if !strings.Contains(string(b), "too many connections") {
		t.Errorf("the third connection got %q, want the bound's refusal", b)
	}
	// Once one ends, a new one is served.
	held[0].Close()
	var r *dns.Msg
	for range 100 {
		cl := &dns.Client{Net: "tcp", Timeout: 10 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion("pypi.test.", dns.TypeA)
		if r, _, err = cl.Exchange(m, addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("after one ended: %v %v", r, err)
	}
	s.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeDNS did not return after Close")
	}
}

// A sandbox asking refused names as fast as it can gets NXDOMAIN for each,
// but the log records them at the tenant's pace (after a burst), and the
// next recorded says how many were left out.
func TestResolverRefusedNamesPaced(t *testing.T) {
	p, _ := newTestProxy(t, Config{})
	s, _ := startSession(t, p, "dnsflood", Policy{Allow: mustList(t, "pypi.test")}, nil)
	var mu sync.Mutex
	var denied []Record
	s.OnRecord(func(r Record) {
		if r.Kind == "dns" {
			mu.Lock()
			denied = append(denied, r)
			mu.Unlock()
		}
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeDNS(pc, ln)
	defer s.Close()
	c, err := dns.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const asked = 100
	ask := func(i int) {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.other.test.", i), dns.TypeA)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		if r, err := c.ReadMsg(); err != nil || r.Rcode != dns.RcodeNameError {
			t.Fatalf("n%d: %v %v", i, r, err)
		}
	}
	for i := range asked {
		ask(i)
	}
	mu.Lock()
	n := len(denied)
	mu.Unlock()
	// Generous: the burst, and whatever refilled meanwhile on a loaded machine.
	if n >= asked/2 {
		t.Fatalf("%d of %d refused names recorded; want them paced (%d a second)", n, asked, RefusedNamesLoggedPerSecond)
	}
	// After the pace refills, the next one recorded counts the ones left out.
	time.Sleep(time.Second)
	ask(asked)
	mu.Lock()
	last := denied[len(denied)-1]
	mu.Unlock()
	if last.Host != fmt.Sprintf("n%d.other.test", asked) || !strings.Contains(last.Reason, "more refused names not recorded") {
		t.Errorf("the next recorded: %+v", last)
	}
}

// Past MaxNames, the new names a wildcard allows get SERVFAIL, recorded
// at the same pace as refused names.
func TestResolverFullNamesPaced(t *testing.T) {
	p, _ := newTestProxy(t, Config{})
	s, _ := startSession(t, p, "dnsfull", Policy{Allow: mustList(t, "*.wild.test")}, nil)
	var mu sync.Mutex
	var denied []Record
	s.OnRecord(func(r Record) {
		mu.Lock()
		denied = append(denied, r)
		mu.Unlock()
	})
	for i := range MaxNames {
		if _, err := s.names.addrFor(fmt.Sprintf("n%d.wild.test", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeDNS(pc, ln)
	defer s.Close()
	c, err := dns.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const asked = 100
	for i := range asked {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("new%d.wild.test.", i), dns.TypeA)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		if r, err := c.ReadMsg(); err != nil || r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("new%d: %v %v", i, r, err)
		}
	}
	mu.Lock()
	n := len(denied)
	mu.Unlock()
	if n >= asked/2 {
		t.Fatalf("%d of %d SERVFAIL names recorded; want them paced (%d a second)", n, asked, RefusedNamesLoggedPerSecond)
	}
}

// The names a tenant's sessions' resolvers remember are bounded in all
// (MaxNamesPerTenant), not only per session; a session's end gives its
// names back.
func TestResolverNamesPerTenantBounded(t *testing.T) {
	p, _ := newTestProxy(t, Config{})
	pol := Policy{Allow: mustList(t, "*.wild.test")}
	var full []*Session
	for i := range MaxNamesPerTenant / MaxNames {
		s, _ := startTenantSession(t, p, "acme", fmt.Sprintf("full%d", i), pol, nil)
		for j := range MaxNames {
			if _, err := s.addrFor(fmt.Sprintf("s%d-n%d.wild.test", i, j)); err != nil {
				t.Fatalf("session %d name %d: %v", i, j, err)
			}
		}
		full = append(full, s)
	}
	s, _ := startTenantSession(t, p, "acme", "last", pol, nil)
	if _, err := s.addrFor("one.wild.test"); !errors.Is(err, errNamesTenantFull) {
		t.Fatalf("past the tenant's names: %v", err)
	}
	// Another tenant is not held to acme's bound.
	o, _ := startTenantSession(t, p, "other", "other", pol, nil)
	if _, err := o.addrFor("one.wild.test"); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	// The resolver says SERVFAIL.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeDNS(pc, ln)
	c, err := dns.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("two.wild.test.", dns.TypeA)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ReadMsg(); err != nil || r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("past the tenant's names: %v %v", r, err)
	}
	full[0].Close()
	if _, err := s.addrFor("one.wild.test"); err != nil {
		t.Fatalf("after a session ended: %v", err)
	}
	s.Close()
	o.Close()
	for _, f := range full[1:] {
		f.Close()
	}
	p.nameCount.mu.Lock()
	defer p.nameCount.mu.Unlock()
	if p.nameCount.total != 0 || len(p.nameCount.tenant) != 0 {
		t.Errorf("after every session ended: %d names counted, %v", p.nameCount.total, p.nameCount.tenant)
	}
}
