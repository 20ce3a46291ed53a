package gateway

import "context"

// Directory is, in cluster mode, where the sessions of every node are
// recorded (etcd): list and get see the whole cluster through it.
type Directory interface {
	// Records returns tenant's sessions on every node.
	Records(ctx context.Context, tenant string) ([]Record, error)
	// Record returns session id, wherever it is held.
	Record(ctx context.Context, id string) (Record, bool, error)
}

// remote returns p's session id from the directory when this gateway
// does not hold it and it is no longer live (its node failed or was
// lost): such a session can be shown, never used. A live session of
// another node is reached through that node (the cluster relays), so it
// is not found here.
func (m *Manager) remote(ctx context.Context, p Principal, id string) *Session {
	if m.cfg.Directory == nil {
		return nil
	}
	r, ok, err := m.cfg.Directory.Record(ctx, id)
	if err != nil || !ok || r.Tenant != p.Tenant || live(r.Status) {
		return nil
	}
	return sessionFromRecord(r)
}

// withRemote adds to mine, p's sessions on this gateway, those the
// directory has on other nodes. Without the directory (no quorum) the
// list is this gateway's own, and the failure is logged.
func (m *Manager) withRemote(ctx context.Context, p Principal, mine []*Session) []*Session {
	if m.cfg.Directory == nil {
		return mine
	}
	recs, err := m.cfg.Directory.Records(ctx, p.Tenant)
	if err != nil {
		m.log.Warn("directory_unavailable", "err", err)
		return mine
	}
	have := make(map[string]bool, len(mine))
	for _, s := range mine {
		have[s.ID] = true
	}
	for _, r := range recs {
		if !have[r.ID] && r.Tenant == p.Tenant {
			mine = append(mine, sessionFromRecord(r))
		}
	}
	return mine
}

// LostForgetter is a Directory that can drop the record of a session
// whose node is lost (cluster.Node): the one way such a session ends.
type LostForgetter interface {
	// ForgetLost removes tenant's session id from the directory if its
	// node is gone and the session is no longer live; it reports false,
	// changing nothing, for any other session.
	ForgetLost(ctx context.Context, tenant, id string) (bool, error)
}

// deleteRemote deletes p's session id that this gateway does not hold:
// one whose node is lost, which the directory still records (failed). It
// ends like a session deleted on its node: a tombstone (session_gone),
// the audit event and the log line. Any other id is not found.
func (m *Manager) deleteRemote(ctx context.Context, p Principal, id string) error {
	lf, ok := m.cfg.Directory.(LostForgetter)
	s := m.remote(ctx, p, id)
	if !ok || s == nil {
		return m.notFound(p, id)
	}
	forgotten, err := lf.ForgetLost(ctx, p.Tenant, id)
	if err != nil {
		return err
	}
	if !forgotten {
		return m.notFound(p, id)
	}
	m.bury(s, GoneDeleted, &p)
	m.log.InfoContext(ctx, "session_deleted", "session", id, "tenant", p.Tenant, "node", "lost")
	m.auditSession(ctx, s, "deleted", "", p.Tenant)
	return nil
}
