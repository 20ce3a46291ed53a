// Package kvtest is the conformance suite of cluster.KV: one suite that
// every implementation of the cluster's store passes (etcd in
// cluster/etcdkv_test.go, the Kubernetes API in cluster/kubestore), each
// against the real server.
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/cluster"
)

// Run runs the suite on kv, under prefix (which no other test uses; each
// subtest has its own keys below it).
func Run(t *testing.T, kv cluster.KV, prefix string) {
	ctx := context.Background()
	t.Run("GetPutRevisions", func(t *testing.T) { getPut(ctx, t, kv, prefix+"gp/") })
	t.Run("ListPrefix", func(t *testing.T) { listPrefix(ctx, t, kv, prefix+"ls/") })
	t.Run("TxnCompareAndSwap", func(t *testing.T) { txnCAS(ctx, t, kv, prefix+"cas/") })
	t.Run("TxnNestedAndValueRange", func(t *testing.T) { txnNested(ctx, t, kv, prefix+"nest/") })
	t.Run("Leases", func(t *testing.T) { leases(ctx, t, kv, prefix+"lease/") })
	t.Run("ExactQuotaUnderContention", func(t *testing.T) { quota(ctx, t, kv, prefix+"quota/") })
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func get(ctx context.Context, t *testing.T, kv cluster.KV, key string) *cluster.KeyValue {
	t.Helper()
	v, err := kv.Get(ctx, key)
	must(t, err)
	return v
}

func getPut(ctx context.Context, t *testing.T, kv cluster.KV, p string) {
	if v := get(ctx, t, kv, p+"a"); v != nil {
		t.Fatalf("absent key: got %+v", v)
	}
	must(t, kv.Put(ctx, p+"a", "one\x00x", 0))
	v1 := get(ctx, t, kv, p+"a")
	if v1 == nil || v1.Value != "one\x00x" || v1.Key != p+"a" || v1.CreateRev == 0 || v1.ModRev != v1.CreateRev || v1.Lease != 0 {
		t.Fatalf("after put: %+v", v1)
	}
	must(t, kv.Put(ctx, p+"a", "two", 0))
	v2 := get(ctx, t, kv, p+"a")
	if v2 == nil || v2.Value != "two" || v2.CreateRev != v1.CreateRev || v2.ModRev <= v1.ModRev {
		t.Fatalf("after second put: %+v (first %+v)", v2, v1)
	}
	r, err := kv.Txn(ctx, nil, []cluster.Op{cluster.OpDelete(p + "a")}, nil)
	if err != nil || !r.Succeeded {
		t.Fatalf("delete: %+v %v", r, err)
	}
	if v := get(ctx, t, kv, p+"a"); v != nil {
		t.Fatalf("deleted key: got %+v", v)
	}
	must(t, kv.Put(ctx, p+"a", "three", 0))
	if v3 := get(ctx, t, kv, p+"a"); v3 == nil || v3.CreateRev <= v2.ModRev || v3.ModRev != v3.CreateRev {
		t.Fatalf("recreated key: %+v (before %+v)", v3, v2)
	}
}

func listPrefix(ctx context.Context, t *testing.T, kv cluster.KV, p string) {
	for _, k := range []string{"a/x", "a/y", "a/b/z", "ab/q", "c"} {
		must(t, kv.Put(ctx, p+k, k, 0))
	}
	got, err := kv.List(ctx, p+"a/")
	must(t, err)
	var keys []string
	for _, g := range got {
		keys = append(keys, g.Key[len(p):])
	}
	if fmt.Sprint(keys) != "[a/b/z a/x a/y]" {
		t.Fatalf("List(a/): %v", keys)
	}
	n, err := kv.Count(ctx, p+"a/")
	must(t, err)
	if n != 3 {
		t.Fatalf("Count(a/) = %d", n)
	}
	all, err := kv.List(ctx, p)
	must(t, err)
	if len(all) != 5 {
		t.Fatalf("List(all) = %d keys", len(all))
	}
	if _, err := kv.Txn(ctx, nil, []cluster.Op{cluster.OpDelete(p + "a/x")}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := kv.Count(ctx, p+"a/"); err != nil || n != 2 {
		t.Fatalf("Count after delete = %d %v", n, err)
	}
}

func txnCAS(ctx context.Context, t *testing.T, kv cluster.KV, p string) {
	k := p + "owner"
	r, err := kv.Txn(ctx, []cluster.Cmp{cluster.CompareCreate(k, "=", 0)},
		[]cluster.Op{cluster.OpPut(k, "me", 0), cluster.OpPut(p+"rec", "data", 0)}, []cluster.Op{cluster.OpGet(k)})
	if err != nil || !r.Succeeded {
		t.Fatalf("first create: %+v %v", r, err)
	}
	r, err = kv.Txn(ctx, []cluster.Cmp{cluster.CompareCreate(k, "=", 0)},
		[]cluster.Op{cluster.OpPut(k, "other", 0)}, []cluster.Op{cluster.OpGet(k), cluster.OpGet(p + "none")})
	must(t, err)
	if r.Succeeded || len(r.Gets) != 2 || r.Gets[0] == nil || r.Gets[0].Value != "me" || r.Gets[1] != nil {
		t.Fatalf("second create: %+v", r)
	}
	cur := get(ctx, t, kv, k)
	// A stale mod revision fails; the current one succeeds; the values
	// of both keys of the transaction moved together.
	must(t, kv.Put(ctx, k, "me2", 0))
	r, err = kv.Txn(ctx, []cluster.Cmp{cluster.CompareMod(k, "=", cur.ModRev)}, []cluster.Op{cluster.OpPut(p+"rec", "stale", 0)}, nil)
	if err != nil || r.Succeeded {
		t.Fatalf("stale compare: %+v %v", r, err)
	}
	now := get(ctx, t, kv, k)
	r, err = kv.Txn(ctx, []cluster.Cmp{cluster.CompareMod(k, "=", now.ModRev), cluster.CompareValue(k, "=", "me2")},
		[]cluster.Op{cluster.OpPut(p+"rec", "fresh", 0), cluster.OpDelete(k)}, nil)
	if err != nil || !r.Succeeded {
		t.Fatalf("fresh compare: %+v %v", r, err)
	}
	if v := get(ctx, t, kv, p+"rec"); v == nil || v.Value != "fresh" || v.ModRev <= now.ModRev {
		t.Fatalf("rec after txn: %+v", v)
	}
	if v := get(ctx, t, kv, k); v != nil {
		t.Fatalf("owner after txn: %+v", v)
	}
	// A compare on an absent key's value fails; its revisions are 0.
	r, err = kv.Txn(ctx, []cluster.Cmp{cluster.CompareValue(k, "=", ""), cluster.CompareMod(k, "=", 0)}, []cluster.Op{cluster.OpPut(p+"x", "x", 0)}, nil)
	if err != nil || r.Succeeded {
		t.Fatalf("value compare of an absent key: %+v %v", r, err)
	}
}

func txnNested(ctx context.Context, t *testing.T, kv cluster.KV, p string) {
	must(t, kv.Put(ctx, p+"name", "sess-1", 0))
	must(t, kv.Put(ctx, p+"idem", "sess-2", 0))
	must(t, kv.Put(ctx, p+"ws", "sess-1\x00node\x00ab", 0))
	drop := func(k, id string) cluster.Op {
		return cluster.OpTxn([]cluster.Cmp{cluster.CompareValue(k, "=", id)}, []cluster.Op{cluster.OpDelete(k)})
	}
	r, err := kv.Txn(ctx, nil, []cluster.Op{cluster.OpPut(p+"rec", "failed", 0), drop(p+"name", "sess-1"), drop(p+"idem", "sess-1")}, nil)
	if err != nil || !r.Succeeded {
		t.Fatalf("txn: %+v %v", r, err)
	}
	if get(ctx, t, kv, p+"name") != nil || get(ctx, t, kv, p+"idem") == nil || get(ctx, t, kv, p+"rec") == nil {
		t.Fatal("nested transactions: the held claim must go, the other stay")
	}
	// The value range of workspaces.go's bySession.
	by := func(s string) []cluster.Cmp {
		return []cluster.Cmp{cluster.CompareValue(p+"ws", ">", s+"\x00"), cluster.CompareValue(p+"ws", "<", s+"\x01")}
	}
	if r, err := kv.Txn(ctx, by("sess-10"), []cluster.Op{cluster.OpDelete(p + "ws")}, nil); err != nil || r.Succeeded {
		t.Fatalf("range of another session: %+v %v", r, err)
	}
	if r, err := kv.Txn(ctx, by("sess-1"), []cluster.Op{cluster.OpDelete(p + "ws")}, nil); err != nil || !r.Succeeded {
		t.Fatalf("range of the session: %+v %v", r, err)
	}
}

func leases(ctx context.Context, t *testing.T, kv cluster.KV, p string) {
	l1, err := kv.Grant(ctx, 2*time.Second)
	must(t, err)
	l2, err := kv.Grant(ctx, 2*time.Second)
	must(t, err)
	if l1 == 0 || l2 == 0 || l1 == l2 {
		t.Fatalf("leases %d %d", l1, l2)
	}
	must(t, kv.Put(ctx, p+"n/a", "a", l1))
	must(t, kv.Put(ctx, p+"n/b", "b", l2))
	if v := get(ctx, t, kv, p+"n/a"); v == nil || v.Lease != l1 {
		t.Fatalf("leased key: %+v", v)
	}
	must(t, kv.KeepAlive(ctx, l1))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := kv.WatchGone(wctx, p+"n/")
	time.Sleep(200 * time.Millisecond) // let the watch start
	must(t, kv.Revoke(ctx, l1))
	if v := get(ctx, t, kv, p+"n/a"); v != nil {
		t.Fatalf("key of a revoked lease: %+v", v)
	}
	if err := kv.KeepAlive(ctx, l1); !errors.Is(err, cluster.ErrLeaseNotFound) {
		t.Fatalf("keepalive of a revoked lease: %v", err)
	}
	select {
	case <-gone:
	case <-time.After(60 * time.Second): // bounds a broken watch only
		t.Fatal("WatchGone did not signal the revoked lease")
	}
	// l2 is left to expire: its key goes, and it cannot be renewed.
	deadline := time.Now().Add(60 * time.Second)
	for get(ctx, t, kv, p+"n/b") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the key of an expired lease is still there")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := kv.KeepAlive(ctx, l2); !errors.Is(err, cluster.ErrLeaseNotFound) {
		t.Fatalf("keepalive of an expired lease: %v", err)
	}
	if n, err := kv.Count(ctx, p+"n/"); err != nil || n != 0 {
		t.Fatalf("Count of the leased keys = %d %v", n, err)
	}
	// A key of an expired lease is absent to a transaction too.
	r, err := kv.Txn(ctx, []cluster.Cmp{cluster.CompareCreate(p+"n/b", "=", 0)}, []cluster.Op{cluster.OpPut(p+"n/b", "again", 0)}, nil)
	if err != nil || !r.Succeeded {
		t.Fatalf("create over an expired key: %+v %v", r, err)
	}
}

// quota: concurrent creates, each counting the live keys and guarded by
// the guard key's revision as store.go's putOnce does, never pass the quota.
func quota(ctx context.Context, t *testing.T, kv cluster.KV, p string) {
	const quota, workers, each = 3, 4, 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := "s" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				for {
					g, err := kv.Get(ctx, p+"guard")
					if err != nil {
						errs <- err
						return
					}
					var rev int64
					if g != nil {
						rev = g.ModRev
					}
					n, err := kv.Count(ctx, p+"live/")
					if err != nil {
						errs <- err
						return
					}
					if n >= quota {
						break
					}
					r, err := kv.Txn(ctx, []cluster.Cmp{cluster.CompareMod(p+"guard", "=", rev)},
						[]cluster.Op{cluster.OpPut(p+"guard", id, 0), cluster.OpPut(p+"live/"+id, "x", 0)}, nil)
					if err != nil {
						errs <- err
						return
					}
					if r.Succeeded {
						mu.Lock()
						created++
						mu.Unlock()
						break
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n, err := kv.Count(ctx, p+"live/")
	must(t, err)
	if n != quota || created != quota {
		t.Fatalf("quota %d: %d live keys, %d creates succeeded", quota, n, created)
	}
}
