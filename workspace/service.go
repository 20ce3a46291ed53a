package workspace

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// Config wires a Service.
type Config struct {
	// Dir is the local store's directory (<data-dir>/workspaces).
	Dir string
	// Remote is the object store (nil: workspaces live in Dir only).
	Remote Backend
	// SyncInterval is how often a running session's named workspace is
	// synced (default 1m).
	SyncInterval time.Duration
	// MaxBytes bounds what one capture may read and one restore may
	// write, below the size of the workspace's filesystem (0: that size
	// alone).
	MaxBytes int64
	// MaxWorkspaces and MaxSnapshots bound what one tenant keeps
	// (0: DefaultMaxWorkspaces, DefaultMaxSnapshots); past them a create
	// is quota_exceeded's kin: workspace_limit, snapshot_limit (limits.go).
	MaxWorkspaces int
	MaxSnapshots  int
	// CollectInterval is the least time between two collections of the
	// objects that a workspace's newer versions no longer name (0:
	// DefaultCollectInterval).
	CollectInterval time.Duration
	Log             *slog.Logger
}

// Service is the workspace engine. It implements gateway.Workspaces.
// It composes four parts, one per job, each with its own lock and maps:
// the content store (store.go), the push queue to the object store
// (syncer, sync.go), who holds a named workspace here and across a
// cluster (claims, locks.go), and the per-tenant bounds (limits,
// limits.go). The Service itself keeps the live sessions' ties to it and
// the artifacts it uploaded, and does what needs more than one part.
// A Service method never holds its own lock while calling a part; a
// claims method may ask the syncer (claims before syncer), no other part
// calls another.
type Service struct {
	cfg Config
	*store
	*syncer
	*claims
	*limits

	mu       sync.Mutex
	sessions map[string]*attachment // session id -> what it holds
	drop     map[string]bool        // sessions whose named workspace goes when they end
	discard  map[string]bool        // sessions that end without a last sync
	detached map[string]time.Time   // sessions that ended lately -> when
	uploaded map[string]time.Time   // artifact key -> when this gateway uploaded it

	// collectWake asks collectLoop for a collection (gc.go).
	collectWake chan struct{}
}

// attachment is a live session's tie to the engine.
type attachment struct {
	tenant string
	name   string // the named workspace it holds, or ""
	sb     sandbox.Sandbox
	// session is the session's id, kept in its snapshots.
	session string

	mu    sync.Mutex // one capture at a time
	cache scanCache
}

// SyncState is how far a workspace's or snapshot's copy in the object
// store is behind the gateway's.
type SyncState struct {
	LastSyncedAt *time.Time `json:"lastSyncedAt"`
	PendingBytes int64      `json:"pendingBytes"`
	// LastError is why the last capture of the workspace's files, or the
	// last push to the object store, failed ("" once both succeed).
	LastError string `json:"lastError,omitempty"`

	captureErr string // the last capture's failure, or ""
}

// view is what the API shows of st: LastError is the capture's failure
// before the push's.
func (st *SyncState) view() *SyncState {
	c := *st
	c.LastError = strings.Join(slices.DeleteFunc([]string{st.captureErr, st.LastError}, func(e string) bool { return e == "" }), "; ")
	c.captureErr = ""
	return &c
}

// captureWhy is what a tenant is told of a failed capture: which of its
// files are over the limit, or that the gateway's store failed (the log
// says how).
func captureWhy(err error) string {
	if why := tooLargeWhy(err); why != "" {
		return why
	}
	return ": the gateway's store failed (the gateway's log says how); it is tried again at the next sync"
}

type job struct {
	del     bool
	pending int64
	seq     uint64 // tells a job queued again while it ran from itself
	// restart marks a doc queued at start, which may be pushed already:
	// pushed only when it is newer than the object store's (sync.go stale).
	restart bool
}

// New opens the local store. Call Run for the periodic sync and the pusher.
func New(cfg Config) (*Service, error) {
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxWorkspaces <= 0 {
		cfg.MaxWorkspaces = DefaultMaxWorkspaces
	}
	if cfg.MaxSnapshots <= 0 {
		cfg.MaxSnapshots = DefaultMaxSnapshots
	}
	if cfg.CollectInterval <= 0 {
		cfg.CollectInterval = DefaultCollectInterval
	}
	local, err := newLocalBackend(filepath.Join(cfg.Dir, "store"))
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(cfg.Dir, "tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	sy := newSyncer(cfg)
	s := &Service{cfg: cfg, store: newStore(cfg, local, tmp), syncer: sy,
		claims: newClaims(cfg.Log, sy.pendingPush), limits: newLimits(cfg),
		sessions: map[string]*attachment{}, drop: map[string]bool{}, discard: map[string]bool{}, detached: map[string]time.Time{},
		uploaded: map[string]time.Time{}, collectWake: make(chan struct{}, 1)}
	// What an earlier run's replaced versions left is collected once it runs.
	s.wantCollect()
	if cfg.Remote != nil {
		// Whatever an earlier run left unpushed goes now.
		keys, err := local.List(context.Background(), "tenants/")
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			sy.queue[k] = job{restart: true}
		}
	}
	// A delete whose remote half had not run is done again (without an
	// object store, there is nothing left to delete but the tombstone).
	tombs, err := local.List(context.Background(), "tombstones/")
	if err != nil {
		return nil, err
	}
	for _, t := range tombs {
		key := strings.TrimPrefix(t, "tombstones/")
		if err := local.Delete(context.Background(), key); err != nil {
			return nil, err
		}
		if cfg.Remote != nil {
			sy.queue[key] = job{del: true}
		} else if err := local.Delete(context.Background(), t); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Remote says whether an object store is configured.
func (s *Service) Remote() bool { return s.cfg.Remote != nil }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func tenantDir(tenant string) string {
	h := sha256.Sum256([]byte(tenant))
	return "tenants/" + hex.EncodeToString(h[:16])
}

func workspaceKey(tenant, name string) string {
	return tenantDir(tenant) + "/workspaces/" + name + ".json"
}
func snapshotKey(tenant, id string) string { return tenantDir(tenant) + "/snapshots/" + id + ".json" }

// doc is what a workspace's or snapshot's manifest file holds: its
// pages (pages.go) and a summary.
type doc struct {
	Name       string    `json:"name,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	LastUsedAt time.Time `json:"lastUsedAt"`
	SizeBytes  int64     `json:"sizeBytes"`
	Files      int       `json:"files"`
	Pages      []page    `json:"pages"`
	// Session is the session a snapshot was taken of.
	Session string `json:"session,omitempty"`
}

// Info is what a tenant sees of a workspace.
type Info struct {
	Name       string     `json:"name"`
	SizeBytes  int64      `json:"sizeBytes"`
	Files      int        `json:"files"`
	CreatedAt  time.Time  `json:"createdAt"`
	LastUsedAt time.Time  `json:"lastUsedAt"`
	InUseBy    string     `json:"inUseBy,omitempty"`
	Sync       *SyncState `json:"sync,omitempty"`
}

// SnapshotInfo is what a snapshot's create answers.
type SnapshotInfo struct {
	SnapshotID string    `json:"snapshotId"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
	Files      int       `json:"files"`
	// StoredBytes is what this snapshot added to the store (changed files).
	StoredBytes int64 `json:"storedBytes"`
	// FrozenMillis is how long the session's processes were frozen;
	// Consistent is false when its driver cannot freeze them (workdir).
	FrozenMillis float64 `json:"frozenMillis"`
	Consistent   bool    `json:"consistent"`
}

func errInvalid(code, msg string) error { return gateway.Invalid(code, msg) }

func errNotFound(code, msg string) error {
	return &gateway.Error{Kind: gateway.KindNotFound, Code: code, Message: msg}
}

func errBusy(name string) error {
	return &gateway.Error{Kind: gateway.KindConflict, Code: "workspace_busy", Message: fmt.Sprintf("workspace %q is held by another live session; end it first", name)}
}

// errStore is a 503 workspace_store_failed for err, a failure of the
// local or the object store (which one, the log says: the tenant's
// answer names neither). Every one is logged with its cause.
func (s *store) errStore(msg string, err error) error {
	where := "local"
	if s.cfg.Remote != nil {
		where = "local or object"
	}
	s.cfg.Log.Error("workspace_store_failed", "what", msg, "store", where, "err", err)
	return &gateway.Error{Kind: gateway.KindUnavailable, Code: "workspace_store_failed", Message: msg, Err: err}
}

func checkName(name string) error {
	// ".." is refused as well: no store key may hold it (backend.go).
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return errInvalid("invalid_workspace_name", "a workspace name is 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit, without \"..\"")
	}
	return nil
}

// readDoc reads key from the object store, when there is one and this
// gateway has no newer copy waiting for the pusher (readRemoteDoc), and
// keeps a local copy; otherwise from the local store, or from the remote
// one when the local one has none. A deleted doc (tombstoned until its
// remote copy is deleted too) is fs.ErrNotExist.
func (s *Service) readDoc(ctx context.Context, key string) (*doc, error) {
	if dead, err := s.tombstoned(key); err != nil || dead {
		if err == nil {
			err = fs.ErrNotExist
		}
		return nil, err
	}
	b, fresh, err := s.readRemoteDoc(ctx, key)
	if fresh && err == nil {
		if _, err := parseDoc(key, b); err != nil {
			return nil, err
		}
		if perr := s.local.Put(ctx, key, bytes.NewReader(b), int64(len(b))); perr != nil {
			return nil, perr
		}
	}
	if !fresh {
		b, err = readAll(ctx, s.local, key)
	}
	if !fresh && errors.Is(err, fs.ErrNotExist) && s.cfg.Remote != nil {
		if b, err = readAll(ctx, s.cfg.Remote, key); err == nil {
			if _, err = parseDoc(key, b); err != nil {
				return nil, err
			}
			if perr := s.local.Put(ctx, key, bytes.NewReader(b), int64(len(b))); perr != nil {
				return nil, perr
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return parseDoc(key, b)
}

func parseDoc(key string, b []byte) (*doc, error) {
	var d doc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, corruptf("manifest %s: %v", key, err)
	}
	if len(d.Pages) > maxPages {
		return nil, corruptf("manifest %s has %d pages, more than %d", key, len(d.Pages), maxPages)
	}
	return &d, nil
}

// readAll reads a doc; one larger than maxDocBytes is corrupt.
func readAll(ctx context.Context, b Backend, key string) ([]byte, error) {
	r, err := b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	buf, err := io.ReadAll(io.LimitReader(r, maxDocBytes+1))
	if err == nil && len(buf) > maxDocBytes {
		err = corruptf("manifest %s is larger than %d bytes", key, maxDocBytes)
	}
	return buf, err
}

// setEntries stores entries as d's pages and summary.
func (s *store) setEntries(d *doc, entries []Entry, pins *pinSet) error {
	pages, err := s.storePages(entries, pins)
	if err != nil {
		return err
	}
	d.Pages, d.SizeBytes, d.Files = pages, 0, 0
	for i := range entries {
		if entries[i].Mode.IsRegular() {
			d.SizeBytes += entries[i].dataBytes()
			d.Files++
		}
	}
	return nil
}

// writeDoc stores d at key locally, after the objects it names are on
// disk, and queues its push. A create (fresh) ends a tombstone that an
// earlier delete of the same name left; any other write of a deleted
// doc is refused, so that a sync racing a delete brings nothing back.
func (s *Service) writeDoc(ctx context.Context, key string, d *doc, fresh bool) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if dead, err := s.tombstoned(key); err != nil {
		return err
	} else if dead && !fresh {
		return fmt.Errorf("%s: deleted", key)
	}
	if err := s.syncObjects(); err != nil {
		return fmt.Errorf("sync the local store: %w", err)
	}
	if err := s.local.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		return err
	}
	if fresh {
		if err := s.local.Delete(ctx, tombstoneKey(key)); err != nil {
			return err
		}
	}
	s.enqueue(key, job{pending: d.SizeBytes})
	return nil
}

// exists tells whether key is in the local or the remote store.
func (s *Service) exists(ctx context.Context, key string) (bool, error) {
	_, err := s.readDoc(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// CreateWorkspace makes tenant's empty workspace name.
func (s *Service) CreateWorkspace(ctx context.Context, tenant, name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	key := workspaceKey(tenant, name)
	ok, err := s.exists(ctx, key)
	if err != nil {
		return Info{}, s.errStore("could not look the workspace up", err)
	}
	if ok {
		return Info{}, &gateway.Error{Kind: gateway.KindConflict, Code: "workspace_exists", Message: fmt.Sprintf("workspace %q exists", name)}
	}
	release, err := s.reserve(ctx, tenant, key, s.workspaceLimit())
	if err != nil {
		return Info{}, err
	}
	now := time.Now().UTC()
	d := &doc{Name: name, CreatedAt: now, LastUsedAt: now, Pages: []page{}}
	if err := s.writeDoc(ctx, key, d, true); err != nil {
		release(false)
		return Info{}, s.errStore("could not store the workspace", err)
	}
	release(true)
	if s.cfg.Remote != nil {
		// Seen by every gateway sharing the store at once when it answers
		// (an empty workspace names no objects); the queued push repeats it.
		if b, err := json.Marshal(d); err == nil {
			if err := s.cfg.Remote.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
				s.cfg.Log.Warn("workspace_remote_put_failed", "key", key, "err", err)
			}
		}
	}
	return s.info(key, d), nil
}

func (s *Service) info(key string, d *doc) Info {
	return Info{Name: d.Name, SizeBytes: d.SizeBytes, Files: d.Files, CreatedAt: d.CreatedAt, LastUsedAt: d.LastUsedAt,
		InUseBy: s.holder(key), Sync: s.syncView(key)}
}

// ListWorkspaces lists tenant's workspaces, by name.
func (s *Service) ListWorkspaces(ctx context.Context, tenant string) ([]Info, error) {
	keys, err := s.listDocs(ctx, tenantDir(tenant)+"/workspaces/")
	if err != nil {
		return nil, s.errStore("could not list workspaces", err)
	}
	out := []Info{}
	for _, k := range keys {
		d, err := s.readDoc(ctx, k)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.cfg.Log.Warn("workspace_doc_unreadable", "key", k, "err", err)
			}
			continue // deleted (tombstoned) meanwhile, or unreadable
		}
		in := s.info(k, d)
		if in.InUseBy == "" {
			// Without the cluster's answer (no etcd quorum) the list
			// still serves, showing this gateway's holders only.
			if in.InUseBy, err = s.heldElsewhere(ctx, tenant, d.Name); err != nil {
				s.cfg.Log.Warn("workspace_holder_unknown", "workspace", d.Name, "err", err)
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// DeleteWorkspace removes tenant's workspace name, here and in the object
// store. A workspace a live session holds is workspace_busy.
func (s *Service) DeleteWorkspace(ctx context.Context, tenant, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	key := workspaceKey(tenant, name)
	ok, err := s.exists(ctx, key)
	if err != nil {
		return s.errStore("could not look the workspace up", err)
	}
	if !ok {
		return errNotFound("workspace_not_found", fmt.Sprintf("no workspace %q", name))
	}
	if s.holder(key) != "" {
		return errBusy(name)
	}
	if h, err := s.heldElsewhere(ctx, tenant, name); err != nil {
		return err
	} else if h != "" {
		return errBusy(name)
	}
	return s.remove(ctx, key)
}

// remove deletes doc key. With an object store, a durable tombstone
// stands for the delete until the pusher deleted the remote copy, across
// restarts (New queues it again).
func (s *Service) remove(ctx context.Context, key string) error {
	if s.cfg.Remote != nil {
		tomb := []byte(time.Now().UTC().Format(time.RFC3339Nano))
		if err := s.local.Put(ctx, tombstoneKey(key), bytes.NewReader(tomb), int64(len(tomb))); err != nil {
			return s.errStore("could not delete the workspace", err)
		}
	}
	if err := s.local.Delete(ctx, key); err != nil {
		return s.errStore("could not delete it from the local store", err)
	}
	s.forgetState(key)
	s.unsettle(key) // no longer counted against the tenant's limit
	if s.cfg.Remote != nil {
		// Gone for every gateway sharing the store at once when it
		// answers; the pusher deletes it there again (or, the store
		// down, for the first time), then collects.
		if err := s.cfg.Remote.Delete(ctx, key); err != nil {
			s.cfg.Log.Warn("workspace_remote_delete_failed", "key", key, "err", err)
		}
		s.enqueue(key, job{del: true})
		return nil
	}
	if err := s.collect(ctx); err != nil {
		s.cfg.Log.Warn("workspace_collect_failed", "err", err)
	}
	return nil
}

// Claim checks that tenant may start session from ref, and reserves a
// named workspace for it (gateway.Workspaces).
func (s *Service) Claim(ctx context.Context, tenant, session string, ref gateway.WorkspaceRef) error {
	switch {
	case ref.Name != "" && ref.FromSnapshot != "":
		return errInvalid("invalid_field", `give "workspace" or "fromSnapshot", not both`)
	case ref.Name != "":
		if err := checkName(ref.Name); err != nil {
			return err
		}
		key := workspaceKey(tenant, ref.Name)
		ok, err := s.exists(ctx, key)
		if err != nil {
			return s.errStore("could not read the workspace", err)
		}
		if !ok {
			return errNotFound("workspace_not_found", fmt.Sprintf("no workspace %q; create it with POST /v1/workspaces", ref.Name))
		}
		if !s.hold(key, session) {
			return errBusy(ref.Name)
		}
		return s.acquire(ctx, tenant, ref.Name, key, session)
	case ref.FromSnapshot != "":
		if !snapIDRE.MatchString(ref.FromSnapshot) {
			return errNotFound("snapshot_not_found", "no such snapshot")
		}
		ok, err := s.exists(ctx, snapshotKey(tenant, ref.FromSnapshot))
		if err != nil {
			return s.errStore("could not read the snapshot", err)
		}
		if !ok {
			return errNotFound("snapshot_not_found", fmt.Sprintf("no snapshot %q", ref.FromSnapshot))
		}
	}
	return nil
}

// detachedMemory is how long an ended session is remembered, so that a
// snapshot that raced its end does not attach it again.
const detachedMemory = 10 * time.Minute

// emptyHash is the SHA-256 of no bytes: the object of an empty file.
const emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

var snapIDRE = regexp.MustCompile(`^snap_[0-9a-f]{24}$`)

// Attach fills session's new workspace from ref (when fill) and starts
// syncing a named one (gateway.Workspaces).
func (s *Service) Attach(ctx context.Context, tenant, session string, ref gateway.WorkspaceRef, sb sandbox.Sandbox, fill bool) error {
	key := ""
	switch {
	case ref.Name != "":
		key = workspaceKey(tenant, ref.Name)
	case ref.FromSnapshot != "":
		key = snapshotKey(tenant, ref.FromSnapshot)
	}
	a := &attachment{tenant: tenant, name: ref.Name, sb: sb, session: session, cache: scanCache{}}
	if key != "" && fill {
		d, err := s.readDoc(ctx, key)
		if err != nil {
			return s.errStore("could not read the workspace's manifest", err)
		}
		entries, err := s.entries(ctx, d)
		if err != nil {
			return s.errStore("could not read the workspace's manifest", err)
		}
		if err := s.restore(ctx, &Manifest{Entries: entries}, homeOf(sb)); err != nil {
			s.cfg.Log.Error("workspace_restore_failed", "session", session, "err", err)
			return &gateway.Error{Kind: gateway.KindUnavailable, Code: "workspace_restore_failed", Message: "could not restore the workspace's files" + tooLargeWhy(err), Err: err}
		}
	}
	s.mu.Lock()
	s.sessions[session] = a
	s.mu.Unlock()
	return nil
}

// DropOnEnd makes session's named workspace go, here and in the object
// store, when the session ends (DELETE with keepWorkspace=false).
func (s *Service) DropOnEnd(session string, drop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if drop {
		s.drop[session] = true
	} else {
		delete(s.drop, session)
	}
}

// DiscardOnEnd makes session end without a last sync of its named
// workspace (DELETE with discard=true): what changed since the last
// sync is lost, the workspace keeps its last saved version.
func (s *Service) DiscardOnEnd(session string, discard bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if discard {
		s.discard[session] = true
	} else {
		delete(s.discard, session)
	}
}

// FinalSync saves session's named workspace before the session is
// deleted (a session without one: nothing to do). An error is
// workspace_sync_failed: the files could not be saved, and the caller
// must not end the session, so that they are kept until they are saved
// or discarded (DiscardOnEnd). What the session changes between this
// and its end is saved by Detach.
func (s *Service) FinalSync(ctx context.Context, session string) error {
	s.mu.Lock()
	a := s.sessions[session]
	s.mu.Unlock()
	if a == nil || a.name == "" || !s.stillHeld(ctx, session, a) {
		return nil
	}
	key := workspaceKey(a.tenant, a.name)
	_, err := s.syncWorkspace(ctx, a, key, "session_delete")
	s.noteCapture(key, err)
	if err == nil {
		return nil
	}
	s.cfg.Log.Warn("workspace_final_sync_failed", "session", session, "workspace", a.name, "err", err,
		"effect", "the session is not deleted; its files are kept")
	kind := gateway.KindUnavailable
	if errors.Is(err, errTooLarge) {
		kind = gateway.KindConflict
	}
	return &gateway.Error{Kind: kind, Code: "workspace_sync_failed", Err: err,
		Message: fmt.Sprintf("the session was not deleted: its workspace %q could not be saved%s; its files are kept. "+
			"Free space and delete it again, or delete it with discard=true to lose the changes since the last sync", a.name, captureWhy(err))}
}

// Detach is called when session ends, before its sandbox goes: a named
// workspace is synced a last time and released (gateway.Workspaces).
func (s *Service) Detach(ctx context.Context, session string) {
	s.mu.Lock()
	a := s.sessions[session]
	delete(s.sessions, session)
	now := time.Now()
	for id, t := range s.detached {
		if now.Sub(t) > detachedMemory {
			delete(s.detached, id)
		}
	}
	s.detached[session] = now
	drop := s.drop[session]
	delete(s.drop, session)
	discard := s.discard[session]
	delete(s.discard, session)
	s.mu.Unlock()
	held := s.heldBy(session)
	if a != nil && a.name != "" && !s.stillHeld(ctx, session, a) {
		s.cfg.Log.Warn("workspace_not_synced", "session", session, "workspace", a.name, "reason", "another session holds it now")
	} else if a != nil && a.name != "" {
		key := workspaceKey(a.tenant, a.name)
		if drop {
			a.mu.Lock() // after a periodic capture in flight, not during
			err := s.remove(ctx, key)
			a.mu.Unlock()
			if err != nil {
				s.cfg.Log.Error("workspace_delete_failed", "session", session, "err", err)
			}
		} else if discard {
			// Nothing is left unsaved: a failure of the changes dropped
			// is no longer the workspace's.
			s.noteCapture(key, nil)
			s.cfg.Log.Info("workspace_changes_discarded", "session", session, "workspace", a.name)
		} else if _, err := s.syncWorkspace(ctx, a, key, "session_end"); err != nil {
			s.noteCapture(key, err)
			s.cfg.Log.Error("workspace_sync_failed", "session", session, "workspace", a.name, "err", err,
				"effect", "the workspace keeps its last saved version")
		} else {
			s.noteCapture(key, nil)
		}
	}
	if r, claimed := s.letGo(session, held); claimed {
		s.releaseWhenPushed(ctx, workspaceKey(r.tenant, r.name), r)
	}
}

// SessionSync is the sync state of session's named workspace (nil: it
// holds none).
func (s *Service) SessionSync(session string) *SyncState {
	s.mu.Lock()
	a := s.sessions[session]
	s.mu.Unlock()
	if a == nil || a.name == "" {
		return nil
	}
	if st := s.syncView(workspaceKey(a.tenant, a.name)); st != nil {
		return st
	}
	return &SyncState{}
}

// capture scans a's workspace into the local store and writes the
// manifest at key. With freeze, the sandbox's processes are frozen for
// the final scan, after a first scan without them frozen stored what it
// could: only files changed since are read while frozen. A capture reads
// at most the workspace's limit (limitFor). The objects it stores are
// pinned against collect until its doc names them; gcMu is held only
// from storing the pages to writing the doc.
func (s *Service) capture(ctx context.Context, a *attachment, key string, freeze bool) (*SnapshotInfo, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pins := &pinSet{}
	defer s.unpin(pins)
	dir := homeOf(a.sb)
	limit := s.limitFor(dir)
	info := &SnapshotInfo{}
	var frz sandbox.Freezer
	if freeze {
		frz = freezerOf(a.sb)
	}
	if frz != nil {
		_, st, err := s.scan(ctx, dir, a.cache, limit, pins)
		if err != nil {
			return nil, err
		}
		info.StoredBytes += st.HashedBytes
	}
	var thaw func() error
	start := time.Now()
	if frz != nil {
		var err error
		if thaw, err = s.freezeRetrying(ctx, frz, a.session); err != nil {
			if ctx.Err() != nil || errors.Is(err, sandbox.ErrClosed) {
				return nil, fmt.Errorf("freeze the session: %w", err)
			}
			// No freeze: a copy that needs none, or none at all.
			m, st, serr := s.stableScan(ctx, dir, a.cache, limit, pins)
			if serr != nil {
				return nil, errors.Join(fmt.Errorf("freeze the session: %w", err), serr)
			}
			s.cfg.Log.Warn("workspace_snapshot_unfrozen", "session", a.session, "freeze_err", err,
				"effect", "taken without a freeze: two scans in a row found the same files")
			info.Consistent = true
			return s.finishCapture(ctx, a, key, m, st, info, pins)
		}
		info.Consistent = true
	}
	m, st, err := s.scan(ctx, dir, a.cache, limit, pins)
	if thaw != nil {
		if terr := thaw(); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw the session: %w", terr))
		}
		info.FrozenMillis = float64(time.Since(start).Microseconds()) / 1000
	}
	if err != nil {
		return nil, err
	}
	return s.finishCapture(ctx, a, key, m, st, info, pins)
}

// Freeze attempts of a snapshot, each given at most freezeAttempt, before
// it falls back to stableScan.
const (
	freezeTries   = 3
	freezeAttempt = 2 * time.Second
)

// freezeRetrying freezes frz, trying again (freezeTries in all) when the
// freeze does not complete; each failure is logged with its cause.
func (s *store) freezeRetrying(ctx context.Context, frz sandbox.Freezer, session string) (func() error, error) {
	var err error
	for try := 1; try <= freezeTries; try++ {
		actx, cancel := context.WithTimeout(ctx, freezeAttempt)
		var thaw func() error
		thaw, err = frz.Freeze(actx)
		cancel()
		if err == nil {
			return thaw, nil
		}
		s.cfg.Log.Warn("workspace_freeze_failed", "session", session, "try", try, "of", freezeTries, "err", err)
		if ctx.Err() != nil || errors.Is(err, sandbox.ErrClosed) {
			break
		}
	}
	return nil, err
}

// stableTries bounds stableScan's scans.
const stableTries = 5

// errUnstable: the files kept changing through every scan of stableScan.
var errUnstable = errors.New("no consistent copy without a freeze: the files changed between every two scans")

// stableScan captures dir without freezing its writers: scans in a row
// until two find the same files, with the same content and every path's
// stat (inode, size, ctime, mtime) the same, no name vanishing under
// either scan and no directory changing during it. That copy is one the
// files held for the whole of the second scan. Files changing through
// stableTries scans are errUnstable.
func (s *store) stableScan(ctx context.Context, dir string, cache scanCache, limit int64, pins *pinSet) (*Manifest, scanStats, error) {
	var prev *Manifest
	var prevStamps *scanStamps
	for range stableTries {
		if s.beforeStableScan != nil {
			s.beforeStableScan()
		}
		stamps := &scanStamps{keys: map[string]statKey{}}
		m, st, err := s.scanWith(ctx, dir, cache, limit, pins, stamps)
		if err != nil {
			return nil, st, err
		}
		if st.Vanished > 0 || !stamps.unchanged(dir) {
			prev, prevStamps = nil, nil // this scan saw the files move
			continue
		}
		if prev != nil && slices.EqualFunc(prev.Entries, m.Entries, sameEntry) && maps.Equal(prevStamps.keys, stamps.keys) {
			return m, st, nil
		}
		prev, prevStamps = m, stamps
	}
	return nil, scanStats{}, errUnstable
}

func sameEntry(a, b Entry) bool {
	return a.Path == b.Path && a.Mode == b.Mode && a.Size == b.Size && a.Hash == b.Hash && a.Link == b.Link &&
		a.HardLink == b.HardLink && a.Sparse == b.Sparse && slices.Equal(a.Extents, b.Extents)
}

// finishCapture stores manifest m as doc key (unless a workspace's is
// unchanged), completing info.
func (s *Service) finishCapture(ctx context.Context, a *attachment, key string, m *Manifest, st scanStats, info *SnapshotInfo, pins *pinSet) (*SnapshotInfo, error) {
	info.StoredBytes += st.HashedBytes
	info.SizeBytes, info.Files, info.CreatedAt = m.Bytes(), st.Files, m.CreatedAt
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	d := &doc{CreatedAt: m.CreatedAt, LastUsedAt: m.CreatedAt}
	if err := s.setEntries(d, m.Entries, pins); err != nil {
		return nil, err
	}
	replaced := false
	if old, err := s.readDoc(ctx, key); err == nil {
		if slices.Equal(old.Pages, d.Pages) && !strings.Contains(key, "/snapshots/") {
			return info, nil // unchanged: nothing to store or upload
		}
		d.Name, d.CreatedAt = old.Name, old.CreatedAt
		replaced = true
	}
	if a.name != "" && strings.Contains(key, "/workspaces/") {
		d.Name = a.name
	}
	if strings.Contains(key, "/snapshots/") {
		d.Session = a.session
	}
	if err := s.writeDoc(ctx, key, d, false); err != nil {
		return nil, err
	}
	if s.cfg.Remote == nil {
		s.markSynced(key)
		if replaced {
			s.wantCollect() // the objects only the old version named
		}
	}
	return info, nil
}

// freezerOf finds the driver's sandbox under the session's wrappers.
func freezerOf(sb sandbox.Sandbox) sandbox.Freezer {
	f, _ := find[sandbox.Freezer](sb)
	return f
}

// homeOf is the host directory that is sb's /workspace.
func homeOf(sb sandbox.Sandbox) string {
	if h, ok := find[sandbox.WorkspaceHomer](sb); ok {
		return h.WorkspaceHome()
	}
	return sb.Workdir()
}

// find looks for an optional interface on sb or the sandboxes it wraps.
func find[T any](sb sandbox.Sandbox) (T, bool) {
	for sb != nil {
		if f, ok := sb.(T); ok {
			return f, true
		}
		u, ok := sb.(interface{ Unwrap() sandbox.Sandbox })
		if !ok {
			break
		}
		sb = u.Unwrap()
	}
	var zero T
	return zero, false
}

// Snapshot takes a consistent copy of session's workspace, frozen unless
// stopped is true (a stopped session runs nothing).
func (s *Service) Snapshot(ctx context.Context, tenant, session string, sb sandbox.Sandbox, stopped bool) (SnapshotInfo, error) {
	s.mu.Lock()
	a := s.sessions[session]
	if a == nil {
		// A session without a workspace of its own is attached by its
		// first snapshot (its scan cache makes the next one incremental),
		// unless it ended meanwhile (a delete racing this snapshot): then
		// the capture is of its own, and nothing is left to remove.
		a = &attachment{tenant: tenant, sb: sb, session: session, cache: scanCache{}}
		if _, gone := s.detached[session]; !gone {
			s.sessions[session] = a
		}
	}
	s.mu.Unlock()
	id := "snap_" + randomHex(12)
	key := snapshotKey(tenant, id)
	release, err := s.reserve(ctx, tenant, key, s.snapshotLimit())
	if err != nil {
		return SnapshotInfo{}, err
	}
	info, err := s.capture(ctx, a, key, !stopped)
	release(err == nil)
	if err != nil {
		s.cfg.Log.Error("workspace_snapshot_failed", "session", session, "tenant_dir", tenantDir(tenant), "err", err)
		return SnapshotInfo{}, &gateway.Error{Kind: gateway.KindUnavailable, Code: "snapshot_failed", Message: "could not snapshot the workspace" + tooLargeWhy(err), Err: err}
	}
	info.SnapshotID = id
	s.cfg.Log.Info("workspace_snapshot", "session", session, "snapshot", id, "bytes", info.SizeBytes,
		"stored_bytes", info.StoredBytes, "frozen_ms", info.FrozenMillis)
	return *info, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openObject opens object hash of size bytes from the local store,
// fetching it from the remote one first when it is missing. What it
// reads is checked against hash and size, local or remote: at most
// size+1 bytes of a remote object are read.
func (s *store) openObject(ctx context.Context, hash string, size int64) (io.ReadCloser, error) {
	if !validHash(hash) {
		return nil, corruptf("manifest: bad hash %q", hash)
	}
	if size < 0 {
		return nil, corruptf("manifest: bad size %d", size)
	}
	if hash == emptyHash && size == 0 {
		// An empty file, or a sparse one of holes only: no store is asked
		// (S3 refuses an empty PUT sent without a length).
		return io.NopCloser(strings.NewReader("")), nil
	}
	key := objectKey(hash)
	r, err := s.local.Get(ctx, key)
	if err == nil {
		return verifying(r, hash, size), nil
	}
	if !errors.Is(err, fs.ErrNotExist) || s.cfg.Remote == nil {
		return nil, err
	}
	rr, err := s.cfg.Remote.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rr.Close()
	tmp, err := os.CreateTemp(s.tmpDir, "get-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, verifying(rr, hash, size))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("object %s from the object store: %w", hash, err)
	}
	if _, err := s.pinObject(hash, tmp.Name(), nil); err != nil {
		return nil, err
	}
	s.markRemote(key)
	r, err = s.local.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return verifying(r, hash, size), nil
}
