package egress

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestHTTPAbsoluteURIAllowed(t *testing.T) {
	var gotURI, gotHost, gotProxyAuth string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotURI, gotHost, gotProxyAuth = r.RequestURI, r.Host, r.Header.Get("Proxy-Authorization")
		io.WriteString(w, "hello")
	}))
	t.Cleanup(ts.Close)
	port := serverPort(t, ts.URL)
	p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("pypi.test")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "pypi.test:"+port)}, nil)

	req, _ := http.NewRequest(http.MethodGet, "http://PyPI.test:"+port+"/simple/?q=1", nil)
	req.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
	resp, err := proxyClient(t, proxy, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello" {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
	if gotURI != "/simple/?q=1" {
		t.Errorf("upstream request line URI %q, want origin form", gotURI)
	}
	if gotHost != "pypi.test:"+port {
		t.Errorf("upstream Host %q", gotHost)
	}
	if gotProxyAuth != "" {
		t.Error("Proxy-Authorization reached upstream")
	}
	logs.waitFor(t, `msg=egress`, `session=s1`, `kind=http`, `host=pypi.test`, `port=`+port, `ip=127.0.0.1`, `allowed=true`, `bytesIn=5`, `durationMs=`)
}

func TestConnectTLSAllowed(t *testing.T) {
	ts := okTLSServer(t, "tls hello")
	port := serverPort(t, ts.URL)
	p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "example.com:"+port)}, nil)
	client := proxyClient(t, proxy, serverPool(ts))
	code, body := get(t, client, "https://example.com:"+port+"/")
	if code != 200 || body != "tls hello" {
		t.Fatalf("got %d %q", code, body)
	}
	client.CloseIdleConnections()
	logs.waitFor(t, `kind=connect`, `host=example.com`, `allowed=true`)
}

func TestDenied(t *testing.T) {
	ts := okServer(t, "ok")
	port := serverPort(t, ts.URL)
	other := okServer(t, "ok")
	otherPort := serverPort(t, other.URL)
	p, _ := newTestProxy(t, Config{
		AllowCIDRs: loopback,
		Hosts:      hostsFor("pypi.test", "files.hosted.test", "hosted.test", "evil.test"),
	})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "pypi.test:"+port, "*.hosted.test:"+port)}, nil)

	tests := []struct {
		name   string
		target string
		code   int
		body   string
	}{
		{"allowed", "pypi.test:" + port, 200, ""},
		{"wildcard subdomain", "files.hosted.test:" + port, 200, ""},
		{"outside the list", "evil.test:" + port, 403, "sandgate egress: evil.test:" + port + " denied: not in this session's egress list\n"},
		{"wildcard apex", "hosted.test:" + port, 403, "sandgate egress: hosted.test:" + port + " denied: not in this session's egress list\n"},
		{"port mismatch", "pypi.test:" + otherPort, 403, "sandgate egress: pypi.test:" + otherPort + " denied: not in this session's egress list\n"},
		{"default ports only", "pypi.test:443", 403, "sandgate egress: pypi.test:443 denied: not in this session's egress list\n"},
		{"bad target", "pypi.test", 400, ""},
	}
	for _, tt := range tests {
		t.Run("CONNECT "+tt.name, func(t *testing.T) {
			resp, body, _, _ := rawConnect(t, proxy, tt.target)
			if resp.StatusCode != tt.code {
				t.Fatalf("status %d (%q), want %d", resp.StatusCode, body, tt.code)
			}
			if tt.body != "" && body != tt.body {
				t.Errorf("body %q, want %q", body, tt.body)
			}
		})
		if tt.name == "bad target" {
			continue
		}
		t.Run("GET "+tt.name, func(t *testing.T) {
			code, body := get(t, proxyClient(t, proxy, nil), "http://"+tt.target+"/")
			if code != tt.code {
				t.Fatalf("status %d (%q), want %d", code, body, tt.code)
			}
			if tt.body != "" && body != tt.body {
				t.Errorf("body %q, want %q", body, tt.body)
			}
		})
	}
	t.Run("origin-form request", func(t *testing.T) {
		resp, err := http.Get(proxy.String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || strings.Count(string(b), "\n") != 1 || !strings.HasPrefix(string(b), "sandgate egress: not a proxy request") {
			t.Errorf("got %d %q", resp.StatusCode, b)
		}
	})
}

func TestAddressRule(t *testing.T) {
	ts := okServer(t, "ok")
	port := serverPort(t, ts.URL)
	p, logs := newTestProxy(t, Config{Hosts: map[string][]netip.Addr{
		"pypi.test":   {netip.MustParseAddr("127.0.0.1")},
		"mapped.test": {netip.MustParseAddr("::ffff:127.0.0.1")},
		"meta.test":   {netip.MustParseAddr("169.254.169.254")},
		"mixed.test":  {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::1")},
	}})
	allow := mustList(t, "pypi.test:"+port, "mapped.test:"+port, "meta.test", "169.254.169.254", "[::ffff:127.0.0.1]:"+port,
		"127.0.0.1:"+port, "mixed.test", "nowhere.invalid", "[::1]:"+port, "0.0.0.0:"+port)
	_, proxy := startSession(t, p, "s1", Policy{Allow: allow}, nil)
	tests := []struct {
		target string
		code   int
		body   string
		hidden string // the address a name resolved to, never shown
	}{
		{"pypi.test:" + port, 403, "pypi.test:" + port + " denied: resolves to a private address", "127.0.0.1"},
		{"mapped.test:" + port, 403, "denied: resolves to a private address", "127.0.0.1"},
		{"[::ffff:127.0.0.1]:" + port, 403, "denied: private address 127.0.0.1", ""},
		{"127.0.0.1:" + port, 403, "denied: private address 127.0.0.1", ""},
		{"[::1]:" + port, 403, "denied: private address ::1", ""},
		{"0.0.0.0:" + port, 403, "denied: private address 0.0.0.0", ""},
		{"meta.test:80", 403, "denied: resolves to a private address", "169.254"},
		{"169.254.169.254:80", 403, "denied: private address 169.254.169.254", ""},
		{"mixed.test:443", 403, "denied: resolves to a private address", "10.1.2.3"},
		{"nowhere.invalid:443", 502, "nowhere.invalid:443: cannot resolve", ""},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			resp, body, _, _ := rawConnect(t, proxy, tt.target)
			if resp.StatusCode != tt.code || !strings.Contains(body, tt.body) || strings.Count(body, "\n") != 1 {
				t.Errorf("got %d %q, want %d with %q", resp.StatusCode, body, tt.code, tt.body)
			}
			if tt.hidden != "" && strings.Contains(body, tt.hidden) {
				t.Errorf("%q shows the address the name resolved to", body)
			}
			code, body := get(t, proxyClient(t, proxy, nil), "http://"+tt.target+"/")
			if code != tt.code || !strings.Contains(body, tt.body) || strings.Count(body, "\n") != 1 {
				t.Errorf("GET: got %d %q, want %d with %q", code, body, tt.code, tt.body)
			}
			if tt.hidden != "" && strings.Contains(body, tt.hidden) {
				t.Errorf("GET: %q shows the address the name resolved to", body)
			}
		})
	}
	logs.waitFor(t, `host=169.254.169.254`, `allowed=false`, `reason="private address 169.254.169.254"`)
	// The operator's log has the address a name was refused at.
	logs.waitFor(t, `host=meta.test port=80 ip=169.254.169.254 allowed=false reason="resolves to a private address"`)

	// The same target is fine once the operator opens the range.
	p2, _ := newTestProxy(t, Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("::ffff:127.0.0.0/104")}, Hosts: hostsFor("pypi.test")})
	_, proxy2 := startSession(t, p2, "s2", Policy{Allow: allow}, nil)
	if resp, body, _, _ := rawConnect(t, proxy2, "pypi.test:"+port); resp.StatusCode != 200 {
		t.Errorf("with AllowCIDRs: %d %q", resp.StatusCode, body)
	}
}

func TestAddrAllowed(t *testing.T) {
	p, _ := newTestProxy(t, Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}})
	own := netip.Addr{}
	for a := range p.own {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			own = a
		}
	}
	tests := []struct {
		addr string
		want bool
	}{
		{"8.8.8.8", true}, {"2606:4700::1111", true}, {"::ffff:8.8.8.8", true},
		{"10.9.1.1", true}, {"::ffff:10.9.1.1", true},
		{"127.0.0.1", false}, {"127.1.2.3", false}, {"::1", false}, {"::", false}, {"0.0.0.0", false},
		{"0.1.2.3", false}, {"10.0.0.1", false}, {"172.16.0.1", false}, {"172.31.255.255", false}, {"192.168.1.1", false},
		{"169.254.169.254", false}, {"fe80::1", false}, {"100.64.0.1", false}, {"100.127.255.255", false},
		{"fc00::1", false}, {"fd12::1", false}, {"224.0.0.1", false}, {"ff02::1", false}, {"255.255.255.255", false},
		{"240.0.0.1", false}, {"192.0.0.8", false}, {"198.18.0.1", false}, {"198.19.255.255", false},
		{"::ffff:127.0.0.1", false}, {"::ffff:169.254.169.254", false}, {"::ffff:10.0.0.1", false}, {"::127.0.0.1", false},
	}
	for _, tt := range tests {
		if got := p.addrAllowed(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("addrAllowed(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
	if own.IsValid() && p.addrAllowed(own) && !netip.MustParsePrefix("10.9.0.0/16").Contains(own) {
		t.Errorf("the gateway's own address %s is allowed", own)
	}
}

func TestSNIMismatchCloses(t *testing.T) {
	ts := okTLSServer(t, "ok")
	port := serverPort(t, ts.URL)
	p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "example.com:"+port, "127.0.0.1:"+port)}, nil)

	tests := []struct {
		name, target, sni string
		ok                bool
		reason            string
	}{
		{"matching", "example.com:" + port, "EXAMPLE.com", true, ""},
		{"mismatch", "example.com:" + port, "other.example.com", false, `reason="SNI other.example.com does not match CONNECT host"`},
		{"ip literal, sni not allowed", "127.0.0.1:" + port, "other.example.com", false, `reason="SNI other.example.com is not in this session's egress list"`},
		{"ip literal, sni allowed", "127.0.0.1:" + port, "example.com", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body, c, _ := rawConnect(t, proxy, tt.target)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %d %q", resp.StatusCode, body)
			}
			tc := tls.Client(c, &tls.Config{ServerName: tt.sni, RootCAs: serverPool(ts)})
			tc.SetDeadline(time.Now().Add(10 * time.Second))
			err := tc.Handshake()
			if tt.ok != (err == nil) {
				t.Fatalf("handshake: %v, want ok=%v", err, tt.ok)
			}
			if !tt.ok {
				logs.waitFor(t, tt.reason, "allowed=false")
			}
		})
	}
}

func TestNonTLSTunnelPassesThrough(t *testing.T) {
	// A server-speaks-first protocol (like SSH) must not wait for the
	// client's first bytes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "SSH-2.0-test\r\n")
		io.Copy(c, c) // echo
	}()
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, HeaderTimeout: 5 * time.Second, Hosts: hostsFor("git.test")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "git.test:"+fmt.Sprint(portOf(t, ln.Addr().String())))}, nil)
	resp, body, c, br := rawConnect(t, proxy, "git.test:"+fmt.Sprint(portOf(t, ln.Addr().String())))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d %q", resp.StatusCode, body)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second)) // well before HeaderTimeout
	line, err := br.ReadString('\n')
	if err != nil || line != "SSH-2.0-test\r\n" {
		t.Fatalf("banner %q, %v", line, err)
	}
	io.WriteString(c, "ping")
	c.(*net.TCPConn).CloseWrite()
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "ping" {
		t.Fatalf("echo %q, %v", rest, err)
	}
}

func TestSetPolicy(t *testing.T) {
	ts := okServer(t, "ok")
	port := serverPort(t, ts.URL)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("a.test", "b.test")})
	s, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "a.test:"+port)}, nil)
	client := proxyClient(t, proxy, nil)
	check := func(host string, want int) {
		t.Helper()
		if code, body := get(t, client, "http://"+host+":"+port+"/"); code != want {
			t.Errorf("%s: %d %q, want %d", host, code, body, want)
		}
		if resp, body, _, _ := rawConnect(t, proxy, host+":"+port); resp.StatusCode != want {
			t.Errorf("CONNECT %s: %d %q, want %d", host, resp.StatusCode, body, want)
		}
	}
	check("a.test", 200)
	check("b.test", 403)
	s.SetPolicy(Policy{Allow: mustList(t, "b.test:"+port)})
	if got := s.Policy().Allow.Entries(); len(got) != 1 || got[0] != "b.test:"+port {
		t.Errorf("Policy() = %q", got)
	}
	check("a.test", 403) // the same keep-alive connection: the next request is checked
	check("b.test", 200)
	s.SetPolicy(Policy{})
	check("b.test", 403)
}

func TestMaxHeaderBytes(t *testing.T) {
	p, _ := newTestProxy(t, Config{MaxHeaderBytes: 4 << 10})
	_, proxy := startSession(t, p, "s1", Policy{}, nil)
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go fmt.Fprintf(c, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-Big: %s\r\n\r\n", strings.Repeat("x", 64<<10))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 431 ") {
		t.Fatalf("got %q", b)
	}
}

func TestSlowHeadersClosed(t *testing.T) {
	p, _ := newTestProxy(t, Config{HeaderTimeout: 300 * time.Millisecond})
	_, proxy := startSession(t, p, "s1", Policy{}, nil)
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetDeadline(start.Add(10 * time.Second))
	io.WriteString(c, "GET http://a.test/ HTTP/1.1\r\nHost: a")
	// Trickle: each byte arrives before a read deadline would pass, but the
	// headers never end.
	go func() {
		for range 50 {
			if _, err := c.Write([]byte("a")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	io.ReadAll(c)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v, want about the header timeout", d)
	}
}

// A ClientHello that starts but never ends is cut off after HeaderTimeout:
// a slow client does not get past the SNI check.
func TestSlowClientHelloClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- int(n)
	}()
	port := fmt.Sprint(portOf(t, ln.Addr().String()))
	p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, HeaderTimeout: 300 * time.Millisecond, Hosts: hostsFor("a.test")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "a.test:"+port)}, nil)
	resp, body, c, _ := rawConnect(t, proxy, "a.test:"+port)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d %q", resp.StatusCode, body)
	}
	time.Sleep(500 * time.Millisecond) // idle before the first byte is fine
	start := time.Now()
	c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00}) // a record header, then nothing
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("not closed: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("closed after %v", d)
	}
	if n := <-got; n != 0 {
		t.Errorf("upstream got %d bytes of the unchecked ClientHello", n)
	}
	logs.waitFor(t, "allowed=false", "incomplete TLS ClientHello")
}

// A session's record (the tenant's audit) of a name refused by the
// address rule has no address; one of a literal keeps it, as the tenant
// gave it.
func TestRecordHidesRefusedAddress(t *testing.T) {
	p, logs := newTestProxy(t, Config{Hosts: map[string][]netip.Addr{"db.test": {netip.MustParseAddr("10.1.2.3")}}})
	s, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "db.test", "10.1.2.3")}, nil)
	recs := make(chan Record, 2)
	s.OnRecord(func(r Record) { recs <- r })
	for _, target := range []string{"db.test:443", "10.1.2.3:443"} {
		resp, body, _, _ := rawConnect(t, proxy, target)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%s: %d %q", target, resp.StatusCode, body)
		}
		select {
		case r := <-recs:
			want := ""
			if target == "10.1.2.3:443" {
				want = "10.1.2.3"
			}
			if r.Allowed || r.IP != want || strings.Contains(r.Reason, "10.1.2.3") != (want != "") {
				t.Errorf("%s: record %+v; want IP %q and the address in the reason only for the literal", target, r, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no record", target)
		}
	}
	logs.waitFor(t, `host=db.test port=443 ip=10.1.2.3 allowed=false`)
}
