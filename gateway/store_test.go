package gateway

import (
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestBoltStoreRoundTripAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	st, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	recs := []Record{
		{ID: "sbx-a", Tenant: "t1", PasswordHash: make([]byte, 32), View: View{Image: "default", Metadata: map[string]any{"k": "v"}, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivityAt: now, TTL: 3600, Status: StatusRunning}},
		{ID: "sbx-b", Tenant: "t2", PasswordHash: make([]byte, 32), View: View{Image: "default", CreatedAt: now, ExpiresAt: now.Add(time.Minute), LastActivityAt: now, TTL: 60, Status: StatusFailed, StatusReason: "lost"}},
	}
	if err := st.Put(recs...); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("sbx-a"); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(recs[0]); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st, err = OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.All()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "sbx-a" || got[1].StatusReason != "lost" || !got[0].ExpiresAt.Equal(recs[0].ExpiresAt) || got[0].Metadata["k"] != "v" {
		t.Fatalf("reopened store holds %+v", got)
	}
}

func TestBoltStoreRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(keySchema, binary.BigEndian.AppendUint64(nil, SchemaVersion+1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenBoltStore(path); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open of a newer schema: %v", err)
	}
}
