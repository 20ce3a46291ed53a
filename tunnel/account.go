package tunnel

import (
	"context"
	"net"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
)

// Metrics counts tunnels (internal/metrics implements it). Calls must be
// cheap and must not block.
type Metrics interface {
	// Tunnel counts conn as an open tunnel until done is called, and the
	// bytes through the returned conn.
	Tunnel(conn net.Conn) (counted net.Conn, done func())
}

// WithMetrics counts every tunnel, and its bytes, in m.
func WithMetrics(m Metrics) Option { return func(t *Server) { t.metrics = m } }

// WithAudit records every tunnel in a: tunnel.open when it is handed on,
// tunnel.close with its bytes each way and its duration when it ends.
func WithAudit(a audit.Auditor) Option { return func(t *Server) { t.audit = a } }

// account wraps conn, an established tunnel to session s, so that its
// bytes count: in the session's TunnelBytes (the stats), in the metrics
// and in the audit's close event. It records the opening, with the
// CONNECT's request id and principal (in ctx). done, called once the
// handler returns, records the close and ends the metrics' count.
func (t *Server) account(ctx context.Context, conn net.Conn, s *gateway.Session) (net.Conn, func()) {
	conn = s.CountTunnel(conn)
	metricsDone, auditDone := func() {}, func() {}
	if t.metrics != nil {
		conn, metricsDone = t.metrics.Tunnel(conn)
	}
	if t.audit != nil {
		conn, auditDone = audit.Tunnel(audit.WithRequest(ctx, auditRequest(ctx)), t.audit, conn, s.ID)
	}
	return conn, func() {
		auditDone()
		metricsDone()
	}
}

// auditRequest is the CONNECT request's identity: its id, and its
// principal (which the REST middleware put in the context).
func auditRequest(ctx context.Context) audit.Request {
	r := audit.RequestFrom(ctx)
	if p, ok := gateway.PrincipalFrom(ctx); ok {
		r.Tenant, r.Auth = p.Tenant, p.Method
	}
	return r
}
