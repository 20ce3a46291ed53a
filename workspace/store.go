package workspace

import (
	"context"
	"sync"
	"sync/atomic"
)

// store is the content store: the local store's objects and docs, the
// objects known to be in the object store, the pins of objects no doc
// names yet, and the lock that orders the collection of unnamed objects
// (gc.go) with whatever stores them. Its methods are in manifest.go
// (scan, store, restore), pages.go (pages, entries), guard.go (pins,
// bounds, durability) and here.
type store struct {
	cfg    Config
	local  *localBackend
	tmpDir string

	// gcMu is held to read by whatever stores objects that no doc names
	// yet (a capture until its doc is written, an artifact until it is
	// uploaded), and to write by the collection of unnamed objects.
	gcMu sync.RWMutex

	// pinMu orders pinning (pinObject) with collect's deletions; pins
	// counts, by hash, the captures that rely on an object no doc names
	// yet.
	pinMu sync.Mutex
	pins  map[string]int
	// unsynced: an object was stored since the last syncObjects.
	unsynced atomic.Bool

	mu     sync.Mutex
	have   map[string]bool // objects known to be in the remote store
	listed bool            // have was filled from a listing

	// beforeStableScan, when set (tests), is called before each scan of
	// stableScan: a writer that never rests, made deterministic.
	beforeStableScan func()
}

func newStore(cfg Config, local *localBackend, tmpDir string) *store {
	return &store{cfg: cfg, local: local, tmpDir: tmpDir, pins: map[string]int{}, have: map[string]bool{}}
}

// markRemote records that the object store holds object key.
func (s *store) markRemote(key string) {
	s.mu.Lock()
	s.have[key] = true
	s.mu.Unlock()
}

// forgetRemote records that the object store no longer holds object key.
func (s *store) forgetRemote(key string) {
	s.mu.Lock()
	delete(s.have, key)
	s.mu.Unlock()
}

func (s *store) hasRemote(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.have[key]
}

// listRemote learns, once, which objects the remote store holds: one
// listing instead of a HEAD per object.
func (s *store) listRemote(ctx context.Context) error {
	s.mu.Lock()
	listed := s.listed
	s.mu.Unlock()
	if listed {
		return nil
	}
	keys, err := s.cfg.Remote.List(ctx, "objects/")
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, k := range keys {
		s.have[k] = true
	}
	s.listed = true
	s.mu.Unlock()
	return nil
}
