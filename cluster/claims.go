package cluster

import (
	"context"
	"encoding/json"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
func claimOps(r gateway.Record) (cmp []clientv3.Cmp, put []clientv3.Op, get []clientv3.Op) {
	if r.Name != "" && isLive(r.Status) {
		k := keyName(r.Tenant, r.Name)
		cmp = append(cmp, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
		put = append(put, clientv3.OpPut(k, r.ID))
		get = append(get, clientv3.OpGet(k))
	}
	if r.IdempotencyKey != "" {
		k := keyIdem(r.Tenant, r.IdempotencyKey)
		cmp = append(cmp, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
		put = append(put, clientv3.OpPut(k, r.ID))
		get = append(get, clientv3.OpGet(k))
	}
	return cmp, put, get
}

// claimConflict looks at the claims a new record's transaction found
// taken (resps: the answers of claimOps' gets). A claim whose session is
// gone (its name: no longer live; its key: deleted or past the window) is
// removed, and the create tries again (nil); a claim still held is the
// answer.
func (s *Store) claimConflict(ctx context.Context, r gateway.Record, resps []*clientv3.GetResponse) error {
	for _, g := range resps {
		if len(g.Kvs) == 0 {
			continue
		}
		kv := g.Kvs[0]
		holder := string(kv.Value)
		if holder == r.ID {
			continue
		}
		var held bool
		var err error
		if string(kv.Key) == keyName(r.Tenant, r.Name) {
			held, err = s.n.exists(ctx, keyLive(r.Tenant, holder))
		} else {
			held, err = s.n.recentRecord(ctx, r.Tenant, holder)
		}
		if err != nil {
			return unavailable(err)
		}
		if held {
			if string(kv.Key) == keyName(r.Tenant, r.Name) {
				return errNameTaken(r.Name)
			}
			return errKeyElsewhere
		}
		if _, err := s.n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit(); err != nil {
			return unavailable(err)
		}
	}
	return nil
}

func (n *Node) exists(ctx context.Context, key string) (bool, error) {
	resp, err := n.cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return false, err
	}
	return resp.Count > 0, nil
}

// recentRecord reports whether tenant's session id exists and was made
// within the idempotency window.
func (n *Node) recentRecord(ctx context.Context, tenant, id string) (bool, error) {
	resp, err := n.cli.Get(ctx, keyRecord(tenant, id))
	if err != nil || len(resp.Kvs) == 0 {
		return false, err
	}
	var r gateway.Record
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return false, nil
	}
	return time.Since(r.CreatedAt) < gateway.IdempotencyWindow, nil
}

// releaseOps let go of r's claims, each only if r holds it: its name
// once it is not live, its key (with everything) when deleted.
func releaseOps(r gateway.Record, deleted bool) []clientv3.Op {
	var ops []clientv3.Op
	drop := func(k string) {
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", r.ID)}, []clientv3.Op{clientv3.OpDelete(k)}, nil))
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
	resp, err := n.cli.Get(ctx, keyRecord(tenant, id))
	if err != nil || len(resp.Kvs) == 0 {
		return gateway.Record{}, false, err
	}
	var r gateway.Record
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return gateway.Record{}, false, nil
	}
	return r, true, nil
}

// lookupName returns the id of tenant's live session called name ("":
// none).
func (n *Node) lookupName(ctx context.Context, tenant, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	resp, err := n.cli.Get(ctx, keyName(tenant, name))
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}

// lookupIdem returns the id of the session tenant's Idempotency-Key made
// ("": none).
func (n *Node) lookupIdem(ctx context.Context, tenant, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	resp, err := n.cli.Get(ctx, keyIdem(tenant, key))
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}
