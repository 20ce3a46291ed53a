package tunnel_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox/workdir"
	"github.com/sandgate/sandgate/tunnel"
)

// recorder is the tunnel's auditor and metrics: it keeps what it is told.
type recorder struct {
	mu      sync.Mutex
	events  []audit.Event
	tenants []string // the audit request's tenant of each event
	open    int
	in, out int64
}

func (r *recorder) Record(ctx context.Context, e audit.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	r.tenants = append(r.tenants, audit.RequestFrom(ctx).Tenant)
}

func (r *recorder) Tunnel(conn net.Conn) (net.Conn, func()) {
	r.mu.Lock()
	r.open++
	r.mu.Unlock()
	return &meteredConn{Conn: conn, r: r}, func() {
		r.mu.Lock()
		r.open--
		r.mu.Unlock()
	}
}

type meteredConn struct {
	net.Conn
	r *recorder
}

func (c *meteredConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.in += int64(n)
	c.r.mu.Unlock()
	return n, err
}

func (c *meteredConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.r.mu.Lock()
	c.r.out += int64(n)
	c.r.mu.Unlock()
	return n, err
}

// TestTunnelAccounting: the server itself counts a tunnel's bytes for the
// session's stats and the metrics, and records its opening and close in
// the audit trail, with the CONNECT's principal; the bytes the client
// sent with its CONNECT count too, the server's 200 does not.
func TestTunnelAccounting(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	drv, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	mgr := gateway.NewManager(gateway.Config{}, drv, log)
	t.Cleanup(func() { mgr.Shutdown(context.Background(), false) })
	p := gateway.Principal{Tenant: "t", Method: "api_key"}
	s, _, err := mgr.Create(context.Background(), p, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	handled := make(chan struct{})
	tun := tunnel.NewServer(mgr, func(_ context.Context, conn net.Conn, _ *gateway.Session) {
		defer close(handled)
		buf := make([]byte, 5)
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
			t.Errorf("handler read %q, %v", buf, err)
			return
		}
		_, _ = io.WriteString(conn, "world!")
	}, func(w http.ResponseWriter, err error) { http.Error(w, err.Error(), http.StatusInternalServerError) }, log,
		tunnel.WithAudit(rec), tunnel.WithMetrics(rec))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tun.ServeHTTP(w, r.WithContext(gateway.WithPrincipal(r.Context(), p)))
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tun.Shutdown(ctx)
	})

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The tunnel's first bytes ride in the CONNECT's packet.
	if _, err := io.WriteString(conn, "CONNECT /v1/sessions/"+s.ID+" HTTP/1.1\r\nHost: x\r\n\r\nhello"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	got := make([]byte, 6)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "world!" {
		t.Fatalf("read %q, %v", got, err)
	}
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not return")
	}
	// The close is recorded once the handler has returned, its audit
	// event and its metrics each in their own step: wait for both.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec.mu.Lock()
		n, open := len(rec.events), rec.open
		rec.mu.Unlock()
		if n >= 2 && open == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	if in, out := s.TunnelBytes(); in != 5 || out != 6 {
		t.Errorf("session's TunnelBytes = %d in, %d out; want 5, 6", in, out)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.in != 5 || rec.out != 6 || rec.open != 0 {
		t.Errorf("metrics: %d in, %d out, %d open; want 5, 6, 0", rec.in, rec.out, rec.open)
	}
	if len(rec.events) != 2 {
		t.Fatalf("audit events %+v, want open and close", rec.events)
	}
	open, closed := rec.events[0], rec.events[1]
	if open.Kind != audit.KindTunnelOpen || open.Session != s.ID || rec.tenants[0] != "t" {
		t.Errorf("open event %+v (tenant %q)", open, rec.tenants[0])
	}
	if closed.Kind != audit.KindTunnelClose || closed.Session != s.ID || closed.BytesIn != 5 || closed.BytesOut != 6 || rec.tenants[1] != "t" {
		t.Errorf("close event %+v (tenant %q)", closed, rec.tenants[1])
	}
}
