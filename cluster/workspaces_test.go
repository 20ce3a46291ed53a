package cluster_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sandgate/sandgate/cluster"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/workspace"
)

// etcd1 is a single real etcd member (Debian's etcd-server), enough for
// the workspace claims' unit tests.
type etcd1 struct {
	bin, dir, client, peer string
	cmd                    *exec.Cmd
	done                   chan struct{}
}

// startEtcd1 runs one etcd member; it skips where there is no etcd, and
// fails under CI=true.
func startEtcd1(t *testing.T) *etcd1 {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("etcd is not installed (apt-get install etcd-server)")
		}
		t.Skip("etcd is not installed (apt-get install etcd-server)")
	}
	e := &etcd1{bin: bin, dir: t.TempDir(),
		client: fmt.Sprintf("http://127.0.0.1:%d", gwtest.FreePort(t)), peer: fmt.Sprintf("http://127.0.0.1:%d", gwtest.FreePort(t))}
	e.start(t)
	t.Cleanup(e.stop)
	return e
}

func (e *etcd1) start(t *testing.T) {
	t.Helper()
	e.cmd = exec.Command(e.bin, "--name", "m0", "--data-dir", e.dir,
		"--listen-client-urls", e.client, "--advertise-client-urls", e.client,
		"--listen-peer-urls", e.peer, "--initial-advertise-peer-urls", e.peer,
		"--initial-cluster", "m0="+e.peer, "--logger", "zap", "--log-level", "error")
	if err := e.cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	e.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(e.cmd, e.done)
	waitFor(t, "etcd healthy", func() bool {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(e.client + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (e *etcd1) stop() {
	select {
	case <-e.done:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGKILL)
	<-e.done
}

// waitFor polls cond; the limit only bounds a broken run.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func openNode(t *testing.T, e *etcd1, id string) *cluster.Node {
	t.Helper()
	n, err := cluster.Open(context.Background(), cluster.Config{Endpoints: []string{e.client}, NodeID: id,
		Advertise: "http://127.0.0.1:1", Token: "0123456789abcdef", OpTimeout: time.Second,
		Log: slog.New(slog.DiscardHandler)}, func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// dirBackend is an object store in a directory.
type dirBackend struct{ dir string }

func (b dirBackend) path(key string) string { return filepath.Join(b.dir, filepath.FromSlash(key)) }

func (b dirBackend) Put(_ context.Context, key string, r io.Reader, _ int64) error {
	p := b.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return os.WriteFile(p, data, 0o600)
}

func (b dirBackend) Get(_ context.Context, key string) (io.ReadCloser, error) {
	return os.Open(b.path(key))
}

func (b dirBackend) List(_ context.Context, prefix string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(b.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(b.dir, p)
		if k := filepath.ToSlash(rel); strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
		return nil
	})
	return out, err
}

func (b dirBackend) Delete(_ context.Context, key string) error {
	if err := os.Remove(b.path(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func newWorkspaces(t *testing.T, dir string, remote workspace.Backend) *workspace.Service {
	t.Helper()
	cfg := workspace.Config{Dir: dir, SyncInterval: time.Hour, Log: slog.New(slog.DiscardHandler)}
	if remote != nil {
		cfg.Remote = remote
	}
	s, err := workspace.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs s until the test ends.
func run(t *testing.T, s *workspace.Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestWorkspaceClaimRenewedAfterRestart: a node restarting with a
// workspace's last sync still queued renews its claim with its new
// lease, so that another node does not take the workspace (and start
// from the older copy) before that sync is pushed; once pushed, the
// claim is let go.
func TestWorkspaceClaimRenewedAfterRestart(t *testing.T) {
	e := startEtcd1(t)
	ctx := context.Background()
	dir, remote := t.TempDir(), dirBackend{t.TempDir()}
	ref := gateway.WorkspaceRef{Name: "w"}

	a := openNode(t, e, "a")
	ws := newWorkspaces(t, dir, remote)
	ws.SetLocks(a.WorkspaceLocks())
	if _, err := ws.CreateWorkspace(ctx, "t1", "w"); err != nil {
		t.Fatal(err)
	}
	if err := ws.Claim(ctx, "t1", "s1", ref); err != nil {
		t.Fatal(err)
	}
	ws.Detach(ctx, "s1") // its last sync queued (no pusher runs): still held
	a.Close(true)

	a = openNode(t, e, "a") // the restart: a new lease, the restarting mark gone
	t.Cleanup(func() { a.Close(false) })
	ws = newWorkspaces(t, dir, remote)
	ws.SetLocks(a.WorkspaceLocks())

	b := openNode(t, e, "b")
	t.Cleanup(func() { b.Close(false) })
	if h, err := b.WorkspaceLocks().Holder(ctx, "t1", "w"); err != nil || h != "s1" {
		t.Fatalf("holder seen from b after a's restart = %q, %v; want s1 (its last sync is not pushed)", h, err)
	}
	var ge *gateway.Error
	if err := b.WorkspaceLocks().Acquire(ctx, "t1", "w", "s2"); !errors.As(err, &ge) || ge.Code != "workspace_busy" {
		t.Fatalf("acquire on b = %v, want workspace_busy", err)
	}

	run(t, ws) // the push goes, then the claim
	waitFor(t, "the claim let go once pushed", func() bool {
		h, err := b.WorkspaceLocks().Holder(ctx, "t1", "w")
		return err == nil && h == ""
	})
	if err := b.WorkspaceLocks().Acquire(ctx, "t1", "w", "s2"); err != nil {
		t.Fatal(err)
	}
}

// TestWorkspaceReleaseRetried: a release that fails (etcd down) is tried
// again once etcd is back, instead of holding while the node runs.
func TestWorkspaceReleaseRetried(t *testing.T) {
	e := startEtcd1(t)
	ctx := context.Background()
	a := openNode(t, e, "a")
	t.Cleanup(func() { a.Close(false) })
	ws := newWorkspaces(t, t.TempDir(), nil)
	ws.SetLocks(a.WorkspaceLocks())
	run(t, ws)
	if _, err := ws.CreateWorkspace(ctx, "t1", "w"); err != nil {
		t.Fatal(err)
	}
	if err := ws.Claim(ctx, "t1", "s1", gateway.WorkspaceRef{Name: "w"}); err != nil {
		t.Fatal(err)
	}
	e.stop()
	ws.Detach(ctx, "s1") // its release fails
	e.start(t)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.client}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	waitFor(t, "the failed release retried", func() bool {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := cli.Get(c, cluster.Prefix+"workspaces/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
}

// TestSharedStoreObjectsOutliveADelete: in cluster mode a node deleting a
// workspace never removes objects from the shared store, where another
// node's capture may have uploaded objects whose doc it has not pushed
// yet. A gateway alone with its store (no Locks) does collect them: the
// control that shows the test can fail.
func TestSharedStoreObjectsOutliveADelete(t *testing.T) {
	e := startEtcd1(t)
	ctx := context.Background()
	content := []byte("another node's file, its doc not pushed yet")
	sum := sha256.Sum256(content)
	hash := hex.EncodeToString(sum[:])
	key := "objects/" + hash[:2] + "/" + hash

	for _, clustered := range []bool{true, false} {
		t.Run(fmt.Sprintf("clustered=%v", clustered), func(t *testing.T) {
			remote := dirBackend{t.TempDir()}
			if err := remote.Put(ctx, key, strings.NewReader(string(content)), int64(len(content))); err != nil {
				t.Fatal(err)
			}
			ws := newWorkspaces(t, t.TempDir(), remote)
			if clustered {
				a := openNode(t, e, "a")
				t.Cleanup(func() { a.Close(false) })
				ws.SetLocks(a.WorkspaceLocks())
			}
			if _, err := ws.CreateWorkspace(ctx, "t1", "w"); err != nil {
				t.Fatal(err)
			}
			if err := ws.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			docs := func() []string {
				t.Helper()
				keys, err := remote.List(ctx, "tenants/")
				if err != nil {
					t.Fatal(err)
				}
				return keys
			}
			if len(docs()) != 1 {
				t.Fatalf("the store holds %q, want the workspace's doc", docs())
			}
			if err := ws.DeleteWorkspace(ctx, "t1", "w"); err != nil {
				t.Fatal(err)
			}
			if err := ws.Flush(ctx); err != nil { // the remote delete, then the collection
				t.Fatal(err)
			}
			if len(docs()) != 0 {
				t.Fatalf("the deleted workspace's doc is still in the store: %q", docs())
			}
			_, err := os.Stat(remote.path(key))
			if clustered && err != nil {
				t.Fatalf("a clustered node removed an object from the shared store: %v", err)
			}
			if !clustered && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a gateway alone with its store left an unnamed object: %v", err)
			}
		})
	}
}
