package envd_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem"
)

// TestWatchTreeBounded: a recursive watch of a tree of more than 1000
// entries is refused (each poll would list it all).
func TestWatchTreeBounded(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	_, r := sb.start(t, c, bash("mkdir -p big/a big/b && cd big && for i in $(seq 600); do : > a/$i; : > b/$i; done; echo ok", false))
	_ = r
	// Let the command finish: the listing below must see all of it.
	eventually(t, "the tree is written", func() bool {
		res, err := sb.fs.ListDir(c, connect.NewRequest(&filesystem.ListDirRequest{Path: "big/b", Depth: 1}))
		return err == nil && len(res.Msg.GetEntries()) == 600
	})
	_, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "big", Recursive: true}))
	wantCode(t, err, connect.CodeResourceExhausted)
	if !contains(err.Error(), "1000 entries") {
		t.Errorf("error %v does not name the bound", err)
	}
	// One of its 600-entry directories may be watched.
	w, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "big/a"}))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = sb.fs.RemoveWatcher(c, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()}))
}

// TestStoppedWatcherReaped: a watcher that stopped on its own (its
// directory went) and whose error nobody fetches is closed after Idle,
// freeing its place.
func TestStoppedWatcherReaped(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{Interval: 50 * time.Millisecond, PerSession: 1, Idle: time.Second})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	sb.upload(t, "gone/f", "x")
	if _, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "gone"})); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "gone"})); err != nil {
		t.Fatal(err)
	}
	sb.upload(t, "other/f", "x")
	eventually(t, "the stopped watcher's place is free", func() bool {
		w, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "other"}))
		if err == nil {
			_, _ = sb.fs.RemoveWatcher(c, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()}))
		}
		return err == nil
	})
}
