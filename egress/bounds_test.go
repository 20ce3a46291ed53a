package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fdCount counts the process's descriptors, and the pipes among them.
func fdCount(t *testing.T) (all, pipes int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
			pipes++
		}
	}
	return len(ents), pipes
}

// blackhole is a loopback listener that never accepts: connections to it
// complete in the kernel and then wait forever.
func blackhole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return strconv.Itoa(int(portOf(t, ln.Addr().String())))
}

// echoServer echoes every connection by read and write (not splice, so
// it holds no pipes of its own).
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf)
			})
		}
	})
	return strconv.Itoa(int(portOf(t, ln.Addr().String())))
}

// connectRaw sends CONNECT target and reads the answer's status line and
// body (for a refusal).
func connectRaw(proxy, target string) (net.Conn, *bufio.Reader, int, string, error) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, nil, 0, "", err
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, nil, 0, "", err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		return nil, nil, resp.StatusCode, string(b), nil
	}
	c.SetDeadline(time.Time{})
	return c, br, resp.StatusCode, "", nil
}

// TestEgressFloodStaysBounded is the load test of issue 34 item 1: one
// tenant's sessions open CONNECT tunnels by the hundred to a destination
// that never accepts. The proxy holds at most the tenant's bound of them
// (503 past it, naming the bound), its descriptors stay within what the
// bound allows (and no pipe while nothing moves), and another tenant is
// served all along.
func TestEgressFloodStaysBounded(t *testing.T) {
	const sessions, perSession = 8, 100
	hole, echo := blackhole(t), echoServer(t)
	// A short half-close grace: the test's closing its ends at the end
	// half-closes tunnels whose destination never answers.
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("hole.test", "echo.test"), HeaderTimeout: time.Minute,
		HalfCloseTimeout: 500 * time.Millisecond})
	pol := Policy{Allow: mustList(t, "hole.test:"+hole, "echo.test:"+echo)}
	var proxies []string
	for i := range sessions {
		_, u := startTenantSession(t, p, "flood", fmt.Sprintf("a%d", i), pol, nil)
		proxies = append(proxies, u.Host)
	}
	_, other := startTenantSession(t, p, "other", "b", pol, nil)
	baseFDs, basePipes := fdCount(t)

	var (
		mu      sync.Mutex
		open    []net.Conn // tunnels the proxy holds, and the test's end of them
		refused = map[string]int{}
		failed  []string
	)
	t.Cleanup(func() {
		for _, c := range open {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	for _, proxy := range proxies {
		for range perSession {
			wg.Go(func() {
				c, _, code, body, err := connectRaw(proxy, "hole.test:"+hole)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					failed = append(failed, err.Error())
				case code == http.StatusOK:
					open = append(open, c)
				case code == http.StatusServiceUnavailable:
					refused[strings.TrimSpace(body)]++
				default:
					failed = append(failed, fmt.Sprintf("%d %s", code, body))
				}
			})
		}
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d CONNECTs failed otherwise than by a 503, e.g. %s", len(failed), failed[0])
	}
	lim := p.Limits()
	if len(open) != lim.MaxConnsPerTenant {
		t.Errorf("%d tunnels open, want the tenant's bound %d", len(open), lim.MaxConnsPerTenant)
	}
	// Refusals name the tenant's bound, or the session's for a session
	// that reached its own first.
	wantMsg := fmt.Sprintf("sandgate egress: too many connections (at most %d per tenant, in all of its sessions; serve --egress-max-conns-per-tenant)", lim.MaxConnsPerTenant)
	sessMsg := fmt.Sprintf("sandgate egress: too many connections (at most %d per session; serve --egress-max-conns-per-session)", lim.MaxConns)
	if n := refused[wantMsg] + refused[sessMsg]; n != sessions*perSession-lim.MaxConnsPerTenant || refused[wantMsg] == 0 || len(refused) > 2 {
		t.Errorf("refusals %v; want %d, naming the tenant's bound", refused, sessions*perSession-lim.MaxConnsPerTenant)
	}
	fds, pipes := fdCount(t)
	proxyFDs := fds - baseFDs - len(open) // the test holds its end of each tunnel
	t.Logf("%d tunnels held, the proxy's descriptors: %d, pipes: %d (base %d)", len(open), proxyFDs, pipes, basePipes)
	if proxyFDs > lim.MaxConnsPerTenant*FDsPerConn {
		t.Errorf("the proxy holds %d descriptors for %d tunnels: more than %d each", proxyFDs, len(open), FDsPerConn)
	}
	if pipes > basePipes {
		t.Errorf("%d pipes open while no tunnel moves a byte (base %d)", pipes, basePipes)
	}
	// The other tenant is served meanwhile.
	c, br, code, body, err := connectRaw(other.Host, "echo.test:"+echo)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the other tenant's CONNECT: %v %d %s", err, code, body)
	}
	defer c.Close()
	io.WriteString(c, "ping")
	b := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "ping" {
		t.Errorf("the other tenant's tunnel: %q %v", b, err)
	}
	// Closing the flood gives the bound back.
	mu.Lock()
	for _, c := range open {
		c.Close()
	}
	open = nil
	mu.Unlock()
	waitFor(t, "the tenant's count back to 0", func() bool { return p.conns("flood") == 0 })
}

// TestEgressGatewayBound: the gateway-wide bound holds across tenants.
func TestEgressGatewayBound(t *testing.T) {
	hole := blackhole(t)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("hole.test"), MaxConnsTotal: 10, MaxConnsPerTenant: 6})
	pol := Policy{Allow: mustList(t, "hole.test:"+hole)}
	_, a := startTenantSession(t, p, "a", "a", pol, nil)
	_, b := startTenantSession(t, p, "b", "b", pol, nil)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	got := map[string]int{}
	for i := range 14 {
		proxy := a.Host
		if i%2 == 1 {
			proxy = b.Host
		}
		c, _, code, body, err := connectRaw(proxy, "hole.test:"+hole)
		if err != nil {
			t.Fatal(err)
		}
		if c != nil {
			conns = append(conns, c)
		}
		got[fmt.Sprint(code, " ", strings.TrimSpace(body))]++
	}
	want := map[string]int{
		"200 ": 10,
		"503 sandgate egress: too many connections (at most 10 on this gateway; serve --egress-max-conns); try again later": 4,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("answers %v, want %v", got, want)
	}
}

// A tunnel is reclaimed when it idles, and sooner once one side has
// closed and the other moves nothing.
func TestTunnelIdleAndHalfCloseReclaimed(t *testing.T) {
	// up holds every connection it accepts, reading nothing; with
	// closeWrite it half-closes each at once.
	upstream := func(t *testing.T, closeWrite bool) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var held []net.Conn
		t.Cleanup(func() {
			ln.Close()
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
		})
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if closeWrite {
					c.(*net.TCPConn).CloseWrite()
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
		return strconv.Itoa(int(portOf(t, ln.Addr().String())))
	}
	for _, c := range []struct {
		name           string
		upstreamCloses bool
		clientCloses   bool
		cfg            Config
	}{
		{"idle", false, false, Config{IdleTimeout: 300 * time.Millisecond, HalfCloseTimeout: time.Hour}},
		{"client half-closed", false, true, Config{IdleTimeout: time.Hour, HalfCloseTimeout: 300 * time.Millisecond}},
		{"upstream half-closed", true, false, Config{IdleTimeout: time.Hour, HalfCloseTimeout: 300 * time.Millisecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			port := upstream(t, c.upstreamCloses)
			cfg := c.cfg
			cfg.AllowCIDRs, cfg.Hosts = loopback, hostsFor("up.test")
			p, logs := newTestProxy(t, cfg)
			_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "up.test:"+port)}, nil)
			conn, br, code, body, err := connectRaw(proxy.Host, "up.test:"+port)
			if err != nil || code != http.StatusOK {
				t.Fatalf("CONNECT: %v %d %s", err, code, body)
			}
			defer conn.Close()
			io.WriteString(conn, "hello") // a first byte, past the TLS check
			if c.clientCloses {
				conn.(*net.TCPConn).CloseWrite()
			}
			// The proxy closes the tunnel: the client reads to EOF.
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Fatalf("the tunnel was not closed: %v", err)
			}
			logs.waitFor(t, "closed: ")
			waitFor(t, "the connection given back", func() bool { return p.conns("tenant-s1") == 0 })
		})
	}
}

// Closing a session (deleting it) closes its tunnels and their pipes at
// once, not at a garbage collection.
func TestCloseReleasesPipes(t *testing.T) {
	echo := echoServer(t)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("echo.test")})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSession("t", "s1", Policy{Allow: mustList(t, "echo.test:"+echo)}, nil)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	// Empty the standard library's pool of splice pipes (closed by
	// finalizers after two collections), as an idle gateway's would be.
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	_, basePipes := fdCount(t)
	const tunnels = 8
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range tunnels {
		c, br, code, body, err := connectRaw(ln.Addr().String(), "echo.test:"+echo)
		if err != nil || code != http.StatusOK {
			t.Fatalf("CONNECT: %v %d %s", err, code, body)
		}
		conns = append(conns, c)
		msg := strings.Repeat("x", 100<<10)
		go io.WriteString(c, msg)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(br, make([]byte, len(msg))); err != nil {
			t.Fatalf("echo: %v", err)
		}
	}
	_, pipes := fdCount(t)
	t.Logf("pipes: %d before, %d with %d busy tunnels", basePipes, pipes, tunnels)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, after := fdCount(t); after > basePipes {
		t.Errorf("%d pipes left open after Close (%d before the tunnels)", after, basePipes)
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("tunnel %d not closed: %v", i, err)
		}
	}
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The gateway-wide bound is derived from the descriptor limit, leaving
// three quarters of it to everything else; an explicit one that could
// take more than half is refused.
func TestLimitsFromNofile(t *testing.T) {
	for _, c := range []struct {
		nofile                 uint64
		set                    Config
		total, tenant, session int
		err                    string
	}{
		{nofile: 20000, total: 833, tenant: 256, session: 64},
		{nofile: 1024, total: 42, tenant: 42, session: 42},
		{nofile: 0, total: 42, tenant: 42, session: 42},
		{nofile: 1 << 20, total: 4096, tenant: 256, session: 64},
		{nofile: 20000, set: Config{MaxConnsTotal: 1000, MaxConnsPerTenant: 2000, MaxConns: 10}, total: 1000, tenant: 1000, session: 10},
		{nofile: 20000, set: Config{MaxConnsTotal: 2000}, err: "more than half the descriptor limit (20000)"},
	} {
		cfg := c.set
		err := cfg.setLimits(c.nofile)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("nofile %d, %+v: %v, want %q", c.nofile, c.set, err, c.err)
			}
			continue
		}
		if err != nil || cfg.MaxConnsTotal != c.total || cfg.MaxConnsPerTenant != c.tenant || cfg.MaxConns != c.session {
			t.Errorf("nofile %d: %d/%d/%d %v; want %d/%d/%d", c.nofile, cfg.MaxConnsTotal, cfg.MaxConnsPerTenant, cfg.MaxConns, err, c.total, c.tenant, c.session)
		}
		if cfg.IdleTimeout != DefaultIdleTimeout || cfg.HalfCloseTimeout != DefaultHalfCloseTimeout {
			t.Errorf("timeouts %v %v", cfg.IdleTimeout, cfg.HalfCloseTimeout)
		}
	}
}

// pipeListener hands out one end of a pipe per value sent on next,
// and net.ErrClosed once closed.
type pipeListener struct {
	next chan struct{}
	done chan struct{}
	once sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case <-l.next:
		a, b := net.Pipe()
		b.Close()
		return a, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// A connection accepted as its session closes is counted back exactly
// once: the counts return to 0, never below (a second release loosened
// every bound for good).
func TestAcceptRacingCloseReleasesOnce(t *testing.T) {
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback})
	check := func(t *testing.T, s *Session) {
		t.Helper()
		if total, active, tenant := p.total.Load(), s.active.Load(), p.conns("t"); total != 0 || active != 0 || tenant != 0 {
			t.Fatalf("after close: total %d, session %d, tenant %d; want 0, 0, 0", total, active, tenant)
		}
	}
	t.Run("accepted after close", func(t *testing.T) {
		s := p.NewSession("t", "s", Policy{}, nil)
		s.Close()
		l := &pipeListener{next: make(chan struct{}, 1), done: make(chan struct{})}
		l.next <- struct{}{}
		go func() {
			// Accept takes the connection, then sees the listener closed.
			for len(l.next) > 0 {
				time.Sleep(time.Millisecond)
			}
			l.Close()
		}()
		accepted := make(chan error, 1)
		go func() {
			c, err := (&limitListener{Listener: l, s: s}).Accept()
			if err == nil {
				c.Close()
			}
			accepted <- err
		}()
		select {
		case err := <-accepted:
			if err == nil {
				t.Fatal("Accept on a closed session returned a connection")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Accept on a closed session hangs")
		}
		check(t, s)
	})
	t.Run("dialled after close", func(t *testing.T) {
		s := p.NewSession("t", "s", Policy{}, nil)
		s.Close()
		port, _ := strconv.Atoi(blackhole(t))
		dialled := make(chan error, 1)
		go func() {
			c, _, err := s.dialCounted(t.Context(), "127.0.0.1", uint16(port))
			if err == nil {
				c.Close()
			}
			dialled <- err
		}()
		select {
		case err := <-dialled:
			if err == nil {
				t.Fatal("a closed session dialled")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("dialling for a closed session hangs")
		}
	})
	t.Run("race", func(t *testing.T) {
		var negative atomic.Int64
		stop := make(chan struct{})
		var watch sync.WaitGroup
		watch.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if v := p.total.Load(); v < negative.Load() {
					negative.Store(v)
				}
				runtime.Gosched()
			}
		})
		defer func() { close(stop); watch.Wait() }()
		for i := range 50 {
			s := p.NewSession("t", fmt.Sprint("s", i), Policy{}, nil)
			l := &pipeListener{next: make(chan struct{}, 8), done: make(chan struct{})}
			served := make(chan struct{})
			go func() { defer close(served); s.Serve(l) }()
			for range 8 {
				l.next <- struct{}{}
			}
			if i%2 == 0 {
				runtime.Gosched()
			}
			s.Close()
			l.Close()
			select {
			case <-served:
			case <-time.After(20 * time.Second):
				t.Fatal("Serve hangs after Close")
			}
			check(t, s)
		}
		if v := negative.Load(); v < 0 {
			t.Fatalf("the gateway-wide count went down to %d", v)
		}
	})
}
