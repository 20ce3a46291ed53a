package connlimit

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t *testing.T, cfg Config) (*Limiter, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	l := New(cfg)
	l.Install(srv)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return l, ln.Addr().String()
}

func dialIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// closed reports whether the server closed c (a read sees EOF or a reset).
func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	ne, ok := err.(net.Error)
	return err != nil && !(ok && ne.Timeout())
}

func TestOldestWaitingConnectionsAreClosed(t *testing.T) {
	l, addr := serve(t, Config{MaxWaiting: 50, MaxWaitingPerIP: 20})
	cs := dialIdle(t, addr, 30)
	if !waitUntil(2*time.Second, func() bool { return l.Waiting() == 20 }) {
		t.Fatalf("waiting = %d, want the per-IP bound 20", l.Waiting())
	}
	for i, c := range cs {
		if got, want := closed(c), i < 10; got != want {
			t.Errorf("connection %d (of 30, oldest first): closed = %v, want %v", i, got, want)
		}
	}
	// A new client is served though the bound is reached.
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestTotalBound(t *testing.T) {
	l, addr := serve(t, Config{MaxWaiting: 5, MaxWaitingPerIP: 100})
	dialIdle(t, addr, 12)
	if !waitUntil(2*time.Second, func() bool { return l.Waiting() == 5 }) {
		t.Fatalf("waiting = %d, want the total bound 5", l.Waiting())
	}
}

func TestRequestsStopWaiting(t *testing.T) {
	l, addr := serve(t, Config{MaxWaiting: 5, MaxWaitingPerIP: 5})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !waitUntil(2*time.Second, func() bool { return l.Waiting() == 1 }) {
		t.Fatalf("waiting = %d after a connect", l.Waiting())
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if _, err := io.ReadAll(c); err != nil {
		t.Fatal(err)
	}
	if !waitUntil(2*time.Second, func() bool { return l.Waiting() == 0 }) {
		t.Fatalf("waiting = %d after the request", l.Waiting())
	}
}

// syncBuffer is a log destination safe for the limiter's timer.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A burst of closings is logged as its first closing at once and the true
// count of the rest when the window ends, not as its first one alone.
func TestConnectionLimitLogCountsTheBurst(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l, addr := serve(t, Config{MaxWaiting: 5, MaxWaitingPerIP: 100, Log: log, WarnEvery: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	dialIdle(t, addr, 40)
	re := regexp.MustCompile(`msg=connection_limit closed_waiting_connections=(\d+)`)
	total := 0
	if !waitUntil(30*time.Second, func() bool {
		total = 0
		for _, m := range re.FindAllStringSubmatch(buf.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			total += n
		}
		return total == 35
	}) {
		t.Fatalf("the log counts %d closings, want 35:\n%s", total, buf.String())
	}
	if lines := len(re.FindAllString(buf.String(), -1)); lines < 2 {
		t.Errorf("%d lines: want the first closing, then the rest", lines)
	}
}
