package workspace

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"time"
)

// collect deletes the objects (files and manifest pages) that no doc
// names any more, here and in the object store: what a deleted workspace
// leaves. It runs after a workspace's doc is deleted, holding gcMu, so no
// capture stores objects for a doc it has not written yet meanwhile.
// Artifacts (artifacts/) are not objects and stay.
//
// That holds within one gateway. Gateways sharing a bucket (cluster
// mode: Locks set) cannot see each other's captures in flight: another
// node may have uploaded objects whose doc is not pushed yet, or be about
// to push a doc naming an object its cache says the store has. There a
// node collects its local store only and leaves the shared store's
// objects: unreferenced objects stay (storage) rather than a doc losing
// its files (data).
func (s *Service) collect(ctx context.Context) error {
	return s.store.collect(ctx, s.readDoc, s.clustered())
}

// DefaultCollectInterval is Config.CollectInterval's default.
const DefaultCollectInterval = 10 * time.Second

// wantCollect asks collectLoop for a collection: a workspace's new
// version was stored (and, with an object store, pushed), and the
// objects only its old version named are garbage. Without it they stayed
// until the workspace was deleted: a workspace rewritten by one session
// after another grew the store (and the bucket) without bound.
func (s *Service) wantCollect() {
	select {
	case s.collectWake <- struct{}{}:
	default: // one is asked for already
	}
}

// collectLoop collects when asked, at most once per CollectInterval (a
// collection reads every doc), until ctx is done.
func (s *Service) collectLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.collectWake:
		}
		if err := s.collect(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("workspace_collect_failed", "err", err)
		}
		t := time.NewTimer(s.cfg.CollectInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// collect is Service.collect in the content store: readDoc reads a doc
// as the Service does (the object store's copy, unless this gateway's
// waits for the pusher), and shared says whether other gateways share
// the object store.
func (s *store) collect(ctx context.Context, readDoc func(context.Context, string) (*doc, error), shared bool) error {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	keys, err := s.local.List(ctx, "tenants/")
	if err != nil {
		return err
	}
	// Sweeping the shared store needs every doc in it; sweeping the local
	// store, only the local docs (an object only the store's docs name is
	// fetched again when needed).
	if s.cfg.Remote != nil && !shared {
		remote, err := s.cfg.Remote.List(ctx, "tenants/")
		if err != nil {
			return err // sweep nothing without knowing every doc
		}
		keys = append(keys, remote...)
	}
	refs := map[string]bool{}
	for _, k := range keys {
		if !strings.HasSuffix(k, ".json") || refs["doc:"+k] {
			continue
		}
		refs["doc:"+k] = true
		d, err := readDoc(ctx, k)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if errors.Is(err, errCorrupt) {
			// One tenant's bad doc does not stop the cleanup of all:
			// it names nothing that can be restored.
			s.cfg.Log.Warn("workspace_doc_corrupt", "key", k, "err", err)
			continue
		}
		if err != nil {
			return err
		}
		for _, p := range d.Pages {
			if validHash(p.Hash) {
				refs[objectKey(p.Hash)] = true
			}
		}
		es, err := s.entries(ctx, d)
		if errors.Is(err, errCorrupt) {
			s.cfg.Log.Warn("workspace_doc_corrupt", "key", k, "err", err)
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range es {
			if validHash(e.Hash) {
				refs[objectKey(e.Hash)] = true
			}
		}
	}
	sweep := func(b Backend) (int, error) {
		objs, err := b.List(ctx, "objects/")
		if err != nil {
			return 0, err
		}
		n := 0
		for _, o := range objs {
			if refs[o] {
				continue
			}
			deleted, err := s.deleteUnpinned(ctx, b, o)
			if err != nil {
				return n, err
			}
			if !deleted {
				continue
			}
			n++
			if b == s.cfg.Remote {
				s.forgetRemote(o)
			}
		}
		return n, nil
	}
	local, err := sweep(s.local)
	if err != nil {
		return err
	}
	remote := 0
	if s.cfg.Remote != nil && !shared {
		if remote, err = sweep(s.cfg.Remote); err != nil {
			return err
		}
	}
	s.cfg.Log.Info("workspace_objects_collected", "local", local, "remote", remote, "shared_store_left", shared)
	return nil
}
