package gateway

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Store keeps session records. Put and Delete are durable when they return.
type Store interface {
	Put(recs ...Record) error
	Delete(id string) error
	All() ([]Record, error)
	Close() error
}

// MemStore is a Store that forgets everything on restart.
type MemStore struct {
	mu    sync.Mutex
	recs  map[string]Record
	tombs map[string]Tombstone // tombstone.go
}

// NewMemStore returns an empty in-memory store.
func NewMemStore() *MemStore { return &MemStore{recs: map[string]Record{}} }

func (m *MemStore) Put(recs ...Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		m.recs[r.ID] = r
	}
	return nil
}

func (m *MemStore) Delete(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, id)
	return nil
}

func (m *MemStore) All() ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (m *MemStore) Close() error { return nil }

// BoltStore is the durable store: a bbolt file in the data dir. bbolt
// commits copy-on-write with fsync, so an acknowledged write survives
// kill -9 and a torn write leaves the previous consistent state.
type BoltStore struct {
	db *bolt.DB
}

var (
	bucketMeta     = []byte("meta")
	bucketSessions = []byte("sessions")
	keySchema      = []byte("schema_version")
)

// SchemaVersion is the store layout this build writes.
const SchemaVersion = 2

// migrations[i] moves a store from schema version i to i+1.
var migrations = []func(tx *bolt.Tx) error{
	func(tx *bolt.Tx) error { // 0 -> 1: the sessions bucket, JSON records keyed by id
		_, err := tx.CreateBucketIfNotExists(bucketSessions)
		return err
	},
	migrateTombstones, // 1 -> 2 (store_tombstones.go)
}

// OpenBoltStore opens (creating and migrating as needed) the store at path.
func OpenBoltStore(path string) (*BoltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		v := 0
		if b := meta.Get(keySchema); len(b) == 8 {
			v = int(binary.BigEndian.Uint64(b))
		}
		if v > SchemaVersion {
			return fmt.Errorf("store schema version %d is newer than this build's %d", v, SchemaVersion)
		}
		for ; v < SchemaVersion; v++ {
			if err := migrations[v](tx); err != nil {
				return fmt.Errorf("migrate store from version %d: %w", v, err)
			}
		}
		return meta.Put(keySchema, binary.BigEndian.AppendUint64(nil, SchemaVersion))
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &BoltStore{db: db}, nil
}

func (s *BoltStore) Put(recs ...Record) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		for _, r := range recs {
			data, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(r.ID), data); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *BoltStore) Delete(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).Delete([]byte(id))
	})
}

func (s *BoltStore) All() ([]Record, error) {
	var out []Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("record %s: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

func (s *BoltStore) Close() error { return s.db.Close() }
