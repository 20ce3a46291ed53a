package egress

import (
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The resolver answers the session's names from NamePrefix, the same
// address each time, AAAA with nothing, other names NXDOMAIN (logged as a
// denial), over UDP and TCP; closing the session ends it and its TCP
// connections.
func TestResolver(t *testing.T) {
	p, logs := newTestProxy(t, Config{})
	s, _ := startSession(t, p, "dns", Policy{Allow: mustList(t, "pypi.test", "*.wild.test:22")}, nil)
	var denied []Record
	recs := make(chan Record, 16)
	s.OnRecord(func(r Record) { recs <- r })
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
	ask := func(net_, addr, name string, qtype uint16) *dns.Msg {
		t.Helper()
		c := &dns.Client{Net: net_, Timeout: 10 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		var r *dns.Msg
		var err error
		for range 50 { // the servers start in their goroutines
			if r, _, err = c.Exchange(m, addr); err == nil {
				return r
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s %s: %v", net_, name, err)
		return nil
	}
	udp, tcp := pc.LocalAddr().String(), ln.Addr().String()
	a := ask("udp", udp, "PyPI.test", dns.TypeA)
	if a.Rcode != dns.RcodeSuccess || len(a.Answer) != 1 || a.Answer[0].(*dns.A).A.String() != "198.18.1.0" {
		t.Fatalf("pypi.test: %v", a)
	}
	if b := ask("tcp", tcp, "pypi.test", dns.TypeA); len(b.Answer) != 1 || b.Answer[0].(*dns.A).A.String() != "198.18.1.0" {
		t.Errorf("pypi.test again, over TCP: %v", b)
	}
	if w := ask("udp", udp, "x.wild.test", dns.TypeA); len(w.Answer) != 1 || w.Answer[0].(*dns.A).A.String() != "198.18.1.1" {
		t.Errorf("x.wild.test: %v", w)
	}
	if six := ask("udp", udp, "pypi.test", dns.TypeAAAA); six.Rcode != dns.RcodeSuccess || len(six.Answer) != 0 {
		t.Errorf("AAAA: %v", six)
	}
	for _, name := range []string{"other.test", "wild.test", "127.0.0.1"} {
		if r := ask("udp", udp, name, dns.TypeA); r.Rcode != dns.RcodeNameError {
			t.Errorf("%s: rcode %d, want NXDOMAIN", name, r.Rcode)
		}
	}
	for len(denied) < 3 {
		select {
		case r := <-recs:
			if r.Kind == "dns" && !r.Allowed {
				denied = append(denied, r)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("denials recorded: %+v", denied)
		}
	}
	if denied[0].Host != "other.test" || denied[0].Reason != "not in this session's egress list" {
		t.Errorf("denial %+v", denied[0])
	}
	logs.waitFor(t, "kind=dns host=other.test")
	// An open TCP connection ends with the session.
	c, err := net.Dial("tcp", tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("ServeDNS: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeDNS did not return after Close")
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a TCP connection outlived the session")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("a TCP connection outlived the session (read timed out)")
	}
}
