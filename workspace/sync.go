package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"
)

// Backoff bounds of a failed push.
const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// syncer is the push queue: the docs that wait for the pusher to reach
// the object store, and each doc's sync state as the API shows it. The
// pusher itself (pushLoop, pushAll, push) is the Service's: a push reads
// the content store.
type syncer struct {
	remote bool // an object store is configured: docs are queued

	mu    sync.Mutex
	state map[string]*SyncState // doc key -> its sync to the remote store
	queue map[string]job        // doc key -> what the pusher must do
	seq   uint64                // of the last job queued
	wake  chan struct{}
}

func newSyncer(cfg Config) *syncer {
	return &syncer{remote: cfg.Remote != nil, state: map[string]*SyncState{}, queue: map[string]job{}, wake: make(chan struct{}, 1)}
}

func (s *syncer) enqueue(key string, j job) {
	if !s.remote {
		return
	}
	s.mu.Lock()
	s.seq++
	j.seq = s.seq
	s.queue[key] = j
	st := s.state[key]
	if st == nil {
		st = &SyncState{}
		s.state[key] = st
	}
	if !j.del {
		// All of it until the push compares with what the remote holds.
		st.PendingBytes = j.pending
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// pendingPush says whether key waits for the pusher: this gateway's copy
// is then newer than the object store's.
func (s *syncer) pendingPush(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.queue[key]
	return ok
}

// noteCapture records how a capture of workspace doc key ended, for the
// session's workspaceSync and the workspace's sync.
func (s *syncer) noteCapture(key string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[key]
	if st == nil {
		if err == nil {
			return
		}
		st = &SyncState{}
		s.state[key] = st
	}
	st.captureErr = ""
	if err != nil {
		st.captureErr = "could not save the workspace's files" + captureWhy(err)
	}
}

// syncView is what the API shows of key's sync state (nil: none).
func (s *syncer) syncView(key string) *SyncState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.state[key]; st != nil {
		return st.view()
	}
	return nil
}

// markSynced records key as synced now (no object store: a doc written
// is as synced as it gets).
func (s *syncer) markSynced(key string) {
	s.mu.Lock()
	now := time.Now().UTC()
	s.state[key] = &SyncState{LastSyncedAt: &now}
	s.mu.Unlock()
}

// forgetState drops key's sync state (its doc was deleted).
func (s *syncer) forgetState(key string) {
	s.mu.Lock()
	delete(s.state, key)
	s.mu.Unlock()
}

func (s *syncer) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) == 0
}

// next is a job of the queue ("" when it is empty).
func (s *syncer) next() (key string, j job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.queue {
		return k, v
	}
	return "", job{}
}

// finish records how the push of j for key ended: a failure in key's
// state, a success by taking j off the queue (unless key was queued
// again meanwhile) and marking key synced.
func (s *syncer) finish(key string, j job, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[key]
	if st == nil && !j.del {
		st = &SyncState{}
		s.state[key] = st
	}
	if err != nil {
		if st != nil {
			st.LastError = err.Error()
		}
		return
	}
	if cur, ok := s.queue[key]; ok && cur == j {
		delete(s.queue, key) // unless queued again meanwhile
	}
	if st != nil && !j.del {
		now := time.Now().UTC()
		st.LastSyncedAt, st.LastError, st.PendingBytes = &now, "", 0
	}
}

func (s *syncer) setPending(key string, n int64) {
	s.mu.Lock()
	if st := s.state[key]; st != nil {
		st.PendingBytes = n
	}
	s.mu.Unlock()
}

// Run syncs every running session's named workspace each SyncInterval
// and pushes what changed to the object store, retrying with backoff,
// until ctx is done. With Locks, the reservations are tidied each
// SyncInterval too, and a failed release is retried (locks.go).
func (s *Service) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pushLoop(ctx)
	}()
	tidied := make(chan struct{})
	go func() {
		defer close(tidied)
		s.tidyLoop(ctx, s.cfg.SyncInterval)
	}()
	defer func() { <-tidied }()
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		s.collectLoop(ctx)
	}()
	defer func() { <-collected }()
	t := time.NewTicker(s.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
			s.syncAll(ctx)
		}
	}
}

// syncAll captures every attached named workspace (no freeze: the
// commands are never held by a periodic sync).
func (s *Service) syncAll(ctx context.Context) {
	s.mu.Lock()
	var all []*attachment
	for _, a := range s.sessions {
		if a.name != "" {
			all = append(all, a)
		}
	}
	s.mu.Unlock()
	for _, a := range all {
		key := workspaceKey(a.tenant, a.name)
		_, err := s.syncWorkspace(ctx, a, key, "periodic")
		s.noteCapture(key, err)
		if err != nil {
			s.cfg.Log.Warn("workspace_sync_failed", "workspace", a.name, "session", a.session, "err", err)
		}
	}
}

// syncWorkspace captures a's named workspace into doc key (no freeze),
// logging its start and, when it succeeds, its end with the bytes it
// holds and stored; the caller logs a failure with its effect.
func (s *Service) syncWorkspace(ctx context.Context, a *attachment, key, reason string) (*SnapshotInfo, error) {
	start := time.Now()
	s.cfg.Log.Info("workspace_sync_started", "workspace", a.name, "session", a.session, "reason", reason)
	info, err := s.capture(ctx, a, key, false)
	if err != nil {
		return nil, err
	}
	s.cfg.Log.Info("workspace_synced", "workspace", a.name, "session", a.session, "reason", reason,
		"bytes", info.SizeBytes, "files", info.Files, "stored_bytes", info.StoredBytes,
		"duration", time.Since(start).Round(time.Millisecond).String())
	return info, nil
}

func (s *Service) pushLoop(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		idle := s.syncer.idle()
		switch {
		case backoff > 0: // a new job waits out the backoff too
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		case idle:
			select {
			case <-ctx.Done():
				return
			case <-s.syncer.wake:
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err := s.pushAll(ctx); err != nil {
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			s.cfg.Log.Warn("workspace_push_failed", "err", err, "retry_in", backoff)
			continue
		}
		backoff = 0
	}
}

// pushAll works through the queue; it stops at the first failure, which
// is recorded in the state of the doc it was pushing.
func (s *Service) pushAll(ctx context.Context) error {
	for {
		key, j := s.syncer.next()
		if key == "" {
			return nil
		}
		start := time.Now()
		sent, err := s.push(ctx, key, j)
		if err == nil {
			// Before the state says synced: whoever sees that finds the line.
			s.cfg.Log.Info("workspace_pushed", "key", key, "delete", j.del, "uploaded_bytes", sent,
				"duration", time.Since(start).Round(time.Millisecond).String())
		}
		s.syncer.finish(key, j, err)
		if err != nil {
			return err
		}
		if !j.del {
			// The object store's copy of the doc is the new version: what
			// only the old one named there can go.
			s.wantCollect()
		}
		s.pushed(ctx, key)
	}
}

// push uploads the objects doc key names that the remote store lacks,
// then the doc itself (or deletes it remotely), and says how many bytes
// it uploaded.
func (s *Service) push(ctx context.Context, key string, j job) (sent int64, err error) {
	r := s.cfg.Remote
	if j.del {
		if err := r.Delete(ctx, key); err != nil {
			return sent, err
		}
		if err := s.local.Delete(ctx, tombstoneKey(key)); err != nil {
			return sent, err
		}
		return 0, s.collect(ctx)
	}
	if err := s.listRemote(ctx); err != nil {
		return sent, err
	}
	b, err := readAll(ctx, s.local, key)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // deleted since
	}
	if err != nil {
		return sent, err
	}
	d, err := parseDoc(key, b)
	if err != nil {
		return sent, err
	}
	if j.restart {
		if stale, err := s.stale(ctx, key, d); err != nil || stale {
			return sent, err
		}
	}
	entries, err := s.entries(ctx, d)
	if err != nil {
		return sent, err
	}
	// The pages are objects too: upload them with the files.
	objs := make([]Entry, 0, len(d.Pages)+len(entries))
	for _, p := range d.Pages {
		objs = append(objs, Entry{Hash: p.Hash, Size: p.Size})
	}
	for i := range entries {
		// The empty object is never stored remotely (openObject knows it).
		if validHash(entries[i].Hash) && entries[i].Hash != emptyHash {
			objs = append(objs, Entry{Hash: entries[i].Hash, Size: entries[i].dataBytes()})
		}
	}
	pending := int64(0)
	for _, e := range objs {
		if validHash(e.Hash) && !s.hasRemote(objectKey(e.Hash)) {
			pending += e.Size
		}
	}
	s.setPending(key, pending)
	for _, e := range objs {
		if !validHash(e.Hash) {
			continue
		}
		ok := objectKey(e.Hash)
		if s.hasRemote(ok) {
			continue
		}
		f, err := os.Open(s.local.dir + "/" + ok)
		if err != nil {
			return sent, err
		}
		err = r.Put(ctx, ok, f, e.Size)
		f.Close()
		if err != nil {
			return sent, err
		}
		s.store.markRemote(ok)
		sent += e.Size
		pending -= e.Size
		s.setPending(key, pending)
	}
	return sent + int64(len(b)), r.Put(ctx, key, strings.NewReader(string(b)), int64(len(b)))
}

// Flush pushes what is queued, for a gateway that stops, until ctx is
// done.
func (s *Service) Flush(ctx context.Context) error {
	if s.cfg.Remote == nil {
		return nil
	}
	return s.pushAll(ctx)
}

// stale says whether the object store holds a doc at key newer than d
// (another gateway sharing it wrote it while this one was away); this
// gateway's copy is then replaced by it instead of being pushed.
func (s *Service) stale(ctx context.Context, key string, d *doc) (bool, error) {
	b, err := readAll(ctx, s.cfg.Remote, key)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	rd, err := parseDoc(key, b)
	if err != nil || !rd.LastUsedAt.After(d.LastUsedAt) {
		return false, nil
	}
	return true, s.local.Put(ctx, key, strings.NewReader(string(b)), int64(len(b)))
}
