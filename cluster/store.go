package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/sandgate/sandgate/gateway"
)

// Store is the gateway.Store of a node: every write goes to etcd first
// (where it is the truth the whole cluster reads) and then to the node's
// local store, which is only a cache of the node's own sessions for its
// next start.
type Store struct {
	n     *Node
	local gateway.Store

	mu sync.Mutex
	// unsaved are writes of this node's existing sessions that etcd missed
	// (no quorum): the newest record of each, or nil for a delete. They
	// are written again once etcd answers (flush), so etcd does not keep
	// a session this node ended while it could not be reached.
	unsaved map[string]*gateway.Record
}

// Store returns the node's store over local (the node's bolt file).
func (n *Node) Store(local gateway.Store) *Store {
	s := &Store{n: n, local: local, unsaved: map[string]*gateway.Record{}}
	n.mu.Lock()
	n.store = s
	n.mu.Unlock()
	return s
}

// remember keeps a write etcd missed, for a session this node holds.
func (s *Store) remember(id string, r *gateway.Record) {
	if o, ok := s.n.cachedOwner(id); !ok || o.node != s.n.cfg.NodeID {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unsaved[id] = r
}

func (s *Store) saved(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.unsaved, id)
}

// flush writes again what etcd missed; what fails stays for next time.
func (s *Store) flush() {
	s.mu.Lock()
	todo := s.unsaved
	s.unsaved = map[string]*gateway.Record{}
	s.mu.Unlock()
	for id, r := range todo {
		var err error
		if r == nil {
			err = s.deleteEtcd(id)
		} else {
			err = s.put(*r)
		}
		if err != nil {
			if ge, ok := errors.AsType[*gateway.Error](err); ok && ge.Code != ErrUnavailable.Code {
				continue // refused for good (another node took it over)
			}
			s.mu.Lock()
			if _, newer := s.unsaved[id]; !newer {
				s.unsaved[id] = r
			}
			s.mu.Unlock()
		}
	}
}

func tenantKey(t string) string { return url.PathEscape(t) }

func keyOwner(id string) string        { return Prefix + "owner/" + id }
func keyRecord(t, id string) string    { return Prefix + "sessions/" + tenantKey(t) + "/" + id }
func keyLive(t, id string) string      { return Prefix + "live/" + tenantKey(t) + "/" + id }
func keyGuard(t string) string         { return Prefix + "guard/" + tenantKey(t) }
func keyTombstone(id string) string    { return Prefix + "tombstones/" + id }
func ownerValue(t, node string) string { return t + "\x00" + node }

// ErrUnavailable is the answer while etcd cannot be reached (no quorum).
var ErrUnavailable = &gateway.Error{Kind: gateway.KindUnavailable, Code: "cluster_unavailable",
	Message: "the cluster's shared store (etcd, or the Kubernetes API with --cluster-kube) cannot be reached, so no session can be created or changed now; running sessions keep working; retry later"}

// unavailable wraps an etcd failure as cluster_unavailable.
func unavailable(err error) error {
	e := *ErrUnavailable
	e.Err = err
	return &e
}

func isLive(status string) bool {
	return status == gateway.StatusRunning || status == gateway.StatusStopped || status == gateway.StatusPaused
}

// Put records recs in etcd, then in the local cache. A record new to the
// cluster that is live takes one of its tenant's session slots, exactly:
// the count of the tenant's live sessions and the write happen in one
// transaction guarded by the tenant's guard key, so of concurrent creates
// on any nodes at most the quota succeed (the others are quota_exceeded).
func (s *Store) Put(recs ...gateway.Record) error {
	for _, r := range recs {
		if err := s.put(r); err != nil {
			if ge, ok := errors.AsType[*gateway.Error](err); ok && ge.Code == ErrUnavailable.Code {
				s.remember(r.ID, &r)
			}
			return err
		}
		s.saved(r.ID)
	}
	return s.local.Put(recs...)
}

func (s *Store) put(r gateway.Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	me := ownerValue(r.Tenant, s.n.cfg.NodeID)
	for range 64 { // retried only when another create of the tenant raced us
		ctx, cancel := s.n.op()
		done, err := s.putOnce(ctx, r, string(data), me)
		cancel()
		if err != nil || done {
			return err
		}
	}
	return unavailable(errors.New("too much contention on the tenant's session count"))
}

func (s *Store) putOnce(ctx context.Context, r gateway.Record, data, me string) (bool, error) {
	ok, live := keyOwner(r.ID), keyLive(r.Tenant, r.ID)
	cur, err := s.n.cli.Get(ctx, ok)
	if err != nil {
		return false, unavailable(err)
	}
	if cur != nil { // known: only its owner writes it
		if cur.Value != me {
			return false, &gateway.Error{Kind: gateway.KindConflict, Code: "session_not_owned", Message: "the session is held by another node"}
		}
		ops := []Op{OpPut(keyRecord(r.Tenant, r.ID), data, 0)}
		if isLive(r.Status) {
			ops = append(ops, OpPut(live, s.n.cfg.NodeID, 0))
		} else {
			ops = append(ops, OpDelete(live))
		}
		// A session another node marked failed (this node was taken for
		// lost) stays failed: its live key is gone.
		ops = append(ops, releaseOps(r, false)...)
		cmp := []Cmp{CompareValue(ok, "=", me)}
		if isLive(r.Status) {
			cmp = append(cmp, CompareCreate(live, ">", 0))
		}
		tr, err := s.n.cli.Txn(ctx, cmp, ops, nil)
		if err != nil {
			return false, unavailable(err)
		}
		if !tr.Succeeded {
			return false, &gateway.Error{Kind: gateway.KindConflict, Code: "session_not_owned", Message: "the session was taken over by the cluster (its node was taken for lost)"}
		}
		return true, nil
	}
	// New: count the tenant's live sessions at the guard's revision.
	g, err := s.n.cli.Get(ctx, keyGuard(r.Tenant))
	if err != nil {
		return false, unavailable(err)
	}
	var guardRev int64
	if g != nil {
		guardRev = g.ModRev
	}
	if isLive(r.Status) && s.n.cfg.MaxSessionsPerTenant > 0 {
		c, err := s.n.cli.Count(ctx, Prefix+"live/"+tenantKey(r.Tenant)+"/")
		if err != nil {
			return false, unavailable(err)
		}
		if c >= int64(s.n.cfg.MaxSessionsPerTenant) {
			return false, &gateway.Error{Kind: gateway.KindQuota, Code: "quota_exceeded",
				Message: fmt.Sprintf("tenant session limit reached across the cluster (max-sessions-per-tenant=%d)", s.n.cfg.MaxSessionsPerTenant)}
		}
	}
	ops := []Op{
		OpPut(ok, me, 0),
		OpPut(keyRecord(r.Tenant, r.ID), data, 0),
		OpPut(keyGuard(r.Tenant), r.ID, 0),
	}
	if isLive(r.Status) {
		ops = append(ops, OpPut(live, s.n.cfg.NodeID, 0))
	}
	claimCmp, claimPut, claimGet := claimOps(r)
	wsCmp, wsGet := workspaceClaimOps(r) // workspaces.go
	claimCmp, claimGet = append(claimCmp, wsCmp...), append(claimGet, wsGet...)
	tr, err := s.n.cli.Txn(ctx, append([]Cmp{
		CompareCreate(ok, "=", 0),
		CompareMod(keyGuard(r.Tenant), "=", guardRev),
	}, claimCmp...), append(ops, claimPut...), claimGet)
	if err != nil {
		return false, unavailable(err)
	}
	if tr.Succeeded {
		s.n.cacheOwner(r.ID, owner{r.Tenant, s.n.cfg.NodeID})
		return true, nil
	}
	// The guard moved (another create: count again), or a claim is taken.
	resps := tr.Gets
	if resps, err = workspaceConflict(r, resps); err != nil {
		return false, err
	}
	return false, s.claimConflict(ctx, r, resps)
}

// Delete removes session id from etcd (its record, ownership and live
// key) and from the local cache.
func (s *Store) Delete(id string) error {
	if err := s.deleteEtcd(id); err != nil {
		s.remember(id, nil)
		_ = s.local.Delete(id)
		return err
	}
	s.saved(id)
	s.n.forgetOwner(id)
	return s.local.Delete(id)
}

func (s *Store) deleteEtcd(id string) error {
	ctx, cancel := s.n.op()
	defer cancel()
	o, err := s.n.lookupOwner(ctx, id)
	if err != nil {
		return unavailable(err)
	}
	if o.node != "" {
		if err := s.n.dropSession(ctx, o, id); err != nil {
			return unavailable(err)
		}
	}
	return nil
}

// dropSession removes session id, held by o, from etcd: its ownership,
// record, live key and claims (claims.go).
func (n *Node) dropSession(ctx context.Context, o owner, id string) error {
	rec, found, err := n.recordOf(ctx, o.tenant, id)
	if err != nil {
		return err
	}
	ops := []Op{OpDelete(keyOwner(id)), OpDelete(keyRecord(o.tenant, id)), OpDelete(keyLive(o.tenant, id))}
	if found {
		ops = append(ops, releaseOps(rec, true)...)
	}
	_, err = n.cli.Txn(ctx, []Cmp{CompareValue(keyOwner(id), "=", ownerValue(o.tenant, o.node))}, ops, nil)
	return err
}

// All returns this node's sessions for Restore: those of the local cache,
// each as etcd has it now (another node may have marked it failed while
// this node was away; one etcd no longer knows is dropped, and its
// sandbox removed). Without etcd the local cache is all there is.
func (s *Store) All() ([]gateway.Record, error) {
	recs, err := s.local.All()
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		s.n.cacheOwner(r.ID, owner{r.Tenant, s.n.cfg.NodeID})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.n.cfg.OpTimeout)
	defer cancel()
	out := recs[:0]
	for _, r := range recs {
		kv, err := s.n.cli.Get(ctx, keyRecord(r.Tenant, r.ID))
		if err != nil {
			s.n.log.Warn("cluster_restore_from_cache", "err", err)
			return recs, nil
		}
		if kv == nil {
			continue
		}
		var er gateway.Record
		if json.Unmarshal([]byte(kv.Value), &er) != nil {
			continue
		}
		if !isLive(er.Status) {
			r.Status, r.StatusReason = er.Status, er.StatusReason
		}
		out = append(out, r)
	}
	return out, nil
}

// Close closes the local cache.
func (s *Store) Close() error { return s.local.Close() }

// PutTombstone keeps t in etcd, where every node finds it.
func (s *Store) PutTombstone(t gateway.Tombstone) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	ctx, cancel := s.n.op()
	defer cancel()
	if err := s.n.cli.Put(ctx, keyTombstone(t.ID), string(data), 0); err != nil {
		return unavailable(err)
	}
	return nil
}

// DeleteTombstones drops tombstones from etcd.
func (s *Store) DeleteTombstones(ids ...string) error {
	ctx, cancel := s.n.op()
	defer cancel()
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 100)]
		ids = ids[len(batch):]
		ops := make([]Op, 0, len(batch))
		for _, id := range batch {
			ops = append(ops, OpDelete(keyTombstone(id)))
		}
		if _, err := s.n.cli.Txn(ctx, nil, ops, nil); err != nil {
			return unavailable(err)
		}
	}
	return nil
}

// Tombstones returns every tombstone of the cluster.
func (s *Store) Tombstones() ([]gateway.Tombstone, error) {
	ctx, cancel := s.n.op()
	defer cancel()
	kvs, err := s.n.cli.List(ctx, Prefix+"tombstones/")
	if err != nil {
		return nil, unavailable(err)
	}
	out := make([]gateway.Tombstone, 0, len(kvs))
	for _, kv := range kvs {
		var t gateway.Tombstone
		if json.Unmarshal([]byte(kv.Value), &t) == nil {
			out = append(out, t)
		}
	}
	return out, nil
}

// Tombstone returns session id's tombstone, if any.
func (n *Node) Tombstone(ctx context.Context, id string) (gateway.Tombstone, bool, error) {
	kv, err := n.cli.Get(ctx, keyTombstone(id))
	if err != nil || kv == nil {
		return gateway.Tombstone{}, false, err
	}
	var t gateway.Tombstone
	if err := json.Unmarshal([]byte(kv.Value), &t); err != nil {
		return gateway.Tombstone{}, false, err
	}
	return t, true, nil
}

// Records returns tenant's sessions as etcd has them (gateway.Directory).
func (n *Node) Records(ctx context.Context, tenant string) ([]gateway.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	kvs, err := n.cli.List(ctx, Prefix+"sessions/"+tenantKey(tenant)+"/")
	if err != nil {
		return nil, unavailable(err)
	}
	out := make([]gateway.Record, 0, len(kvs))
	for _, kv := range kvs {
		var r gateway.Record
		if json.Unmarshal([]byte(kv.Value), &r) == nil && r.Tenant == tenant {
			out = append(out, r)
		}
	}
	return out, nil
}

// Record returns session id as etcd has it (gateway.Directory).
func (n *Node) Record(ctx context.Context, id string) (gateway.Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	o, err := n.lookupOwner(ctx, id)
	if err != nil {
		return gateway.Record{}, false, unavailable(err)
	}
	if o.node == "" {
		return gateway.Record{}, false, nil
	}
	kv, err := n.cli.Get(ctx, keyRecord(o.tenant, id))
	if err != nil {
		return gateway.Record{}, false, unavailable(err)
	}
	if kv == nil {
		return gateway.Record{}, false, nil
	}
	var r gateway.Record
	if err := json.Unmarshal([]byte(kv.Value), &r); err != nil {
		return gateway.Record{}, false, err
	}
	return r, true, nil
}

// lookupOwner returns who holds session id (zero owner: nobody, the
// session is unknown). Owners are cached: they never change.
func (n *Node) lookupOwner(ctx context.Context, id string) (owner, error) {
	n.mu.Lock()
	o, ok := n.owners[id]
	n.mu.Unlock()
	if ok {
		return o, nil
	}
	kv, err := n.cli.Get(ctx, keyOwner(id))
	if err != nil {
		return owner{}, err
	}
	if kv == nil {
		return owner{}, nil
	}
	t, node, ok := strings.Cut(kv.Value, "\x00")
	if !ok || t == "" || node == "" || strings.ContainsRune(node, 0) {
		// Never cached: a node that wrote it right later, or an operator
		// who repairs it, is seen at the next lookup.
		n.log.Warn("cluster_owner_malformed", "session", id)
		return owner{}, fmt.Errorf("cluster: the owner record of session %s is malformed", id)
	}
	o = owner{t, node}
	n.cacheOwner(id, o)
	return o, nil
}

// maxCachedOwners bounds the owner cache; past it, it starts afresh.
const maxCachedOwners = 100_000

func (n *Node) cachedOwner(id string) (owner, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	o, ok := n.owners[id]
	return o, ok
}

func (n *Node) cacheOwner(id string, o owner) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.owners) >= maxCachedOwners {
		n.owners = map[string]owner{}
	}
	n.owners[id] = o
}

func (n *Node) forgetOwner(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.owners, id)
}

// Forget removes a session whose node is gone (its record is failed) on
// behalf of its tenant: the record, its ownership and its live key.
func (n *Node) Forget(ctx context.Context, o owner, id string) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	if err := n.dropSession(ctx, o, id); err != nil {
		return unavailable(err)
	}
	n.forgetOwner(id)
	return nil
}

// ForgetLost removes tenant's session id if its node is gone (not live,
// not restarting within its grace) and its record is no longer live: the
// delete of a session whose node was lost (gateway.LostForgetter). It
// reports false, changing nothing, for any other session.
func (n *Node) ForgetLost(ctx context.Context, tenant, id string) (bool, error) {
	o, err := n.lookupOwner(ctx, id)
	if err != nil {
		return false, unavailable(err)
	}
	if o.node == "" || o.tenant != tenant || o.node == n.ID() {
		return false, nil
	}
	if _, live := n.peer(o.node); live || n.restarting(o.node) {
		return false, nil
	}
	rec, found, err := n.Record(ctx, id)
	if err != nil {
		return false, err
	}
	if !found || rec.Tenant != tenant || isLive(rec.Status) {
		return false, nil
	}
	if err := n.Forget(ctx, o, id); err != nil {
		return false, err
	}
	return true, nil
}
