package cluster_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sandgate/sandgate/cluster"
	"github.com/sandgate/sandgate/gateway"
)

func etcdClient(t *testing.T, e *etcd1) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.client}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func openNodeAt(t *testing.T, e *etcd1, id, url, token string) *cluster.Node {
	t.Helper()
	n, err := cluster.Open(context.Background(), cluster.Config{Endpoints: []string{e.client}, NodeID: id,
		Advertise: url, Token: token, OpTimeout: time.Second, Log: slog.New(slog.DiscardHandler)}, func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(false) })
	return n
}

// peerServer counts the requests a (would-be) node receives, and whether
// any carried a credential.
type peerServer struct {
	hits, creds atomic.Int32
	url         string
}

func newPeer(t *testing.T) *peerServer {
	p := &peerServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		if r.Header.Get("Authorization") != "" || r.Header.Get(cluster.TokenHeader) != "" {
			p.creds.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"events":[]}`))
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// Only nodes that hold the cluster token are members: a record written
// straight into etcd, unsigned or signed with another token, is refused,
// so that whoever can write etcd cannot receive relayed bearer tokens and
// the cluster token. A malformed owner record is never cached.
func TestNodeRecordsSigned(t *testing.T) {
	e := startEtcd1(t)
	cli := etcdClient(t, e)
	const token = "0123456789abcdef"
	a := openNodeAt(t, e, "node-a", "http://127.0.0.1:1", token)
	openNodeAt(t, e, "node-b", "http://127.0.0.1:2", token)
	openNodeAt(t, e, "node-x", "http://127.0.0.1:3", "another-token-0123456789")
	evil := newPeer(t)
	ctx := context.Background()
	plain, _ := json.Marshal(cluster.Info{ID: "evil", URL: evil.url, MaxSessions: 1000, Updated: time.Now()})
	if _, err := cli.Put(ctx, cluster.Prefix+"nodes/evil", string(plain)); err != nil {
		t.Fatal(err)
	}
	// node-b's own signed record, copied under another key.
	b, err := cli.Get(ctx, cluster.Prefix+"nodes/node-b")
	if err != nil || len(b.Kvs) == 0 {
		t.Fatalf("node-b's record: %v", err)
	}
	if _, err := cli.Put(ctx, cluster.Prefix+"nodes/node-c", string(b.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	infos, err := a.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range infos {
		ids = append(ids, i.ID)
	}
	if strings.Join(ids, ",") != "node-a,node-b" {
		t.Fatalf("nodes %v, want node-a,node-b only (not evil, node-c, node-x)", ids)
	}

	// The audit fan-out asks members only, and only for an authenticated
	// caller.
	local := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"events":[]}`))
	})
	ver, err := gateway.NewVerifier(gateway.AuthConfig{APIKeys: map[string]string{"good-token": "t"}})
	if err != nil {
		t.Fatal(err)
	}
	f := cluster.NewFront(cluster.FrontConfig{Node: a, Verifier: ver, Local: local,
		WriteError: func(w http.ResponseWriter, err error) { w.WriteHeader(http.StatusServiceUnavailable) },
		Log:        slog.New(slog.DiscardHandler)})
	for _, tc := range []struct {
		token string
		want  int
	}{{"bad-token", http.StatusUnauthorized}, {"good-token", 0}} {
		req := httptest.NewRequest(http.MethodGet, "/v1/audit", nil)
		req.Header.Set("Authorization", "Bearer "+tc.token)
		rec := httptest.NewRecorder()
		f.ServeHTTP(rec, req)
		if tc.want != 0 && rec.Code != tc.want {
			t.Errorf("audit with %s: %d, want %d", tc.token, rec.Code, tc.want)
		}
	}
	if evil.hits.Load() != 0 || evil.creds.Load() != 0 {
		t.Errorf("the unsigned node got %d requests (%d with credentials)", evil.hits.Load(), evil.creds.Load())
	}

	// A malformed owner record fails the lookup, and is read again next
	// time: once repaired, it is seen.
	if _, err := cli.Put(ctx, cluster.Prefix+"owner/sbx-malformed", "no separator"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Record(ctx, "sbx-malformed"); err == nil {
		t.Fatal("a malformed owner record was taken")
	}
	if _, err := cli.Put(ctx, cluster.Prefix+"owner/sbx-malformed", "t\x00node-b"); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(gateway.Record{ID: "sbx-malformed", Tenant: "t"})
	if _, err := cli.Put(ctx, cluster.Prefix+"sessions/t/sbx-malformed", string(rec)); err != nil {
		t.Fatal(err)
	}
	if _, found, err := a.Record(ctx, "sbx-malformed"); err != nil {
		t.Fatalf("after the repair: %v (found %v)", err, found)
	}
}

// docs/cluster.md's recipe: etcd with auth on, and the nodes' user
// limited to the cluster's prefix. A node joins, sees itself and sweeps
// with that user alone; without credentials it cannot join.
func TestNodeWithEtcdAuth(t *testing.T) {
	e := startEtcd1(t)
	cli := etcdClient(t, e)
	ctx := context.Background()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "sandgate"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "sandgate", cluster.Prefix, clientv3.GetPrefixRangeEnd(cluster.Prefix),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, "sandgate", "node-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "sandgate", "sandgate"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("etcd auth step %d: %v", i, err)
		}
	}
	cfg := cluster.Config{Endpoints: []string{e.client}, NodeID: "node-auth", Advertise: "http://127.0.0.1:1",
		Token: "0123456789abcdef", OpTimeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}
	if n, err := cluster.Open(ctx, cfg, func() int { return 0 }); err == nil {
		n.Close(false)
		t.Fatal("a node without etcd credentials joined")
	}
	cfg.Username, cfg.Password = "sandgate", "node-password"
	n, err := cluster.Open(ctx, cfg, func() int { return 0 })
	if err != nil {
		t.Fatalf("join with the cluster's etcd user: %v", err)
	}
	defer n.Close(true)
	infos, err := n.Nodes(ctx)
	if err != nil || len(infos) != 1 || infos[0].ID != "node-auth" {
		t.Fatalf("nodes %+v, %v", infos, err)
	}
	if _, err := n.SweepOnce(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if _, _, err := n.Record(ctx, "sbx-none"); err != nil {
		t.Fatalf("record: %v", err)
	}
}

// A signed node record is bound to the etcd lease it was written on: the
// record of a node that left, written back by whoever can write etcd
// (with no lease, or a lease of their own), is refused, as is a
// restarting marker that no node with the token signed, which would
// otherwise keep a lost node's sessions from being marked failed. A
// node's own restarting marker holds.
func TestNodeRecordsBoundToLease(t *testing.T) {
	e := startEtcd1(t)
	cli := etcdClient(t, e)
	const token = "0123456789abcdef"
	ctx := context.Background()
	a := openNodeAt(t, e, "node-a", "http://127.0.0.1:1", token)
	open := func(id string) *cluster.Node {
		n, err := cluster.Open(ctx, cluster.Config{Endpoints: []string{e.client}, NodeID: id, Advertise: "http://127.0.0.1:2",
			Token: token, OpTimeout: time.Second, RestartGrace: time.Minute, Log: slog.New(slog.DiscardHandler)}, func() int { return 0 })
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	b := open("node-b")
	got, err := cli.Get(ctx, cluster.Prefix+"nodes/node-b")
	if err != nil || len(got.Kvs) == 0 {
		t.Fatalf("node-b's record: %v", err)
	}
	saved := string(got.Kvs[0].Value)
	b.Close(false)
	members := func() string {
		infos, err := a.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, i := range infos {
			ids = append(ids, i.ID)
		}
		return strings.Join(ids, ",")
	}
	if _, err := cli.Put(ctx, cluster.Prefix+"nodes/node-b", saved); err != nil {
		t.Fatal(err)
	}
	if m := members(); m != "node-a" {
		t.Errorf("node-b's record replayed with no lease: members %s, want node-a", m)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, cluster.Prefix+"nodes/node-b", saved, clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	if m := members(); m != "node-a" {
		t.Errorf("node-b's record replayed on another lease: members %s, want node-a", m)
	}

	// Sessions of node-q (lost, with a forged restarting marker, and a
	// replayed record of node-b's name) and of node-c (restarting for real).
	live := func(id, node string) {
		r := gateway.Record{ID: id, Tenant: "t"}
		r.Status = gateway.StatusRunning
		rec, _ := json.Marshal(r)
		if _, err := cli.Put(ctx, cluster.Prefix+"sessions/t/"+id, string(rec)); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, cluster.Prefix+"live/t/"+id, node); err != nil {
			t.Fatal(err)
		}
	}
	c := open("node-c")
	c.Close(true)
	if _, err := cli.Put(ctx, cluster.Prefix+"restarting/node-q", time.Now().UTC().Format(time.RFC3339)); err != nil {
		t.Fatal(err)
	}
	live("sbx-q", "node-q")
	live("sbx-b", "node-b")
	live("sbx-c", "node-c")
	// (node-a's own sweeper may run too: the statuses tell.)
	if _, err := a.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"sbx-q": gateway.StatusFailed, "sbx-b": gateway.StatusFailed, "sbx-c": gateway.StatusRunning} {
		r, err := cli.Get(ctx, cluster.Prefix+"sessions/t/"+id)
		if err != nil || len(r.Kvs) == 0 {
			t.Fatalf("%s: %v", id, err)
		}
		var rec gateway.Record
		if err := json.Unmarshal(r.Kvs[0].Value, &rec); err != nil || string(rec.Status) != want {
			t.Errorf("%s: status %q, want %q", id, rec.Status, want)
		}
	}
}
