package gateway

import (
	"encoding/binary"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestBoltStoreMigratesToTombstones: a schema 1 store (sessions only)
// opens as schema 2, keeps its sessions and gains the tombstones bucket.
func TestBoltStoreMigratesToTombstones(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(Record{ID: "sbx-a", Tenant: "t1"})
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketSessions)
		if err != nil {
			return err
		}
		if err := b.Put([]byte("sbx-a"), rec); err != nil {
			return err
		}
		return meta.Put(keySchema, binary.BigEndian.AppendUint64(nil, 1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	st, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if recs, err := st.All(); err != nil || len(recs) != 1 || recs[0].ID != "sbx-a" {
		t.Fatalf("sessions after the migration: %+v %v", recs, err)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, id := range []string{"sbx-x", "sbx-y"} {
		if err := st.PutTombstone(Tombstone{ID: id, Tenant: "t1", Reason: GoneDeleted, At: at, ByTenant: "t1", ByMethod: "jwt"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeleteTombstones("sbx-x", "sbx-nope"); err != nil {
		t.Fatal(err)
	}
	ts, err := st.Tombstones()
	if err != nil || len(ts) != 1 || ts[0].ID != "sbx-y" || !ts[0].At.Equal(at) || ts[0].ByMethod != "jwt" {
		t.Fatalf("tombstones: %+v %v", ts, err)
	}
	var v uint64
	_ = st.db.View(func(tx *bolt.Tx) error {
		v = binary.BigEndian.Uint64(tx.Bucket(bucketMeta).Get(keySchema))
		return nil
	})
	if v != SchemaVersion || SchemaVersion != 2 {
		t.Errorf("schema version %d after the migration (build's %d)", v, SchemaVersion)
	}
}
