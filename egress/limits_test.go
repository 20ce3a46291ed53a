package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// bulkServer serves GET /?n=N with N bytes and counts POSTed bytes.
func bulkServer(t testing.TB, tlsOn bool) *httptest.Server {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, n)
			return
		}
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.CopyN(w, zeros{}, n)
	})
	var ts *httptest.Server
	if tlsOn {
		ts = httptest.NewTLSServer(h)
	} else {
		ts = httptest.NewServer(h)
	}
	t.Cleanup(ts.Close)
	return ts
}

func TestByteCounts(t *testing.T) {
	const size = 10 << 20
	const slop = 256 << 10 // headers, TLS records
	for _, tlsOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tlsOn), func(t *testing.T) {
			ts := bulkServer(t, tlsOn)
			port := serverPort(t, ts.URL)
			p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com")})
			s, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "example.com:"+port)}, nil)
			s.AddBytes(1000, 2000) // restored totals
			scheme := "http"
			if tlsOn {
				scheme = "https"
			}
			client := proxyClient(t, proxy, serverPool(ts))
			base := scheme + "://example.com:" + port + "/"
			code, body := get(t, client, base+"?n="+strconv.Itoa(size))
			if code != 200 || len(body) != size {
				t.Fatalf("download: %d, %d bytes", code, len(body))
			}
			resp, err := client.Post(base, "application/octet-stream", io.LimitReader(zeros{}, size))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != strconv.Itoa(size) {
				t.Fatalf("upload: upstream got %s bytes", b)
			}
			client.CloseIdleConnections()
			// Tunnels count as they go; wait for the tunnel to end.
			logs.waitFor(t, "bytesOut=")
			deadline := time.Now().Add(5 * time.Second)
			for {
				in, out := s.Bytes()
				inOK := in >= 1000+size && in <= 1000+size+slop
				outOK := out >= 2000+size && out <= 2000+size+slop
				if inOK && outOK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("Bytes() = in %d, out %d; want about %d each (+ restored)", in, out, size)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// The totals move while a long download is still going.
func TestByteCountsLive(t *testing.T) {
	ts := bulkServer(t, true)
	port := serverPort(t, ts.URL)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com")})
	s, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "example.com:"+port)}, nil)
	resp, err := proxyClient(t, proxy, serverPool(ts)).Get("https://example.com:" + port + "/?n=" + strconv.Itoa(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.CopyN(io.Discard, resp.Body, 8<<20); err != nil {
		t.Fatal(err)
	}
	// The proxy is at most a socket buffer or so ahead of the client and
	// at most a chunk behind in its count.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if in, _ := s.Bytes(); in >= 6<<20 {
			break
		}
		if time.Now().After(deadline) {
			in, _ := s.Bytes()
			t.Fatalf("after 8 MiB read, Bytes() in = %d", in)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMaxConns(t *testing.T) {
	ts := okServer(t, "ok")
	port := serverPort(t, ts.URL)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("a.test"), HeaderTimeout: time.Minute})
	pol := Policy{Allow: mustList(t, "a.test:"+port)}
	_, proxyA := startSession(t, p, "a", pol, nil)
	_, proxyB := startSession(t, p, "b", pol, nil)

	const total, max = 1000, DefaultMaxConns
	conns := make([]net.Conn, 0, total)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range total {
		c, err := net.Dial("tcp", proxyA.Host)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// The extras are answered promptly, the first max wait for headers.
	var mu sync.Mutex
	refused := 0
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			b, _ := io.ReadAll(c)
			if strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
				if !strings.HasSuffix(string(b), "\r\n\r\nsandgate egress: too many connections (at most 64 per session; serve --egress-max-conns-per-session)\n") {
					t.Errorf("503 answer %q", b)
				}
				mu.Lock()
				refused++
				mu.Unlock()
			}
		})
	}
	// Meanwhile session b serves, and so does a once a slot is free.
	if code, body := get(t, proxyClient(t, proxyB, nil), "http://a.test:"+port+"/"); code != 200 {
		t.Errorf("session b: %d %q", code, body)
	}
	wg.Wait()
	if refused != total-max {
		t.Errorf("%d connections refused, want %d", refused, total-max)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
	conns[0].Close()
	time.Sleep(100 * time.Millisecond)
	if code, body := get(t, proxyClient(t, proxyA, nil), "http://a.test:"+port+"/"); code != 200 {
		t.Errorf("session a after a slot freed: %d %q", code, body)
	}
}

// Close ends every connection and goroutine of the session: idle and
// busy tunnels, intercepted connections, half-sent requests, keep-alive
// connections.
func TestCloseLeavesNothing(t *testing.T) {
	bulk := bulkServer(t, true)
	port := serverPort(t, bulk.URL)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var echoWG sync.WaitGroup
	defer func() {
		echo.Close()
		echoWG.Wait()
	}()
	echoWG.Go(func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			echoWG.Go(func() {
				defer c.Close()
				io.Copy(c, c)
			})
		}
	})
	ignore := goleak.IgnoreCurrent()

	ca, err := NewCA("s1")
	if err != nil {
		t.Fatal(err)
	}
	echoPort := strconv.Itoa(int(portOf(t, echo.Addr().String())))
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com", "echo.test", "bound.example.com"), UpstreamRoots: serverPool(bulk)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSession("t1", "s1", Policy{
		Allow: mustList(t, "example.com:"+port, "echo.test:"+echoPort, "bound.example.com:"+port),
		Secrets: []Secret{{Name: "T", Hosts: mustList(t, "bound.example.com:"+port), Header: "Authorization",
			Value: func() (string, bool) { return "v", true }}},
	}, ca)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	proxy := "127.0.0.1:" + strconv.Itoa(int(portOf(t, ln.Addr().String())))

	var clientConns []net.Conn
	defer func() {
		for _, c := range clientConns {
			c.Close()
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", proxy)
		if err != nil {
			t.Fatal(err)
		}
		clientConns = append(clientConns, c)
		return c
	}
	connect := func(target string) (net.Conn, *bufio.Reader) {
		c := dial()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT %s: %v %v", target, resp, err)
		}
		return c, br
	}
	// An idle tunnel (no client bytes yet: still peeking).
	connect("echo.test:" + echoPort)
	// An established echo tunnel.
	c, br := connect("echo.test:" + echoPort)
	io.WriteString(c, "x")
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		t.Fatalf("echo: %v", err)
	}
	// A busy TLS download, stalled by a client that stopped reading.
	c, _ = connect("example.com:" + port)
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: serverPool(bulk)})
	fmt.Fprintf(tc, "GET /?n=%d HTTP/1.1\r\nHost: example.com\r\n\r\n", 1<<30)
	tc.Read(make([]byte, 1))
	// An intercepted connection, idle after a request.
	c, _ = connect("bound.example.com:" + port)
	pool := caPool(t, ca)
	itc := tls.Client(c, &tls.Config{ServerName: "bound.example.com", RootCAs: pool})
	fmt.Fprintf(itc, "GET /?n=10 HTTP/1.1\r\nHost: bound.example.com:%s\r\n\r\n", port)
	if resp, err := http.ReadResponse(bufio.NewReader(itc), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("intercepted: %v %v", resp, err)
	}
	// A half-sent request and an idle keep-alive connection.
	io.WriteString(dial(), "GET http://example.com:"+port+"/ HTTP/1.1\r\n")
	ka := dial()
	fmt.Fprintf(ka, "GET http://example.com:%s/?n=3 HTTP/1.1\r\nHost: example.com\r\n\r\n", port)
	http.ReadResponse(bufio.NewReader(ka), nil)
	// Plain HTTP on a real TLS server fails; no matter. Give everything a
	// moment to settle into its steady state.
	time.Sleep(100 * time.Millisecond)

	done := make(chan struct{})
	go func() {
		s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Every client connection was closed by the proxy.
	for i, c := range clientConns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("client connection %d not closed: %v", i, err)
		}
	}
	bulk.CloseClientConnections()
	goleak.VerifyNone(t, ignore)
}

// TestMeasureTunnel compares a 1 GiB download through a CONNECT tunnel
// with a direct one from the same loopback server. Set SANDGATE_MEASURE=1.
func TestMeasureTunnel(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1")
	}
	const size = 1 << 30
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
			go func() {
				defer c.Close()
				buf := make([]byte, 1<<20)
				for sent := 0; sent < size; sent += len(buf) {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	port := strconv.Itoa(int(portOf(t, ln.Addr().String())))
	read := func(c net.Conn, r io.Reader) float64 {
		start := time.Now()
		n, err := io.Copy(io.Discard, r)
		if err != nil || n != size {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		c.Close()
		return float64(size) / time.Since(start).Seconds() / 1e6
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	direct := read(c, c)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("bulk.test"), HeaderTimeout: 50 * time.Millisecond})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "bulk.test:"+port)}, nil)
	_, _, tc, br := rawConnect(t, proxy, "bulk.test:"+port)
	tunneled := read(tc, br)
	t.Logf("direct %.0f MB/s, tunnel %.0f MB/s, ratio %.2f", direct, tunneled, tunneled/direct)
}
