package egress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawUpstream serves each connection with serve on a loopback listener
// until cleanup, and returns its port and a channel that gets a value as
// each serve returns.
func rawUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	served := make(chan struct{}, 16)
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
				serve(c, bufio.NewReader(c))
				served <- struct{}{}
			})
		}
	})
	return strconv.Itoa(int(portOf(t, ln.Addr().String()))), served
}

// readHead reads a request's head.
func readHead(br *bufio.Reader) {
	for {
		l, err := br.ReadString('\n')
		if err != nil || l == "\r\n" {
			return
		}
	}
}

// A plain http:// exchange in which no byte moves either way for the idle
// timeout is closed, as a CONNECT tunnel is: an upstream that never
// answers (504), one that stops mid-body, a sandbox that stops sending
// its body. The upstream connection is closed; the sandbox's too where
// its exchange cannot go on (a body cut short, or not read). One whose
// bytes keep moving, however slowly, is not closed; and every connection
// is given back.
func TestPlainHTTPStallReclaimed(t *testing.T) {
	const idle = 300 * time.Millisecond
	hold := func(c net.Conn, br *bufio.Reader) { readHead(br); io.Copy(io.Discard, br) }
	for _, tc := range []struct {
		name     string
		upstream func(c net.Conn, br *bufio.Reader)
		request  string // after the request line and Host
		// status is the answer's (0: the connection ends with none or a
		// cut body); body, when set, is what the answer's body must be.
		status int
		body   string
		closed bool // the log says the watchdog closed it
		// ends: the sandbox's connection ends too.
		ends bool
	}{
		{name: "upstream never answers", upstream: hold, request: "\r\n", status: http.StatusGatewayTimeout, closed: true},
		{name: "upstream stops mid-body", upstream: func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
			io.Copy(io.Discard, br)
		}, request: "\r\n", closed: true, ends: true},
		{name: "sandbox stops sending its body", upstream: hold, request: "Content-Length: 100\r\n\r\nten bytes.", status: http.StatusGatewayTimeout, closed: true, ends: true},
		{name: "slow but moving", upstream: func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n")
			for range 8 { // 8 x idle/3: well past the timeout in all
				time.Sleep(idle / 3)
				if _, err := io.WriteString(c, "x"); err != nil {
					return
				}
			}
		}, request: "\r\n", status: http.StatusOK, body: "xxxxxxxx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, served := rawUpstream(t, tc.upstream)
			p, logs := newTestProxy(t, Config{IdleTimeout: idle, HalfCloseTimeout: time.Hour, AllowCIDRs: loopback, Hosts: hostsFor("up.test")})
			_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "up.test:"+port)}, nil)
			c, err := net.Dial("tcp", proxy.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "GET http://up.test:"+port+"/ HTTP/1.1\r\nHost: up.test:"+port+"\r\n"+tc.request)
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			status, body := 0, ""
			if err == nil {
				b, berr := io.ReadAll(res.Body)
				res.Body.Close()
				status, body = res.StatusCode, string(b)
				if berr != nil {
					status = 0 // a body cut short
				}
			}
			if status != tc.status || (tc.body != "" && body != tc.body) {
				t.Fatalf("answer %d %q (%v), want %d %q", status, body, err, tc.status, tc.body)
			}
			if tc.status == http.StatusGatewayTimeout && !strings.Contains(body, "no byte moved") {
				t.Errorf("504 body %q does not say why", body)
			}
			if tc.closed {
				logs.waitFor(t, "closed: no byte moved")
			}
			if tc.ends {
				if _, err := io.Copy(io.Discard, br); err != nil {
					t.Errorf("the sandbox's connection was not closed: %v", err)
				}
			}
			select {
			case <-served:
			case <-time.After(30 * time.Second):
				t.Error("the upstream connection was not closed")
			}
			c.Close()
			waitFor(t, "the connection given back", func() bool { return p.conns("tenant-s1") == 0 })
		})
	}
}

// A 504 for a stalled exchange leaves the sandbox's connection usable, or
// closes it: a keep-alive client's next request on it is served, not
// answered for a "client gone" (the watchdog's read deadline once
// cancelled the connection's context for good).
func TestPlainHTTPStallKeepAlive(t *testing.T) {
	const idle = 300 * time.Millisecond
	hold := func(c net.Conn, br *bufio.Reader) { readHead(br); io.Copy(io.Discard, br) }
	holdPort, _ := rawUpstream(t, hold)
	okPort, _ := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		readHead(br)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		io.Copy(io.Discard, br)
	})
	p, _ := newTestProxy(t, Config{IdleTimeout: idle, HalfCloseTimeout: time.Hour, AllowCIDRs: loopback, Hosts: hostsFor("up.test")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "up.test:"+holdPort, "up.test:"+okPort)}, nil)
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "GET http://up.test:"+holdPort+"/ HTTP/1.1\r\nHost: up.test:"+holdPort+"\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("stalled exchange: %d, want 504", res.StatusCode)
	}
	if res.Close {
		return // the connection ends with the 504: a client opens another
	}
	io.WriteString(c, "GET http://up.test:"+okPort+"/ HTTP/1.1\r\nHost: up.test:"+okPort+"\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the next request on the kept-alive connection: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Fatalf("the next request on the kept-alive connection: %d %q, want 200 \"ok\"", res.StatusCode, b)
	}
}
