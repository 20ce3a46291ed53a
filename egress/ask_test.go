package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// sendConnect writes CONNECT target on a fresh connection; answer reads
// its response.
func sendConnect(t *testing.T, proxy *url.URL, target string) (answer func() (*http.Response, string)) {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: asker/1\r\n\r\n", target, target)
	return func() (*http.Response, string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatalf("CONNECT %s: %v", target, err)
		}
		var body string
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
		}
		return resp, body
	}
}

func waitPending(t *testing.T, s *Session, n int) []Pending {
	t.Helper()
	for range 1000 {
		if ps := s.Pending(); len(ps) == n {
			return ps
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pending %v, want %d", s.Pending(), n)
	return nil
}

func askPolicy(t *testing.T, allow ...string) Policy {
	t.Helper()
	b, err := ParseBounds([]string{"*.test"})
	if err != nil {
		t.Fatal(err)
	}
	return Policy{Allow: mustList(t, allow...), Ask: true, AskWithin: b}
}

// Parked connections are bounded per session (429) and on the gateway
// (503), each with a stable code; they count against the connection
// bounds while they wait; a decision lets one through or refuses it.
func TestAskBoundsAndDecisions(t *testing.T) {
	up := okTLSServer(t, "ok")
	port := serverPort(t, up.URL)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("ask.test"), MaxPending: 2, MaxPendingTotal: 3, AskTimeout: time.Minute})
	a, aURL := startSession(t, p, "a", askPolicy(t, "none.test"), nil)
	b, bURL := startSession(t, p, "b", askPolicy(t, "none.test"), nil)
	target := "ask.test:" + port
	first, second := sendConnect(t, aURL, target), sendConnect(t, aURL, target)
	ps := waitPending(t, a, 2)
	if ps[0].Host != "ask.test" || ps[0].Via != "proxy" || ps[0].UserAgent != "asker/1" || ps[0].Since.IsZero() {
		t.Errorf("pending %+v", ps[0])
	}
	if n := p.conns("tenant-a"); n != 2 {
		t.Errorf("the parked connections count %d against the tenant's bound, want 2", n)
	}
	resp, body := sendConnect(t, aURL, target)()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Sandgate-Code") != CodeAskPendingSession || !strings.Contains(body, "--egress-ask-max-pending") {
		t.Errorf("past the session's bound: %d %q %q", resp.StatusCode, resp.Header.Get("X-Sandgate-Code"), body)
	}
	third := sendConnect(t, bURL, target)
	waitPending(t, b, 1)
	resp, body = sendConnect(t, bURL, target)()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Sandgate-Code") != CodeAskPendingGateway {
		t.Errorf("past the gateway's bound: %d %q %q", resp.StatusCode, resp.Header.Get("X-Sandgate-Code"), body)
	}
	if !a.Decide(ps[0].ID, true, false) || !a.Decide(ps[1].ID, false, false) || a.Decide(ps[1].ID, true, false) {
		t.Error("Decide: want true, true, then false for a decided one")
	}
	// ps is oldest first, but either may have been sent first.
	codes := map[int]int{}
	for _, ans := range []func() (*http.Response, string){first, second} {
		resp, _ := ans()
		codes[resp.StatusCode]++
	}
	if codes[http.StatusOK] != 1 || codes[http.StatusForbidden] != 1 {
		t.Errorf("one allowed and one denied: %v", codes)
	}
	bs := b.Pending()
	b.Decide(bs[0].ID, false, false)
	if resp, body := third(); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "denied through the approvals API") {
		t.Errorf("denied: %d %q", resp.StatusCode, body)
	}
	if n := p.pending.Load(); n != 0 {
		t.Errorf("%d pending counted after every decision", n)
	}
}

// A timeout is a denial; hosts outside the operator's ceiling and hosts
// the session's deny list holds are refused without asking; a session
// not in ask mode never parks.
func TestAskTimeoutAndRefusals(t *testing.T) {
	up := okTLSServer(t, "ok")
	port := serverPort(t, up.URL)
	p, lb := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("ask.test", "denied.test"), AskTimeout: 200 * time.Millisecond})
	pol := askPolicy(t, "none.test")
	pol.Deny = mustList(t, "denied.test:"+port)
	s, u := startSession(t, p, "t", pol, nil)
	resp, body := sendConnect(t, u, "ask.test:"+port)()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "no decision within 200ms") {
		t.Errorf("timeout: %d %q", resp.StatusCode, body)
	}
	lb.waitFor(t, "kind=ask host=ask.test", "approval=timeout")
	for _, c := range []struct{ target, want string }{
		{"denied.test:" + port, "a remembered decision"},
		{"example.com:443", "outside what this gateway allows"},
	} {
		resp, body := sendConnect(t, u, c.target)()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %q, want 403 %q", c.target, resp.StatusCode, body, c.want)
		}
	}
	if n := len(s.Pending()); n != 0 || p.pending.Load() != 0 {
		t.Errorf("%d pending after refusals", n)
	}
	// Not in ask mode: refused at once.
	_, u2 := startSession(t, p, "deny", Policy{Allow: mustList(t, "none.test")}, nil)
	if resp, body := sendConnect(t, u2, "ask.test:"+port)(); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "not in this session's egress list") {
		t.Errorf("deny mode: %d %q", resp.StatusCode, body)
	}
}

// Closing the session ends a parked connection's wait at once, and gives
// its pending count back.
func TestAskSessionClose(t *testing.T) {
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("ask.test"), AskTimeout: time.Hour})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSession("t", "close", askPolicy(t, "none.test"), nil)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	sendConnect(t, &url.URL{Host: ln.Addr().String()}, "ask.test:443")
	waitPending(t, s, 1)
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a parked connection")
	}
	<-done
	if n := p.pending.Load(); n != 0 {
		t.Errorf("%d pending after Close", n)
	}
}

// The parked connections are bounded per tenant too (429
// ask_pending_tenant_limit): one tenant's sessions cannot take every
// place the gateway has, another tenant's session still parks.
func TestAskTenantBound(t *testing.T) {
	up := okTLSServer(t, "ok")
	port := serverPort(t, up.URL)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("ask.test"), MaxPending: 2, MaxPendingPerTenant: 3, MaxPendingTotal: 10, AskTimeout: time.Minute})
	a, aURL := startTenantSession(t, p, "one", "a", askPolicy(t, "none.test"), nil)
	b, bURL := startTenantSession(t, p, "one", "b", askPolicy(t, "none.test"), nil)
	c, cURL := startTenantSession(t, p, "two", "c", askPolicy(t, "none.test"), nil)
	target := "ask.test:" + port
	sendConnect(t, aURL, target)
	sendConnect(t, aURL, target)
	sendConnect(t, bURL, target)
	waitPending(t, a, 2)
	waitPending(t, b, 1)
	resp, body := sendConnect(t, bURL, target)()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Sandgate-Code") != CodeAskPendingTenant || !strings.Contains(body, "--egress-ask-max-pending-per-tenant") {
		t.Errorf("past the tenant's bound: %d %q %q", resp.StatusCode, resp.Header.Get("X-Sandgate-Code"), body)
	}
	sendConnect(t, cURL, target)
	waitPending(t, c, 1)
	for _, s := range []*Session{a, b, c} {
		for _, pd := range s.Pending() {
			s.Decide(pd.ID, false, false)
		}
	}
	p.tmu.Lock()
	left := len(p.pendingTenants)
	p.tmu.Unlock()
	if n := p.pending.Load(); n != 0 || left != 0 {
		t.Errorf("%d pending, %d tenants counted after every decision", n, left)
	}
}
