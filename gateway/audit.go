package gateway

import (
	"context"
	"strings"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/egress"
)

// auditor is where m's audit events go; safe on a nil Manager (sessions
// made by hand in tests have none).
func (m *Manager) auditor() audit.Auditor {
	if m == nil {
		return audit.Discard
	}
	return audit.Or(m.cfg.Audit)
}

// auditSession records a lifecycle event of s: op is created, deleted,
// expired, failed, stopped or resumed.
func (m *Manager) auditSession(ctx context.Context, s *Session, op, reason, by string) {
	m.auditor().Record(ctx, audit.Event{Kind: audit.KindSession, Tenant: s.Tenant, Session: s.ID, Op: op, Reason: reason, By: by})
}

// auditCommand records a command that ended.
func (s *Session) auditCommand(ctx context.Context, r CommandRecord) {
	source := r.Source
	if r.Shell != "" {
		source = "rest-shell"
	}
	audit.Or(s.auditor).Record(ctx, audit.Event{Kind: audit.KindCommand, Tenant: s.Tenant, Session: s.ID, Source: source,
		Command: audit.Cut(s.redact(r.Command)), ExitCode: r.ExitCode, Signal: r.ExitSignal, TimedOut: r.TimedOut,
		DurationMs: r.DurationMs, Bytes: r.BytesOut, ProcessID: r.ProcessID})
}

// Audit records e for s (its tenant and id filled in) through the
// manager's auditor: for the transports, which see what the manager does
// not (SSH shells, SFTP, REST files, kernel calls).
func (s *Session) Audit(ctx context.Context, e audit.Event) {
	e.Tenant, e.Session = s.Tenant, s.ID
	e.Command, e.Path, e.Target = audit.Cut(s.redact(e.Command)), s.redact(e.Path), s.redact(e.Target)
	audit.Or(s.auditor).Record(ctx, e)
}

// redact replaces the value of each of s's secrets (looked up now, bound
// ones included) in text with [secret:NAME]: a user who types a secret's
// value into a command does not put it in the audit log.
func (s *Session) redact(text string) string {
	if text == "" || s.secrets == nil {
		return text
	}
	for _, r := range s.Secrets {
		if v, ok := s.secrets.Lookup(s.Tenant, r.Name); ok && v != "" && strings.Contains(text, v) {
			text = strings.ReplaceAll(text, v, "[secret:"+r.Name+"]")
		}
	}
	return text
}

// auditEgress records an egress proxy connection of s: allowed or denied,
// where to, and the bytes each way. Headers (where bound secrets go) are
// never part of it.
func (m *Manager) auditEgress(s *Session, r egress.Record) {
	result := "allowed"
	if !r.Allowed {
		result = "denied"
	}
	if r.Tripwire != "" {
		result = "tripwire"
	}
	if r.Approval != "" { // kind ask: approved, denied or timeout
		result = r.Approval
	}
	reason := r.Reason
	if reason == "" {
		reason = r.Error
	}
	m.auditor().Record(context.Background(), audit.Event{Kind: audit.KindEgress, Tenant: s.Tenant, Session: s.ID,
		Op: r.Kind, Host: s.redact(r.Host), Port: r.Port, Addr: r.IP, Result: result, Reason: reason,
		BytesIn: r.BytesIn, BytesOut: r.BytesOut, DurationMs: r.DurationMs, Secret: r.Tripwire})
}
