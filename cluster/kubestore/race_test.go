package kubestore

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/cluster"
	"github.com/sandgate/sandgate/internal/kubetest"
)

func openTest(t *testing.T, srv *kubetest.Server, ns string) *Store {
	t.Helper()
	s, err := Open(srv.Config, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A writer that stalls between its commit and its apply for longer than a
// tombstone lives must not bring back a key a later transaction deleted:
// the next committer applied its write, the delete left a tombstone, and
// the collector removed it. Its late apply finds no object at all.
func TestLateApplyAfterTombstoneCollected(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	const ns = "late"
	srv.Namespace(t, ns)
	s := openTest(t, srv, ns)
	ctx := context.Background()

	if err := s.Put(ctx, "/late/k", "old", 0); err != nil {
		t.Fatal(err)
	}
	c, err := s.readCommit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	putRev := c.rev
	if _, err := s.Txn(ctx, nil, []cluster.Op{cluster.OpDelete("/late/k")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "/late/other", "x", 0); err != nil {
		t.Fatal(err)
	}
	// What the collector does once the tombstone is tombstoneAge old.
	if err := s.do(ctx, http.MethodDelete, s.cmPath(objName("/late/k")), nil, nil); err != nil {
		t.Fatal(err)
	}
	// The stalled writer of the put wakes up.
	if err := s.applyWrite(ctx, write{Key: "/late/k", Value: "old"}, putRev); err != nil {
		t.Fatal(err)
	}
	kv, err := s.Get(ctx, "/late/k")
	if err != nil {
		t.Fatal(err)
	}
	if kv != nil {
		t.Fatalf("a deleted key came back from a late apply: %+v", *kv)
	}
}

// roundTripper runs before ahead of each request it forwards and after
// once it has the answer.
type roundTripper struct {
	next          http.RoundTripper
	before, after func(*http.Request)
}

func (r roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r.before(req)
	resp, err := r.next.RoundTrip(req)
	r.after(req)
	return resp, err
}

// A Get of a key whose committed write is not applied yet (its writer
// died) returns the committed value even when the next transaction
// commits, applying it, while the Get runs: a key read before that apply
// together with a commit object read after the next commit (whose writes
// are others) would return the value the committed write replaced.
func TestGetSeesCommittedUnappliedWrite(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	const ns = "halfapplied"
	srv.Namespace(t, ns)
	w := openTest(t, srv, ns)
	ctx := context.Background()
	if err := w.Put(ctx, "/h/b", "old", 0); err != nil {
		t.Fatal(err)
	}
	// A transaction committed, its writer gone before applying it.
	c, err := w.readCommit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wj, _ := json.Marshal([]write{{Key: "/h/b", Value: "new"}})
	next := newObject(commitName, c.rv, map[string]string{labelStore: "commit"},
		map[string]string{"rev": strconv.FormatInt(c.rev+1, 10), "writes": string(wj)})
	if err := w.do(ctx, http.MethodPut, w.cmPath(commitName), next, nil); err != nil {
		t.Fatal(err)
	}

	// The reader: its read of the commit object waits for its read of the
	// key (when both are under way at once), then another node commits.
	r := openTest(t, srv, ns)
	keyRead := make(chan struct{})
	var once sync.Once
	var other error
	isGet := func(req *http.Request, name string) bool {
		return req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/"+name)
	}
	r.c.Transport = roundTripper{next: r.c.Transport,
		before: func(req *http.Request) {
			if !isGet(req, commitName) {
				return
			}
			select {
			case <-keyRead:
			case <-time.After(2 * time.Second):
			}
			if other == nil {
				other = w.Put(ctx, "/h/other", "x", 0)
			}
		},
		after: func(req *http.Request) {
			if isGet(req, objName("/h/b")) {
				once.Do(func() { close(keyRead) })
			}
		},
	}
	kv, err := r.Get(ctx, "/h/b")
	if err != nil {
		t.Fatal(err)
	}
	if other != nil {
		t.Fatal(other)
	}
	if kv == nil || kv.Value != "new" {
		t.Fatalf("Get /h/b = %+v, want the committed value new", kv)
	}
}

// Nodes whose clocks disagree by more than a lease's TTL agree on whether
// a lease is alive: a node 30 s behind grants a 10 s lease and puts a key
// on it, and a node with the right time (and one 30 s ahead) sees the key;
// once the lease is revoked, nobody does.
func TestLeaseAliveAcrossClockSkew(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	const ns = "skew"
	srv.Namespace(t, ns)
	behind := openTest(t, srv, ns)
	behind.clock = func() time.Time { return time.Now().Add(-30 * time.Second) }
	right := openTest(t, srv, ns)
	ahead := openTest(t, srv, ns)
	ahead.clock = func() time.Time { return time.Now().Add(30 * time.Second) }
	ctx := context.Background()

	id, err := behind.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := behind.Put(ctx, "/skew/node", "up", id); err != nil {
		t.Fatal(err)
	}
	if err := behind.KeepAlive(ctx, id); err != nil {
		t.Fatalf("keepalive by the node behind: %v", err)
	}
	for name, s := range map[string]*Store{"behind": behind, "right": right, "ahead": ahead} {
		kv, err := s.Get(ctx, "/skew/node")
		if err != nil {
			t.Fatal(err)
		}
		if kv == nil {
			t.Errorf("the node %s does not see a key on a live lease", name)
		}
	}
	if err := behind.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if kv, err := right.Get(ctx, "/skew/node"); err != nil || kv != nil {
		t.Errorf("a key on a revoked lease: %+v %v", kv, err)
	}
}

// A List never shows half of a transaction: while it lists, another node
// commits a transaction writing two keys and applies one of them (then
// stalls). The list holds both new values.
func TestListSeesNoHalfAppliedTransaction(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	const ns = "halflist"
	srv.Namespace(t, ns)
	w := openTest(t, srv, ns)
	ctx := context.Background()
	if _, err := w.Txn(ctx, nil, []cluster.Op{cluster.OpPut("/l/a", "old", 0), cluster.OpPut("/l/b", "old", 0)}, nil); err != nil {
		t.Fatal(err)
	}
	r := openTest(t, srv, ns)
	var once sync.Once
	var other error
	r.c.Transport = roundTripper{next: r.c.Transport,
		before: func(req *http.Request) {
			if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/secrets") {
				return
			}
			once.Do(func() {
				// The other node commits a and b, applies a, and stalls.
				c, err := w.readCommit(ctx)
				if err != nil {
					other = err
					return
				}
				writes := []write{{Key: "/l/a", Value: "new"}, {Key: "/l/b", Value: "new"}}
				wj, _ := json.Marshal(writes)
				next := newObject(commitName, c.rv, map[string]string{labelStore: "commit"},
					map[string]string{"rev": strconv.FormatInt(c.rev+1, 10), "writes": string(wj)})
				if other = w.do(ctx, http.MethodPut, w.cmPath(commitName), next, nil); other == nil {
					other = w.applyWrite(ctx, writes[0], c.rev+1)
				}
			})
		},
		after: func(*http.Request) {},
	}
	kvs, err := r.List(ctx, "/l/")
	if err != nil {
		t.Fatal(err)
	}
	if other != nil {
		t.Fatal(other)
	}
	got := map[string]string{}
	for _, kv := range kvs {
		got[kv.Key] = kv.Value
	}
	if got["/l/a"] != got["/l/b"] {
		t.Fatalf("List saw half a transaction: %v", got)
	}
}

// A value too large for the Secret that holds the transaction is refused
// with an error naming the bound, and nothing of it is written.
func TestValueOverSecretSize(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	const ns = "big"
	srv.Namespace(t, ns)
	s := openTest(t, srv, ns)
	ctx := context.Background()
	err := s.Put(ctx, "/big/k", strings.Repeat("x", 1<<20), 0)
	if err == nil || !strings.Contains(err.Error(), "over the store's") {
		t.Fatalf("Put of 1 MiB: %v", err)
	}
	if kv, err := s.Get(ctx, "/big/k"); err != nil || kv != nil {
		t.Fatalf("Get after a refused Put: %+v %v", kv, err)
	}
	if err := s.Put(ctx, "/big/k", strings.Repeat("x", 512<<10), 0); err != nil {
		t.Fatalf("Put of 512 KiB: %v", err)
	}
}
