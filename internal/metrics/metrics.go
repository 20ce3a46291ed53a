// Package metrics holds the gateway's Prometheus collectors. It owns one
// registry (never the default one) and implements the small hook
// interfaces the other packages call through optional config fields
// (gateway.Metrics, sshd.Metrics, rest.Metrics, egress.Metrics, audit.Metrics); tunnels are counted by
// wrapping their connections (Tunnel).
package metrics

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// SessionCounter reports how many sessions the gateway holds by status
// (gateway.Manager implements it).
type SessionCounter interface {
	SessionsByStatus() map[string]int
}

// Metrics are the gateway's collectors and the registry they are in.
type Metrics struct {
	reg *prometheus.Registry

	creates         prometheus.Counter
	createSources   *prometheus.CounterVec
	createLatency   prometheus.Histogram
	deletes         prometheus.Counter
	expiries        *prometheus.CounterVec
	teardownRetries *prometheus.CounterVec
	commands        *prometheus.CounterVec
	commandLatency  *prometheus.HistogramVec
	tunnelsOpen     prometheus.Gauge
	tunnelBytes     *prometheus.CounterVec
	egressBytes     *prometheus.CounterVec
	sshAuthFailures *prometheus.CounterVec
	rateLimited     *prometheus.CounterVec
	auditFailures   prometheus.Counter
	unauthenticated *prometheus.CounterVec
}

// New returns the collectors in a fresh registry, with the Go runtime and
// process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		creates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandgate_session_creates_total", Help: "Sessions created (replays of an idempotent create not counted).",
		}),
		createSources: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_session_sandboxes_total", Help: "Sessions created, by where their sandbox came from: warm (claimed from a warm pool), cold (built for the create: the pool was empty, or cannot serve it), fork (restored from a running session).",
		}, []string{"source"}),
		createLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandgate_session_create_duration_seconds", Help: "Time a successful create took, sandbox and store included.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		deletes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandgate_session_deletes_total", Help: "Sessions deleted through the API.",
		}),
		expiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_session_expiries_total", Help: "Sessions the reaper ended, by reason (ttl, idle).",
		}, []string{"reason"}),
		teardownRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_sandbox_teardown_retries_total", Help: "Retried destroys of sandboxes whose first destroy failed, by result (ok, failed).",
		}, []string{"result"}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_commands_total", Help: "Commands that ended, by source (ssh, rest).",
		}, []string{"source"}),
		commandLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sandgate_command_duration_seconds", Help: "How long commands ran, by source (ssh, rest).",
			Buckets: []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800},
		}, []string{"source"}),
		tunnelsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandgate_tunnels_open", Help: "CONNECT tunnels (SSH) open now.",
		}),
		tunnelBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_tunnel_bytes_total", Help: "Bytes through CONNECT tunnels, by direction (in: from clients, out: to clients).",
		}, []string{"direction"}),
		egressBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_egress_bytes_total", Help: "Bytes through sessions' egress proxies, by direction (in: from destinations to sandboxes, out: from sandboxes to destinations).",
		}, []string{"direction"}),
		sshAuthFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_ssh_auth_failures_total", Help: "Failed SSH authentication attempts, by method.",
		}, []string{"method"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_rate_limited_total", Help: "Requests refused with 429 by a rate limit, by limit (tenant, auth_failures).",
		}, []string{"limit"}),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandgate_audit_write_failures_total", Help: "Audit events that could not be written to the audit log (lost), e.g. on a full disk.",
		}),
		unauthenticated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_unauthenticated_requests_total", Help: "REST calls that ended without a caller, by credential (none, invalid) and audited (true: an audit event was written; false: only counted and summed up per minute).",
		}, []string{"credential", "audited"}),
	}
	m.reg.MustRegister(m.creates, m.createSources, m.createLatency, m.deletes, m.expiries, m.teardownRetries,
		m.commands, m.commandLatency, m.tunnelsOpen, m.tunnelBytes, m.egressBytes, m.sshAuthFailures, m.rateLimited, m.auditFailures,
		m.unauthenticated,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Known label values start at 0, so rates work from the first scrape.
	for _, d := range []string{"in", "out"} {
		m.tunnelBytes.WithLabelValues(d)
		m.egressBytes.WithLabelValues(d)
	}
	for _, l := range []string{"tenant", "auth_failures"} {
		m.rateLimited.WithLabelValues(l)
	}
	for _, s := range []string{"warm", "cold", "fork"} {
		m.createSources.WithLabelValues(s)
	}
	for _, r := range []string{"ok", "failed"} {
		m.teardownRetries.WithLabelValues(r)
	}
	return m
}

// Registry is where the collectors are.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// WatchSessions adds sandgate_sessions{status}, read from sc at each scrape.
func (m *Metrics) WatchSessions(sc SessionCounter, statuses ...string) {
	m.reg.MustRegister(&sessionCollector{sc: sc, statuses: statuses,
		desc: prometheus.NewDesc("sandgate_sessions", "Sessions the gateway holds, by status.", []string{"status"}, nil)})
}

type sessionCollector struct {
	sc       SessionCounter
	statuses []string // always reported, 0 when none
	desc     *prometheus.Desc
}

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.sc.SessionsByStatus()
	for _, s := range c.statuses {
		if _, ok := counts[s]; !ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 0, s)
		}
	}
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), s)
	}
}

// WarmCounter reports the warm sandboxes ready, by image
// (gateway.Manager implements it).
type WarmCounter interface {
	WarmSandboxes() map[string]int
}

// WatchWarm adds sandgate_warm_sandboxes{image}, read from wc at each
// scrape: the warm pools' sandboxes ready to be claimed, by image.
func (m *Metrics) WatchWarm(wc WarmCounter) {
	m.reg.MustRegister(&warmCollector{wc: wc,
		desc: prometheus.NewDesc("sandgate_warm_sandboxes", "Warm sandboxes ready to be claimed, by image (default: the default root).", []string{"image"}, nil)})
}

type warmCollector struct {
	wc   WarmCounter
	desc *prometheus.Desc
}

func (c *warmCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *warmCollector) Collect(ch chan<- prometheus.Metric) {
	for image, n := range c.wc.WarmSandboxes() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), image)
	}
}

// TeardownCounter reports the sandbox releases in the background
// (gateway.Manager implements it).
type TeardownCounter interface {
	Teardowns() (deferred, running int)
}

// WatchTeardowns adds sandgate_teardowns{state}, read from tc at each
// scrape: the deleted sessions' sandboxes being released in the
// background, deferred behind a burst of creates or running.
func (m *Metrics) WatchTeardowns(tc TeardownCounter) {
	m.reg.MustRegister(&teardownCollector{tc: tc,
		desc: prometheus.NewDesc("sandgate_teardowns", "Deleted sessions' sandboxes being released in the background (--teardown-queue slots): deferred while creates arrive, or running.", []string{"state"}, nil)})
}

type teardownCollector struct {
	tc   TeardownCounter
	desc *prometheus.Desc
}

func (c *teardownCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *teardownCollector) Collect(ch chan<- prometheus.Metric) {
	deferred, running := c.tc.Teardowns()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(deferred), "deferred")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(running), "running")
}

// SessionCreated implements gateway.Metrics.
func (m *Metrics) SessionCreated(d time.Duration, source string) {
	m.creates.Inc()
	m.createSources.WithLabelValues(source).Inc()
	m.createLatency.Observe(d.Seconds())
}

// SessionDeleted implements gateway.Metrics.
func (m *Metrics) SessionDeleted() { m.deletes.Inc() }

// SessionExpired implements gateway.Metrics.
func (m *Metrics) SessionExpired(reason string) { m.expiries.WithLabelValues(reason).Inc() }

// TeardownRetried implements gateway.Metrics.
func (m *Metrics) TeardownRetried(ok bool) {
	r := "failed"
	if ok {
		r = "ok"
	}
	m.teardownRetries.WithLabelValues(r).Inc()
}

// CommandDone implements gateway.Metrics.
func (m *Metrics) CommandDone(source string, d time.Duration) {
	m.commands.WithLabelValues(source).Inc()
	m.commandLatency.WithLabelValues(source).Observe(d.Seconds())
}

// SSHAuthFailed implements sshd.Metrics.
func (m *Metrics) SSHAuthFailed(method string) { m.sshAuthFailures.WithLabelValues(method).Inc() }

// EgressBytes implements egress.Metrics.
func (m *Metrics) EgressBytes(in, out int64) {
	if in > 0 {
		m.egressBytes.WithLabelValues("in").Add(float64(in))
	}
	if out > 0 {
		m.egressBytes.WithLabelValues("out").Add(float64(out))
	}
}

// AuditWriteFailed implements audit.Metrics.
func (m *Metrics) AuditWriteFailed() { m.auditFailures.Inc() }

// UnauthenticatedCall implements rest.UnauthenticatedMetrics.
func (m *Metrics) UnauthenticatedCall(credential string, audited bool) {
	m.unauthenticated.WithLabelValues(credential, strconv.FormatBool(audited)).Inc()
}

// RateLimited implements rest.Metrics.
func (m *Metrics) RateLimited(limit string) { m.rateLimited.WithLabelValues(limit).Inc() }

// Tunnel counts conn as an open tunnel until the returned func is called,
// and the bytes through the returned conn.
func (m *Metrics) Tunnel(conn net.Conn) (net.Conn, func()) {
	m.tunnelsOpen.Inc()
	var once sync.Once
	return &countedConn{Conn: conn, in: m.tunnelBytes.WithLabelValues("in"), out: m.tunnelBytes.WithLabelValues("out")},
		func() { once.Do(m.tunnelsOpen.Dec) }
}

type countedConn struct {
	net.Conn
	in, out prometheus.Counter
}

// NetConn returns the connection under c, as (*tls.Conn).NetConn does, so
// that a reader can reach its socket (the SSH server's read-ahead probe
// and cork); reads and writes must still go through c to be counted.
func (c *countedConn) NetConn() net.Conn { return c.Conn }

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(float64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(float64(n))
	return n, err
}

// CloseWrite half-closes the underlying connection when it can.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Handler serves the registry in the Prometheus text format. A non-empty
// token is required as "Authorization: Bearer <token>"; without it the
// answer is 401.
func (m *Metrics) Handler(token string) http.Handler {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandgate metrics"`)
			http.Error(w, "metrics need the metrics token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Mount returns next with GET /metrics answered by h.
func Mount(next, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "GET only", http.StatusMethodNotAllowed)
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
