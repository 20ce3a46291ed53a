package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}

// logBuf collects the proxy's log lines.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor polls the log until it contains every one of subs.
func (l *logBuf) waitFor(t *testing.T, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := l.String()
		ok := true
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				ok = false
			}
		}
		if ok {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("log has no line with %q:\n%s", subs, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noDNS fails every lookup at once: tests never leave the machine.
var noDNS = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
	return nil, errors.New("no DNS in tests")
}}

// newTestProxy makes a Proxy logging into the returned buffer.
func newTestProxy(t testing.TB, cfg Config) (*Proxy, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if cfg.Resolver == nil {
		cfg.Resolver = noDNS
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, lb
}

// startSession serves a new session, of a tenant of its own, on a
// loopback listener until cleanup, and returns it with its proxy URL.
func startSession(t testing.TB, p *Proxy, id string, pol Policy, ca *CA) (*Session, *url.URL) {
	t.Helper()
	return startTenantSession(t, p, "tenant-"+id, id, pol, ca)
}

// startTenantSession is startSession for a session of tenant.
func startTenantSession(t testing.TB, p *Proxy, tenant, id string, pol Policy, ca *CA) (*Session, *url.URL) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSession(tenant, id, pol, ca)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return s, &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

func mustList(t testing.TB, entries ...string) List {
	t.Helper()
	l, err := ParseList(entries)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func serverPort(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

// proxyClient is an HTTP client using proxy, trusting roots for TLS.
func proxyClient(t *testing.T, proxy *url.URL, roots *x509.CertPool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		Proxy:             http.ProxyURL(proxy),
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: false,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func serverPool(ts *httptest.Server) *x509.CertPool {
	pool := x509.NewCertPool()
	if c := ts.Certificate(); c != nil {
		pool.AddCert(c)
	}
	return pool
}

// rawConnect sends CONNECT target on a fresh connection and returns the
// response and the connection (closed at cleanup).
func rawConnect(t *testing.T, proxy *url.URL, target string) (*http.Response, string, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	var body string
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	}
	c.SetDeadline(time.Time{})
	return resp, body, c, br
}

// get fetches rawURL through client and returns status and body.
func get(t *testing.T, client *http.Client, rawURL string) (int, string) {
	t.Helper()
	resp, err := client.Get(rawURL)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", rawURL, err)
	}
	return resp.StatusCode, string(b)
}

func okServer(t *testing.T, body string) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func okTLSServer(t *testing.T, body string) *httptest.Server {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func hostsFor(names ...string) map[string][]netip.Addr {
	m := make(map[string][]netip.Addr)
	for _, n := range names {
		m[n] = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	return m
}

func portOf(t testing.TB, hp string) uint16 {
	_, p, err := net.SplitHostPort(hp)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return uint16(n)
}
