package metrics

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sshd"
)

// The hook interfaces the other packages call through.
var (
	_ gateway.Metrics             = (*Metrics)(nil)
	_ sshd.Metrics                = (*Metrics)(nil)
	_ rest.Metrics                = (*Metrics)(nil)
	_ rest.UnauthenticatedMetrics = (*Metrics)(nil)
)

type fixedCounts map[string]int

func (f fixedCounts) SessionsByStatus() map[string]int { return f }

type fixedTeardowns [2]int

func (f fixedTeardowns) Teardowns() (int, int) { return f[0], f[1] }

func scrape(t *testing.T, h http.Handler, token string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func wantLines(t *testing.T, body string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("missing line %q in:\n%s", l, body)
		}
	}
}

func TestCollectors(t *testing.T) {
	m := New()
	m.WatchSessions(fixedCounts{"running": 2, "failed": 1}, "running", "stopped", "failed")
	m.WatchTeardowns(fixedTeardowns{3, 1})
	m.SessionCreated(30*time.Millisecond, "warm")
	m.SessionCreated(2*time.Second, "cold")
	m.SessionDeleted()
	m.SessionExpired("ttl")
	m.TeardownRetried(false)
	m.TeardownRetried(true)
	m.CommandDone("rest", 20*time.Millisecond)
	m.CommandDone("ssh", time.Second)
	m.SSHAuthFailed("password")
	m.SSHAuthFailed("password")
	m.RateLimited("tenant")
	m.UnauthenticatedCall("none", false)
	m.UnauthenticatedCall("invalid", true)

	code, body := scrape(t, m.Handler(""), "")
	if code != http.StatusOK {
		t.Fatalf("scrape: %d", code)
	}
	wantLines(t, body,
		`sandgate_sessions{status="running"} 2`,
		`sandgate_sessions{status="stopped"} 0`,
		`sandgate_sessions{status="failed"} 1`,
		`sandgate_session_creates_total 2`,
		`sandgate_session_sandboxes_total{source="warm"} 1`,
		`sandgate_session_sandboxes_total{source="cold"} 1`,
		`sandgate_session_sandboxes_total{source="fork"} 0`,
		`sandgate_teardowns{state="deferred"} 3`,
		`sandgate_teardowns{state="running"} 1`,
		`sandgate_session_create_duration_seconds_count 2`,
		`sandgate_session_create_duration_seconds_bucket{le="0.05"} 1`,
		`sandgate_session_create_duration_seconds_bucket{le="+Inf"} 2`,
		`sandgate_session_deletes_total 1`,
		`sandgate_session_expiries_total{reason="ttl"} 1`,
		`sandgate_sandbox_teardown_retries_total{result="failed"} 1`,
		`sandgate_sandbox_teardown_retries_total{result="ok"} 1`,
		`sandgate_commands_total{source="rest"} 1`,
		`sandgate_commands_total{source="ssh"} 1`,
		`sandgate_command_duration_seconds_count{source="ssh"} 1`,
		`sandgate_ssh_auth_failures_total{method="password"} 2`,
		`sandgate_rate_limited_total{limit="tenant"} 1`,
		`sandgate_rate_limited_total{limit="auth_failures"} 0`,
		`sandgate_tunnels_open 0`,
		`sandgate_tunnel_bytes_total{direction="in"} 0`,
		`sandgate_unauthenticated_requests_total{audited="false",credential="none"} 1`,
		`sandgate_unauthenticated_requests_total{audited="true",credential="invalid"} 1`,
	)
	for _, name := range []string{"go_goroutines ", "go_memstats_heap_alloc_bytes "} {
		if !strings.Contains(body, "\n"+name) {
			t.Errorf("no %s in the scrape", name)
		}
	}
}

// Two Metrics are independent: nothing is registered globally.
func TestNoGlobalRegistry(t *testing.T) {
	a, b := New(), New()
	a.SessionDeleted()
	_, body := scrape(t, b.Handler(""), "")
	wantLines(t, body, "sandgate_session_deletes_total 0")
}

func TestTunnel(t *testing.T) {
	m := New()
	client, server := net.Pipe()
	conn, done := m.Tunnel(server)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 5)
		_, _ = io.ReadFull(conn, buf)
		_, _ = conn.Write([]byte("hello world"))
	})
	if _, err := client.Write([]byte("12345")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 11)
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	_, body := scrape(t, m.Handler(""), "")
	wantLines(t, body, "sandgate_tunnels_open 1",
		`sandgate_tunnel_bytes_total{direction="in"} 5`,
		`sandgate_tunnel_bytes_total{direction="out"} 11`)
	done()
	done() // once only
	_, body = scrape(t, m.Handler(""), "")
	wantLines(t, body, "sandgate_tunnels_open 0")
	client.Close()
	server.Close()
}

func TestHandlerToken(t *testing.T) {
	m := New()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "next", http.StatusTeapot) })
	h := Mount(next, m.Handler("s3cret"))
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"wrong", http.StatusUnauthorized}, {"s3cret", http.StatusOK}} {
		if code, _ := scrape(t, h, tc.token); code != tc.want {
			t.Errorf("token %q: %d, want %d", tc.token, code, tc.want)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/other", nil))
	if rec.Code != http.StatusTeapot {
		t.Errorf("other paths must reach next: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/metrics", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d", rec.Code)
	}
}
