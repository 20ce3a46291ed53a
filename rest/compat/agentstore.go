package compat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/url"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// Agent Sandbox's object store (seed 001's S3 sync). With one, each
// sandbox (a tenant's user_id and session_id) keeps its files in the
// store too, one object per file, in the seed's layout under a prefix of
// the tenant's own:
//
//	<Prefix>/<tenant_key>/<user_key>/<session_key>/<path>
//
// user_key and session_key are the seed's (the first 16 hex digits of
// SHA-256 of "user:"+user_id and of "sess:"+session_id), tenant_key the
// same of "tenant:"+tenant. As the seed does, an execute pulls its
// inputs from there into the workspace before the run, and pushes the
// files that changed since the last push after it (incremental: by size
// and mtime); artifacts' download URLs are the store's presigned URLs of
// those objects. DeleteOnCleanup and DeleteOnDelete are the seed's
// DELETE_S3_ON_CLEANUP and DELETE_S3_ON_DELETE.

// AgentSandboxConfig is Agent Sandbox's configuration (serve's
// --agent-sandbox-* flags).
type AgentSandboxConfig struct {
	// Image is the image its sandboxes run on, the seed's SANDBOX_IMAGE
	// ("": the gateway's default image).
	Image string
	// Store, when set, keeps each sandbox's files in an object store
	// too, in the seed's layout under Prefix.
	Store ObjectStore
	// Prefix is the seed's S3_PREFIX_ROOT: the keys' first part, without
	// slashes at either end ("sandboxes").
	Prefix string
	// DeleteOnCleanup deletes a sandbox's stored files when it ends
	// (stop, expiry, any delete): the seed's DELETE_S3_ON_CLEANUP.
	DeleteOnCleanup bool
	// DeleteOnDelete deletes a stored file once a push finds the
	// sandbox's copy deleted: the seed's DELETE_S3_ON_DELETE.
	DeleteOnDelete bool
}

// ObjectStore is a flat store of objects by key, an S3-compatible bucket
// (workspace.NewS3Backend's). Get of a missing key returns an error
// matching fs.ErrNotExist; Delete of one is no error.
type ObjectStore interface {
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	List(ctx context.Context, prefix string) ([]string, error)
	Delete(ctx context.Context, key string) error
	// PresignGet is a URL that reads key for ttl with no other
	// credential.
	PresignGet(ctx context.Context, key string, ttl time.Duration, params url.Values) (string, error)
}

// agentMaxInputs bounds an execute's inputs.
const agentMaxInputs = 200

// agentCleanupTimeout bounds the deletion of an ended sandbox's files.
const agentCleanupTimeout = 2 * time.Minute

// agentStore is the sync of the sandboxes' files with the object store.
type agentStore struct {
	cfg AgentSandboxConfig
	log *slog.Logger
	// maxInput bounds one pulled input (serve --max-fetch-bytes, the
	// seed's MAX_UPLOAD_BYTES; 0: the disk's).
	maxInput int64

	mu       sync.Mutex
	prefixes map[string]*prefixState // prefix -> its lock, while held or awaited
	pushed   map[string]*pushRecord  // live session id -> what the store holds of its files
	closed   bool                    // Close was called: no more cleanups start

	// cleanups are the cleanups of ended sessions running on their own,
	// on base's contexts (Close cancels base when it cannot wait).
	cleanups   sync.WaitGroup
	base       context.Context
	cancelBase context.CancelFunc
}

// pushRecord is what the store holds of one live session's files, under
// its prefix.
type pushRecord struct {
	pfx   string
	files map[string]fileStamp
}

// prefixState serialises the pulls, pushes and cleanups of one
// sandbox's prefix.
type prefixState struct {
	mu sync.Mutex
	// refs counts holders and waiters; cleanup says a session of the
	// prefix ended and its files go before anything else is done there.
	// Both under agentStore.mu.
	refs    int
	cleanup bool
}

func newAgentStore(cfg AgentSandboxConfig, maxInput int64, log *slog.Logger) *agentStore {
	base, cancel := context.WithCancel(context.Background())
	return &agentStore{cfg: cfg, log: log, maxInput: maxInput,
		prefixes: map[string]*prefixState{}, pushed: map[string]*pushRecord{}, base: base, cancelBase: cancel}
}

// Close waits for the cleanups under way (of sessions that ended) to
// finish, and starts no more; when ctx ends first, they are canceled
// (their files stay in the store) and Close says so.
func (st *agentStore) Close(ctx context.Context) error {
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
	done := make(chan struct{})
	go func() {
		st.cleanups.Wait()
		close(done)
	}()
	defer st.cancelBase()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		st.cancelBase()
		<-done
		return fmt.Errorf("agent sandbox: cleanups of the object store canceled: %w", ctx.Err())
	}
}

// prefix is where the store keeps the files of tenant's sandbox id,
// ending in "/".
func (st *agentStore) prefix(tenant string, id agentIdentity) string {
	return st.cfg.Prefix + "/" + sha16("tenant:"+tenant) + "/" + sha16("user:"+id.UserID) + "/" + sha16("sess:"+id.SessionID) + "/"
}

// ref takes a reference to pfx's state; with cleanup, it marks the
// prefix's files to go first.
func (st *agentStore) ref(pfx string, cleanup bool) *prefixState {
	st.mu.Lock()
	defer st.mu.Unlock()
	ps := st.prefixes[pfx]
	if ps == nil {
		ps = &prefixState{}
		st.prefixes[pfx] = ps
	}
	ps.refs++
	if cleanup {
		ps.cleanup = true
	}
	return ps
}

// lock holds pfx (ps, referenced) for one operation; a cleanup marked
// meanwhile, or forced, runs first, and its failure is returned (and
// logged). unlock lets it go.
func (st *agentStore) lock(ctx context.Context, pfx string, ps *prefixState, force bool) error {
	ps.mu.Lock()
	st.mu.Lock()
	clean := ps.cleanup || force
	ps.cleanup = false
	st.mu.Unlock()
	if clean {
		return st.deletePrefix(ctx, pfx)
	}
	return nil
}

func (st *agentStore) unlock(pfx string, ps *prefixState) {
	ps.mu.Unlock()
	st.mu.Lock()
	ps.refs--
	if ps.refs == 0 {
		delete(st.prefixes, pfx)
	}
	st.mu.Unlock()
}

// deletePrefix deletes every object under pfx; a failure is logged and
// returned (the files stay in the store: nothing is lost), a panic of
// the store's client too. A live session of the prefix (a new sandbox of
// the same ids) then holds nothing stored: its next push uploads all its
// files.
func (st *agentStore) deletePrefix(ctx context.Context, pfx string) (err error) {
	n := 0
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("object store: panic: %v", r)
		}
		if err != nil {
			st.log.Warn("compat_store_cleanup_failed", "api", "agent-sandbox", "prefix", pfx, "deleted", n, "err", err)
			return
		}
		st.log.Info("compat_store_cleaned", "api", "agent-sandbox", "prefix", pfx, "deleted", n)
	}()
	st.mu.Lock()
	for _, rec := range st.pushed {
		if rec.pfx == pfx {
			rec.files = map[string]fileStamp{}
		}
	}
	st.mu.Unlock()
	keys, err := st.cfg.Store.List(ctx, pfx)
	for _, k := range keys {
		if err != nil {
			break
		}
		if err = st.cfg.Store.Delete(ctx, k); err == nil {
			n++
		}
	}
	return err
}

// watch ties s, the sandbox of prefix pfx, to the store: when s ends
// (stop, expiry, any delete), what the store knows of it goes, and so do
// its stored files with DeleteOnCleanup.
func (st *agentStore) watch(s *gateway.Session, pfx string) {
	st.mu.Lock()
	_, known := st.pushed[s.ID]
	if !known {
		st.pushed[s.ID] = &pushRecord{pfx: pfx, files: map[string]fileStamp{}}
	}
	st.mu.Unlock()
	if known {
		return
	}
	if _, ok := s.AddConn(func() { st.ended(s, pfx) }); !ok {
		// It ended before it was watched: forgotten, and its files are
		// left alone (a cleanup now could delete those of the prefix's
		// next sandbox).
		st.mu.Lock()
		delete(st.pushed, s.ID)
		st.mu.Unlock()
	}
}

// ended is watch's hook, which runs as the session's connections close:
// when it ends (deleted or expired), and when it stops (its processes,
// not its files) or fails (its files are kept, until a delete). Only an
// end deletes its stored files (with DeleteOnCleanup); else what the
// store knows of it is forgotten, and the next call watches it anew. It
// only marks the cleanup (which any later pull or push of the prefix
// runs first) and leaves the deletion to a goroutine of its own.
func (st *agentStore) ended(s *gateway.Session, pfx string) {
	st.mu.Lock()
	delete(st.pushed, s.ID)
	st.mu.Unlock()
	if status := s.Status(); !st.cfg.DeleteOnCleanup || (status != gateway.StatusDeleted && status != gateway.StatusExpired) {
		return
	}
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		st.log.Warn("compat_store_cleanup_skipped", "api", "agent-sandbox", "session", s.ID, "prefix", pfx,
			"why", "the gateway is shutting down: the files stay in the store")
		return
	}
	st.cleanups.Add(1)
	st.mu.Unlock()
	ps := st.ref(pfx, true)
	go func() {
		defer st.cleanups.Done()
		defer func() {
			if r := recover(); r != nil {
				st.log.Error("compat_store_cleanup_panic", "api", "agent-sandbox", "prefix", pfx, "panic", r)
			}
		}()
		ctx, cancel := context.WithTimeout(st.base, agentCleanupTimeout)
		defer cancel()
		_ = st.lock(ctx, pfx, ps, false) // a failure is logged
		st.unlock(pfx, ps)
	}()
}

// cleanup deletes pfx's files now (stop, with DeleteOnCleanup), and
// returns its failure.
func (st *agentStore) cleanup(ctx context.Context, pfx string) error {
	ps := st.ref(pfx, false)
	defer st.unlock(pfx, ps)
	return st.lock(ctx, pfx, ps, true)
}

// pull copies the inputs (workspace paths) from the store into the
// workspace, as the seed's sync_in does: an input the store does not
// hold is skipped. The store's copy never replaces newer work: an input
// is pulled only when the workspace has no such file and never had one
// since the last push (one deleted since is not brought back), or when
// its file is as the last push or pull left it; else it is skipped, and
// logged. What it writes counts as pushed.
func (st *agentStore) pull(ctx context.Context, s *gateway.Session, fsys *dataplane.FS, pfx string, inputs []string) error {
	ps := st.ref(pfx, false)
	_ = st.lock(ctx, pfx, ps, false) // a failed cleanup is logged
	defer st.unlock(pfx, ps)
	for _, rel := range inputs {
		if why := st.keepLocal(s, fsys, rel); why != "" {
			st.log.Info("compat_store_pull_skipped", "api", "agent-sandbox", "session", s.ID, "path", rel, "why", why)
			continue
		}
		rc, err := st.cfg.Store.Get(ctx, pfx+rel)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			st.log.Warn("compat_store_pull_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
			return fmt.Errorf("%s: the object store failed", rel)
		}
		e, _, err := fsys.Write(rel, rc, dataplane.WriteOptions{Mkdirs: true, MaxBytes: st.maxInput})
		rc.Close()
		if err != nil {
			var fe *dataplane.Error
			if errors.As(err, &fe) {
				return errors.New(fe.Msg) // it names the path
			}
			st.log.Warn("compat_store_pull_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
			return fmt.Errorf("%s: could not be written", rel)
		}
		st.mu.Lock()
		if rec := st.pushed[s.ID]; rec != nil {
			rec.files[rel] = fileStamp{size: e.SizeBytes, mtime: e.Mtime}
		}
		st.mu.Unlock()
	}
	return nil
}

// keepLocal says why the workspace's rel must not be replaced by the
// store's copy ("": it may be).
func (st *agentStore) keepLocal(s *gateway.Session, fsys *dataplane.FS, rel string) string {
	st.mu.Lock()
	var last fileStamp
	known := false
	if rec := st.pushed[s.ID]; rec != nil {
		last, known = rec.files[rel]
	}
	st.mu.Unlock()
	e, err := fsys.Stat(rel)
	var fe *dataplane.Error
	switch {
	case err != nil && errors.As(err, &fe) && fe.Kind == dataplane.KindNotFound:
		if known {
			return "deleted from the workspace since the last sync"
		}
		return ""
	case err != nil:
		return "the workspace's file could not be read: " + err.Error()
	case e.Type != "file":
		return "not a regular file in the workspace"
	case !known || !last.same(fileStamp{size: e.SizeBytes, mtime: e.Mtime}):
		return "the workspace's file changed since the last sync"
	}
	return ""
}

// push uploads the files of files (the workspace's, as listed now) that
// changed since the last push of s, as the seed's sync_out_changed does,
// and with DeleteOnDelete deletes the objects of files deleted since;
// only when the list is complete, else a file it misses is not known to
// be deleted. It returns the paths the store holds as they are now, and
// the first failure.
func (st *agentStore) push(ctx context.Context, s *gateway.Session, fsys *dataplane.FS, pfx string, files map[string]fileStamp, complete bool) (map[string]bool, error) {
	ps := st.ref(pfx, false)
	_ = st.lock(ctx, pfx, ps, false) // a failed cleanup is logged
	defer st.unlock(pfx, ps)
	st.mu.Lock()
	var prev map[string]fileStamp
	if rec := st.pushed[s.ID]; rec != nil {
		prev = rec.files
	}
	last := make(map[string]fileStamp, len(prev))
	for p, f := range prev {
		last[p] = f
	}
	st.mu.Unlock()
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	synced := make(map[string]bool, len(files))
	var firstErr error
	uploaded, deleted := 0, 0
	for _, p := range paths {
		f := files[p]
		if old, ok := last[p]; ok && old.same(f) {
			synced[p] = true
			continue
		}
		if err := st.upload(ctx, fsys, pfx+p, p); err != nil {
			delete(last, p)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		last[p] = f
		synced[p] = true
		uploaded++
	}
	if !complete {
		st.log.Warn("compat_store_listing_incomplete", "api", "agent-sandbox", "session", s.ID,
			"note", "the workspace's list is incomplete: no stored file is deleted")
	}
	for p, old := range last {
		if _, ok := files[p]; ok || !complete || old.gone {
			continue
		}
		if !st.cfg.DeleteOnDelete {
			// Its object stays; the file is remembered as deleted, so
			// that a pull does not bring it back.
			last[p] = fileStamp{gone: true}
			continue
		}
		if err := st.cfg.Store.Delete(ctx, pfx+p); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		deleted++
		delete(last, p)
	}
	st.mu.Lock()
	if rec := st.pushed[s.ID]; rec != nil {
		rec.files = last
	}
	st.mu.Unlock()
	if firstErr != nil {
		st.log.Warn("compat_store_push_failed", "api", "agent-sandbox", "session", s.ID, "uploaded", uploaded, "err", firstErr)
	} else if uploaded+deleted > 0 {
		st.log.Info("compat_store_pushed", "api", "agent-sandbox", "session", s.ID, "uploaded", uploaded, "deleted", deleted)
	}
	return synced, firstErr
}

// upload puts the workspace's file p at key.
func (st *agentStore) upload(ctx context.Context, fsys *dataplane.FS, key, p string) error {
	f, e, err := fsys.Open(p)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	if err := st.cfg.Store.Put(ctx, key, io.LimitReader(f, e.SizeBytes), e.SizeBytes); err != nil {
		return fmt.Errorf("upload %s: %w", p, err)
	}
	return nil
}

// presign is the store's URL of the stored file p, for expiresIn seconds:
// a download (attachment, its name and media type), never a page, as the
// workspace store's artifacts' URLs.
func (st *agentStore) presign(ctx context.Context, pfx, p string, expiresIn int) (string, error) {
	params := url.Values{}
	params.Set("response-content-disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	params.Set("response-content-type", mimeType(p))
	return st.cfg.Store.PresignGet(ctx, pfx+p, time.Duration(expiresIn)*time.Second, params)
}

// agentInputPath maps an input as the seed's users send it to a path of
// the workspace: a relative path is one already; an absolute one is read
// from the workspace's root, and a leading /work (where the seed's
// sandboxes mount their workspace) or /workspace (where sandgate's do)
// is the workspace itself. So "/path/to/input1.py" is
// "path/to/input1.py", and "/work/data.csv", "/workspace/data.csv" and
// "data.csv" are "data.csv". ".." is refused.
func agentInputPath(p string) (string, error) {
	q := strings.TrimSpace(strings.ReplaceAll(p, `\`, "/"))
	if strings.HasPrefix(q, "/") {
		var segs []string
		for _, seg := range strings.Split(q, "/") {
			if seg != "" && seg != "." {
				segs = append(segs, seg)
			}
		}
		if len(segs) > 1 && (segs[0] == "work" || segs[0] == "workspace") {
			segs = segs[1:]
		}
		q = strings.Join(segs, "/")
	}
	return agentRelPath(q)
}
