package main

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrapeMetrics GETs url (a /metrics URL) with token ("" for none) and
// returns the status, Content-Type and body. The connection is not kept,
// so no idle client goroutine outlives the test.
func scrapeMetrics(t *testing.T, url, token string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// metricLines fails t unless body has every line of want, exactly.
func metricLines(t *testing.T, body string, want ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		have[l] = true
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("no line %q in /metrics:\n%s", w, body)
		}
	}
}

func metricPrefixes(t *testing.T, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, "\n"+w) {
			t.Errorf("no metric %q in /metrics", w)
		}
	}
}

// TestMetricsToken: with --metrics-token, /metrics on the main listener
// needs that token (not an API key) and counts what the API did.
func TestMetricsToken(t *testing.T) {
	g := startGateway(t, "--metrics-token", "t")
	url := g.URL + "/metrics"
	for _, tok := range []string{"", g.Token, "tt"} {
		if code, _, _ := scrapeMetrics(t, url, tok); code != http.StatusUnauthorized {
			t.Errorf("GET /metrics with token %q: %d, want 401", tok, code)
		}
	}
	s := g.createSession(t)
	var out map[string]any
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands", map[string]any{"command": "echo hi"}, &out); code != http.StatusOK {
		t.Fatalf("command: %d %v", code, out)
	}
	code, ctype, body := scrapeMetrics(t, url, "t")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics with the metrics token: %d\n%s", code, body)
	}
	if !strings.HasPrefix(ctype, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain", ctype)
	}
	metricLines(t, body,
		`sandgate_sessions{status="running"} 1`,
		`sandgate_session_creates_total 1`,
		`sandgate_session_create_duration_seconds_count 1`,
		`sandgate_session_deletes_total 0`,
		`sandgate_commands_total{source="rest"} 1`,
		`sandgate_command_duration_seconds_count{source="rest"} 1`,
		`sandgate_tunnels_open 0`,
	)
	metricPrefixes(t, body, "go_goroutines ", `sandgate_session_create_duration_seconds_bucket{le="+Inf"} 1`,
		"sandgate_tunnel_bytes_total", "sandgate_rate_limited_total", "sandgate_sandbox_teardown_retries_total")

	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete: %d", code)
	}
	_, _, body = scrapeMetrics(t, url, "t")
	metricLines(t, body, `sandgate_sessions{status="running"} 0`, `sandgate_session_deletes_total 1`)
}

// TestMetricsOff: with neither flag, /metrics is an unknown endpoint,
// even to an API key.
func TestMetricsOff(t *testing.T) {
	g := startGateway(t)
	for _, tok := range []string{"", g.Token} {
		if code, _, _ := scrapeMetrics(t, g.URL+"/metrics", tok); code != http.StatusNotFound {
			t.Errorf("GET /metrics with token %q: %d, want 404", tok, code)
		}
	}
}

var metricsURLRE = regexp.MustCompile(`msg=metrics_listening url=(\S+)`)

// TestMetricsListen: --metrics-listen serves /metrics on a second
// listener without a token (and not on the main one); the log says where.
// Rate-limit refusals are counted.
func TestMetricsListen(t *testing.T) {
	g := startGateway(t, "--metrics-listen", "127.0.0.1:0", "--rate-limit", "2")
	m := metricsURLRE.FindStringSubmatch(g.stderr.String())
	if m == nil {
		t.Fatalf("no metrics_listening line in the log:\n%s", g.stderr.String())
	}
	if code, _, _ := scrapeMetrics(t, g.URL+"/metrics", ""); code != http.StatusNotFound {
		t.Errorf("main listener GET /metrics: %d, want 404", code)
	}
	limited := false
	for range 10 {
		if g.api(t, http.MethodGet, "/v1/sessions", nil, nil) == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("no 429 with --rate-limit 2")
	}
	code, _, body := scrapeMetrics(t, m[1], "")
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", m[1], code, body)
	}
	metricLines(t, body, `sandgate_sessions{status="running"} 0`, `sandgate_session_creates_total 0`)
	metricPrefixes(t, body, "go_goroutines ", "process_open_fds ")
	if !regexp.MustCompile(`\nsandgate_rate_limited_total\{limit="tenant"\} [1-9]`).MatchString(body) {
		t.Errorf("429s not counted:\n%s", body)
	}
	if code, _, _ := scrapeMetrics(t, strings.TrimSuffix(m[1], "/metrics")+"/v1/sessions", ""); code != http.StatusNotFound {
		t.Errorf("the metrics listener serves only /metrics: %d", code)
	}
}

var gomaxprocsRE = regexp.MustCompile(`\ngo_sched_gomaxprocs_threads (\d+)\n`)

// stepDownRE is the governor's debug line of a step down to one P.
var stepDownRE = regexp.MustCompile(`msg=gomaxprocs from=([2-9]|\d\d+) to=1 `)

// gomaxprocs scrapes the gateway's GOMAXPROCS from its /metrics.
func gomaxprocs(t *testing.T, url string) int {
	t.Helper()
	code, _, body := scrapeMetrics(t, url, "t")
	m := gomaxprocsRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d, no go_sched_gomaxprocs_threads:\n%s", url, code, body)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGOMAXPROCSGovernor: an idle gateway comes down to one P
// (internal/procgov); GOMAXPROCS in its environment fixes the number.
func TestGOMAXPROCSGovernor(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // empty: unset, for the runtime and for serve
	if n := runtime.NumCPU(); n < 2 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("this host has %d core: the test needs 2 or more", n)
		}
		t.Skipf("this host has %d core: nothing to govern", n)
	}
	// The governor may step down before the first scrape (a loaded host
	// starts the gateway slowly): its debug line says from what.
	g := startGateway(t, "--metrics-token", "t", "--log-level", "debug")
	url := g.URL + "/metrics"
	deadline := time.Now().Add(20 * time.Second)
	for gomaxprocs(t, url) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("an idle gateway still has GOMAXPROCS %d after 20 s, want 1", gomaxprocs(t, url))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !stepDownRE.MatchString(g.stderr.String()) {
		t.Fatalf("GOMAXPROCS is 1, but no step down from 2 or more was logged:\n%s", g.stderr.String())
	}

	t.Setenv("GOMAXPROCS", "2")
	fixed := startGateway(t, "--metrics-token", "t")
	time.Sleep(3 * time.Second) // the governor would have stepped down after 1 s
	if n := gomaxprocs(t, fixed.URL+"/metrics"); n != 2 {
		t.Fatalf("with GOMAXPROCS=2 set, the gateway has %d Ps", n)
	}
}
