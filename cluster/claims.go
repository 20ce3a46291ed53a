package cluster

import (
	"context"
	"encoding/json"
	"net/url"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// Session names and idempotency keys are unique across the cluster, not
// per node: a session's create writes them, in the same etcd transaction
// as its record, as keys that must not exist yet:
//
//	names/<tenant>/<name>  the id of the tenant's live session of that name
//	idem/<tenant>/<key>    the id of the session the tenant's Idempotency-Key made
//
// A name is let go when its session stops being live (ended, failed or
// marked lost), a key when its session is deleted; a claim whose session
// is gone (a crash between the two writes) is taken over by the next
// create that finds it.

func keyName(t, name string) string { return Prefix + "names/" + tenantKey(t) + "/" + name }
func keyIdem(t, key string) string {
	return Prefix + "idem/" + tenantKey(t) + "/" + url.PathEscape(key)
}

// errNameTaken is the single-node answer (gateway/names.go) for a name a
// live session of the tenant on another node has.
func errNameTaken(name string) error {
	return &gateway.Error{Kind: gateway.KindConflict, Code: "name_taken",
		Message: "the name \"" + name + "\" is taken by another live session of yours; delete it or choose another name"}
}

// errKeyElsewhere answers a create whose Idempotency-Key a create on
// another node took at the same moment: retried, it reaches that session.
var errKeyElsewhere = &gateway.Error{Kind: gateway.KindConflict, Code: "idempotency_key_in_progress", RetryAfter: time.Second,
	Message: "a request with this Idempotency-Key is in progress on another node of the cluster; retry later"}

// claimOps are the compares and writes of a new record's name and key.
func claimOps(r gateway.Record) (cmp []Cmp, put []Op, get []Op) {
	if r.Name != "" && isLive(r.Status) {
		k := keyName(r.Tenant, r.Name)
		cmp = append(cmp, CompareCreate(k, "=", 0))
		put = append(put, OpPut(k, r.ID, 0))
		get = append(get, OpGet(k))
	}
	if r.IdempotencyKey != "" {
		k := keyIdem(r.Tenant, r.IdempotencyKey)
		cmp = append(cmp, CompareCreate(k, "=", 0))
		put = append(put, OpPut(k, r.ID, 0))
		get = append(get, OpGet(k))
	}
	return cmp, put, get
}

// claimConflict looks at the claims a new record's transaction found
// taken (resps: the answers of claimOps' gets). A claim whose session is
// gone (its name: no longer live; its key: deleted or past the window) is
// removed, and the create tries again (nil); a claim still held is the
// answer.
func (s *Store) claimConflict(ctx context.Context, r gateway.Record, resps []*KeyValue) error {
	for _, kv := range resps {
		if kv == nil {
			continue
		}
		holder := kv.Value
		if holder == r.ID {
			continue
		}
		var held bool
		var err error
		if kv.Key == keyName(r.Tenant, r.Name) {
			held, err = s.n.exists(ctx, keyLive(r.Tenant, holder))
		} else {
			held, err = s.n.recentRecord(ctx, r.Tenant, holder)
		}
		if err != nil {
			return unavailable(err)
		}
		if held {
			if kv.Key == keyName(r.Tenant, r.Name) {
				return errNameTaken(r.Name)
			}
			return errKeyElsewhere
		}
		if _, err := s.n.cli.Txn(ctx, []Cmp{CompareMod(kv.Key, "=", kv.ModRev)}, []Op{OpDelete(kv.Key)}, nil); err != nil {
			return unavailable(err)
		}
	}
	return nil
}

func (n *Node) exists(ctx context.Context, key string) (bool, error) {
	kv, err := n.cli.Get(ctx, key)
	if err != nil {
		return false, err
	}
	return kv != nil, nil
}

// recentRecord reports whether tenant's session id exists and was made
// within the idempotency window.
func (n *Node) recentRecord(ctx context.Context, tenant, id string) (bool, error) {
	kv, err := n.cli.Get(ctx, keyRecord(tenant, id))
	if err != nil || kv == nil {
		return false, err
	}
	var r gateway.Record
	if err := json.Unmarshal([]byte(kv.Value), &r); err != nil {
		return false, nil
	}
	return time.Since(r.CreatedAt) < gateway.IdempotencyWindow, nil
}

// releaseOps let go of r's claims, each only if r holds it: its name
// once it is not live, its key (with everything) when deleted.
func releaseOps(r gateway.Record, deleted bool) []Op {
	var ops []Op
	drop := func(k string) {
		ops = append(ops, OpTxn([]Cmp{CompareValue(k, "=", r.ID)}, []Op{OpDelete(k)}))
	}
	if r.Name != "" && (deleted || !isLive(r.Status)) {
		drop(keyName(r.Tenant, r.Name))
	}
	if r.IdempotencyKey != "" && deleted {
		drop(keyIdem(r.Tenant, r.IdempotencyKey))
	}
	return ops
}

// recordOf reads tenant's session id from etcd (found false: none).
func (n *Node) recordOf(ctx context.Context, tenant, id string) (gateway.Record, bool, error) {
	kv, err := n.cli.Get(ctx, keyRecord(tenant, id))
	if err != nil || kv == nil {
		return gateway.Record{}, false, err
	}
	var r gateway.Record
	if err := json.Unmarshal([]byte(kv.Value), &r); err != nil {
		return gateway.Record{}, false, nil
	}
	return r, true, nil
}

// lookupName returns the id of tenant's live session called name ("":
// none).
func (n *Node) lookupName(ctx context.Context, tenant, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	kv, err := n.cli.Get(ctx, keyName(tenant, name))
	if err != nil || kv == nil {
		return "", err
	}
	return kv.Value, nil
}

// lookupIdem returns the id of the session tenant's Idempotency-Key made
// ("": none).
func (n *Node) lookupIdem(ctx context.Context, tenant, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	kv, err := n.cli.Get(ctx, keyIdem(tenant, key))
	if err != nil || kv == nil {
		return "", err
	}
	return kv.Value, nil
}
