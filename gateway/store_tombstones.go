package gateway

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// bucketTombstones holds the tombstones, JSON keyed by session id.
var bucketTombstones = []byte("tombstones")

// migrateTombstones moves a store from schema version 1 to 2: the
// tombstones bucket.
func migrateTombstones(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bucketTombstones)
	return err
}

func (s *BoltStore) PutTombstone(t Tombstone) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketTombstones).Put([]byte(t.ID), data)
	})
}

// BuryRecord implements RecordBurier: the session's record goes and its
// tombstone is kept in one transaction, one fsync.
func (s *BoltStore) BuryRecord(t Tombstone) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSessions).Delete([]byte(t.ID)); err != nil {
			return err
		}
		return tx.Bucket(bucketTombstones).Put([]byte(t.ID), data)
	})
}

func (s *BoltStore) DeleteTombstones(ids ...string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketTombstones)
		for _, id := range ids {
			if err := b.Delete([]byte(id)); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *BoltStore) Tombstones() ([]Tombstone, error) {
	var out []Tombstone
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketTombstones).ForEach(func(k, v []byte) error {
			var t Tombstone
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("tombstone %s: %w", k, err)
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}
