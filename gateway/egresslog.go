package gateway

import (
	"sync"
	"time"

	"github.com/sandgate/sandgate/egress"
)

// MaxEgressDecisions is how many egress decisions a session keeps (per
// session, in the gateway's memory, since the process started); older
// ones fall off. GET /v1/sessions/{id}/egress pages through them.
const MaxEgressDecisions = 1000

// EgressDecision is one egress connection, request or refused name of a
// session, as the proxy logged it when it ended.
type EgressDecision struct {
	// Seq grows by one per decision of the session, from 1.
	Seq     int64
	Kind    string // connect, http, https, tcp (transparent) or dns
	Host    string
	Port    int    // 0 for a refused name (kind dns)
	Addr    string // the address dialled, "" when none was
	Allowed bool
	// Reason is why it was denied, or what failed once it was allowed.
	Reason   string
	BytesIn  int64 // upstream -> sandbox
	BytesOut int64 // sandbox -> upstream
	Start    time.Time
	Duration time.Duration
}

// egressLog is a session's ring of its latest decisions.
type egressLog struct {
	mu   sync.Mutex
	ring []EgressDecision // ring[(seq-1) % MaxEgressDecisions]
	seq  int64            // the latest decision's
}

func (l *egressLog) add(d EgressDecision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	d.Seq = l.seq
	if len(l.ring) < MaxEgressDecisions {
		l.ring = append(l.ring, d)
		return
	}
	l.ring[(d.Seq-1)%MaxEgressDecisions] = d
}

// page returns up to limit decisions older than before (0: the latest
// first), newest first, and whether older ones are kept.
func (l *egressLog) page(before int64, limit int) ([]EgressDecision, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	oldest := l.seq - int64(len(l.ring)) + 1
	from := l.seq
	if before > 0 && before-1 < from {
		from = before - 1
	}
	var out []EgressDecision
	for seq := from; seq >= oldest && len(out) < limit; seq-- {
		out = append(out, l.ring[(seq-1)%MaxEgressDecisions])
	}
	more := len(out) > 0 && out[len(out)-1].Seq > oldest
	return out, more
}

// noteEgress keeps r, one of the proxy's records, among s's decisions.
func (s *Session) noteEgress(r egress.Record) {
	reason := r.Reason
	if reason == "" {
		reason = r.Error
	}
	s.egressLog.add(EgressDecision{Kind: r.Kind, Host: s.redact(r.Host), Port: r.Port, Addr: r.IP, Allowed: r.Allowed,
		Reason: reason, BytesIn: r.BytesIn, BytesOut: r.BytesOut, Start: r.Start,
		Duration: time.Duration(r.DurationMs) * time.Millisecond})
}

// EgressDecisions returns up to limit of the session's latest egress
// decisions older than the one numbered before (0: from the latest),
// newest first, and whether older ones are kept. At most
// MaxEgressDecisions are kept.
func (s *Session) EgressDecisions(before int64, limit int) ([]EgressDecision, bool) {
	return s.egressLog.page(before, limit)
}
