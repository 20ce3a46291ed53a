package gateway

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sandgate/sandgate/sandbox/workdir"
)

// TestDeleteIsOneCommit: a DELETE removes the session's record and keeps
// its tombstone in one bbolt transaction (one fsync), not one each; both
// are there afterwards, and the session is gone. The old code committed
// twice.
func TestDeleteIsOneCommit(t *testing.T) {
	dir := t.TempDir()
	store, err := OpenBoltStore(filepath.Join(dir, "sessions.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	wd, err := workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := NewManager(Config{Store: store, IdleTimeout: -1}, wd, slog.New(slog.DiscardHandler))
	defer m.Shutdown(ctx, false)
	p := Principal{Tenant: "alice", Method: "api_key"}
	s, _, err := m.Create(ctx, p, CreateParams{TTL: 600})
	if err != nil {
		t.Fatal(err)
	}
	txid := func() int {
		tx, err := store.db.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		return tx.ID()
	}
	before := txid()
	if err := m.Delete(ctx, p, s.ID); err != nil {
		t.Fatal(err)
	}
	if n := txid() - before; n != 1 {
		t.Errorf("DELETE committed %d store transactions, want 1", n)
	}
	var rec, tomb []byte
	_ = store.db.View(func(tx *bolt.Tx) error {
		rec = tx.Bucket(bucketSessions).Get([]byte(s.ID))
		tomb = tx.Bucket(bucketTombstones).Get([]byte(s.ID))
		return nil
	})
	var tb Tombstone
	if rec != nil || tomb == nil || json.Unmarshal(tomb, &tb) != nil || tb.Reason != GoneDeleted || tb.ByTenant != "alice" {
		t.Fatalf("after DELETE: record %q, tombstone %q", rec, tomb)
	}
	if _, err := m.Get(ctx, p, s.ID); err == nil {
		t.Fatal("the deleted session is still there")
	}
}
