package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem"
)

// A directory is watched by polling: inotify runs in the sandbox's
// kernel, out of the gateway's reach, so each watcher lists the directory
// over the session's SFTP server every Interval and tells what changed
// since the listing before. SFTP v3 times have one-second resolution: a
// change that keeps a file's size within the second it was last written
// is seen only by a later change; a rename reads as a remove and a
// create.
//
// Polling costs the gateway CPU in proportion to the entries listed, so
// it is bounded three ways: a watched tree holds at most MaxEntries
// entries; a watcher waits, between listings, at least PollFactor times
// as long as its last listing took; and the entries listed per second are
// budgeted per tenant and gateway-wide (a watcher over budget waits).

// WatchBounds bound the directory watchers.
type WatchBounds struct {
	// PerSession, PerTenant and Total bound the watchers open at once
	// (defaults 8, 32 and 256).
	PerSession, PerTenant, Total int
	// Interval is how often a watcher lists its directory (default
	// 200 ms).
	Interval time.Duration
	// MaxEvents bounds the events a watcher keeps until they are fetched
	// (default 1024); past it the watcher fails, and says so.
	MaxEvents int
	// Idle removes a watcher (CreateWatcher's) whose events nobody fetched
	// for this long (default 10 min).
	Idle time.Duration
	// MaxEntries bounds the entries a watched directory (its tree, when
	// recursive) may hold (default 1000).
	MaxEntries int
	// PollFactor: a watcher waits at least PollFactor times its last
	// listing's duration before the next (default 10: a watcher spends at
	// most about a tenth of a core).
	PollFactor int
	// TenantEntriesPerSecond and EntriesPerSecond budget the entries the
	// watchers list, per tenant and gateway-wide (defaults 20,000 and
	// 100,000).
	TenantEntriesPerSecond, EntriesPerSecond int
}

// Defaults of WatchBounds.
const (
	DefaultWatchersPerSession = 8
	DefaultWatchersPerTenant  = 32
	DefaultWatchers           = 256
	DefaultWatchInterval      = 200 * time.Millisecond
	DefaultWatchEvents        = 1024
	DefaultWatchIdle          = 10 * time.Minute
	DefaultWatchMaxEntries    = 1000
	DefaultWatchPollFactor    = 10
	DefaultWatchTenantRate    = 20_000
	DefaultWatchRate          = 100_000
)

func (b WatchBounds) withDefaults() WatchBounds {
	if b.PerSession <= 0 {
		b.PerSession = DefaultWatchersPerSession
	}
	if b.PerTenant <= 0 {
		b.PerTenant = DefaultWatchersPerTenant
	}
	if b.Total <= 0 {
		b.Total = DefaultWatchers
	}
	if b.Interval <= 0 {
		b.Interval = DefaultWatchInterval
	}
	if b.MaxEvents <= 0 {
		b.MaxEvents = DefaultWatchEvents
	}
	if b.Idle <= 0 {
		b.Idle = DefaultWatchIdle
	}
	if b.MaxEntries <= 0 {
		b.MaxEntries = DefaultWatchMaxEntries
	}
	if b.PollFactor <= 0 {
		b.PollFactor = DefaultWatchPollFactor
	}
	if b.TenantEntriesPerSecond <= 0 {
		b.TenantEntriesPerSecond = DefaultWatchTenantRate
	}
	if b.EntriesPerSecond <= 0 {
		b.EntriesPerSecond = DefaultWatchRate
	}
	return b
}

// watchers are the open watchers and their counts.
type watchers struct {
	b WatchBounds

	mu        sync.Mutex
	byID      map[string]*watcher
	bySession map[string]int
	byTenant  map[string]int
	total     int
	// The entries-listed budgets: the whole gateway's, and each tenant's
	// with watchers open.
	budget       entryBudget
	tenantBudget map[string]*entryBudget
}

func newWatchers(b WatchBounds) *watchers {
	return &watchers{b: b, byID: map[string]*watcher{}, bySession: map[string]int{}, byTenant: map[string]int{},
		budget: entryBudget{rate: float64(b.EntriesPerSecond)}, tenantBudget: map[string]*entryBudget{}}
}

// entryBudget paces the entries listed to rate a second, with a second's
// worth of burst.
type entryBudget struct {
	rate float64
	free time.Time // when what was charged is paid off
}

// charge counts n entries listed at now, and is how long the next listing
// should wait for the budget.
func (b *entryBudget) charge(now time.Time, n int) time.Duration {
	if b.free.Before(now) {
		b.free = now
	}
	b.free = b.free.Add(time.Duration(float64(n) / b.rate * float64(time.Second)))
	return max(0, b.free.Sub(now)-time.Second)
}

// charge counts a listing of n entries by tenant's watcher, which took
// took, and is how long the watcher waits before its next listing.
func (ws *watchers) charge(tenant string, n int, took time.Duration) time.Duration {
	now := time.Now()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	wait := max(ws.b.Interval, time.Duration(ws.b.PollFactor)*took)
	wait = max(wait, ws.budget.charge(now, n))
	if tb := ws.tenantBudget[tenant]; tb != nil {
		wait = max(wait, tb.charge(now, n))
	}
	return wait
}

// fileState is what a listing tells of one entry.
type fileState struct {
	entry dataplane.Entry
}

func (a fileState) written(b fileState) bool {
	return a.entry.SizeBytes != b.entry.SizeBytes || !a.entry.Mtime.Equal(b.entry.Mtime) || a.entry.Type != b.entry.Type
}

// watcher polls one directory.
type watcher struct {
	ws           *watchers
	id           string
	c            call
	dir          string
	recursive    bool
	includeEntry bool

	cancel context.CancelFunc
	done   chan struct{}
	remove func() // unregisters from the session's end; under mu

	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	err     error         // why it stopped, once it did
	changed chan struct{} // closed and replaced when events or err change
	fetched time.Time     // last GetWatcherEvents
	reaper  *time.Timer   // closes a watcher that stopped on its own, unfetched
}

// start opens a watcher on dir for call c: it takes the first listing
// before it returns, so that every change after it is seen.
func (s *Server) startWatch(ctx context.Context, c call, dir string, recursive, includeEntry bool) (*watcher, error) {
	ws := s.watches
	ws.mu.Lock()
	switch {
	case ws.bySession[c.sess.ID] >= ws.b.PerSession:
		ws.mu.Unlock()
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_watchers",
			fmt.Sprintf("this sandbox has %d directory watchers open, the most it may; remove one", ws.b.PerSession))
	case ws.byTenant[c.sess.Tenant] >= ws.b.PerTenant:
		ws.mu.Unlock()
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_watchers",
			fmt.Sprintf("your sandboxes have %d directory watchers open, the most they may; remove one", ws.b.PerTenant))
	case ws.total >= ws.b.Total:
		ws.mu.Unlock()
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_watchers", "the gateway watches as many directories as it may; try again later")
	}
	ws.bySession[c.sess.ID]++
	if ws.byTenant[c.sess.Tenant]++; ws.tenantBudget[c.sess.Tenant] == nil {
		ws.tenantBudget[c.sess.Tenant] = &entryBudget{rate: float64(ws.b.TenantEntriesPerSecond)}
	}
	ws.total++
	ws.mu.Unlock()

	var b [12]byte
	_, _ = rand.Read(b[:])
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{ws: ws, id: hex.EncodeToString(b[:]), c: c, dir: dir, recursive: recursive, includeEntry: includeEntry,
		cancel: cancel, done: make(chan struct{}), changed: make(chan struct{}), fetched: time.Now()}
	first, err := s.listWatched(ctx, w)
	if err != nil {
		cancel()
		ws.release(w, false)
		return nil, err
	}
	// Registered and polling before it is tied to the session's end,
	// which may come at once and closes it.
	ws.mu.Lock()
	ws.byID[w.id] = w
	ws.mu.Unlock()
	go s.poll(wctx, w, first)
	errEnded := rpcError(connect.CodeUnavailable, "session_not_running", notRunning(c))
	remove, ok := c.sess.AddConn(func() {
		w.stop(errEnded)
		go w.close()
	})
	if !ok {
		w.close()
		return nil, errEnded
	}
	w.mu.Lock()
	w.remove = remove
	w.mu.Unlock()
	return w, nil
}

// release uncounts w (and forgets it when registered).
func (ws *watchers) release(w *watcher, registered bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if registered {
		if ws.byID[w.id] != w {
			return
		}
		delete(ws.byID, w.id)
	}
	dec := func(m map[string]int, k string) {
		if m[k]--; m[k] <= 0 {
			delete(m, k)
		}
	}
	dec(ws.bySession, w.c.sess.ID)
	dec(ws.byTenant, w.c.sess.Tenant)
	if ws.byTenant[w.c.sess.Tenant] == 0 {
		delete(ws.tenantBudget, w.c.sess.Tenant)
	}
	ws.total--
}

// get is watcher id of the session sessID (another session's is not
// found).
func (ws *watchers) get(sessID, id string) (*watcher, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.byID[id]
	if !ok || w.c.sess.ID != sessID {
		return nil, false
	}
	return w, true
}

// stop ends w's polling with err (nil: removed by its client); the
// events not fetched stay readable until it is closed: by its client, or
// Idle after a stop of its own (err), when nobody fetches them.
func (w *watcher) stop(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
		if err == nil {
			w.err = errors.New("removed")
		} else {
			w.reaper = time.AfterFunc(w.ws.b.Idle, w.close)
		}
		close(w.changed)
		w.changed = make(chan struct{})
	}
	w.mu.Unlock()
	w.cancel()
}

// close stops w and forgets it.
func (w *watcher) close() {
	w.stop(nil)
	<-w.done
	w.mu.Lock()
	remove := w.remove
	if w.reaper != nil {
		w.reaper.Stop()
	}
	w.mu.Unlock()
	if remove != nil {
		remove()
	}
	w.ws.release(w, true)
}

// listWatched lists w's directory (down its tree when recursive) by path
// relative to it.
func (s *Server) listWatched(ctx context.Context, w *watcher) (map[string]fileState, error) {
	fsys, err := s.d.Plane.Files.Open(ctx, w.c.sess.ID, w.c.sess.Tenant, w.c.sess, false)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	limit := s.watches.b.MaxEntries
	entries, truncated, err := fsys.List(w.dir, w.recursive, limit)
	if err != nil {
		return nil, err
	}
	if truncated {
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_entries",
			fmt.Sprintf("%s holds more than %d entries: too many to watch", w.dir, limit))
	}
	out := make(map[string]fileState, len(entries))
	for _, e := range entries {
		out[relTo(w.dir, e.Path)] = fileState{entry: e}
	}
	return out, nil
}

// relTo is p, a path under dir (path.Join(dir, name...)), relative to
// dir.
func relTo(dir, p string) string {
	switch dir {
	case ".":
		return p
	case "/":
		return strings.TrimPrefix(p, "/")
	}
	return strings.TrimPrefix(p, dir+"/")
}

// poll lists w's directory until w is stopped, turning each difference
// into events: every interval at most, paced by the listings' cost
// (watchers.charge).
func (s *Server) poll(ctx context.Context, w *watcher, prev map[string]fileState) {
	defer close(w.done)
	t := time.NewTimer(s.watches.charge(w.c.sess.Tenant, len(prev), 0))
	defer t.Stop()
	failures := 0 // transient ones in a row
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.idle(s.watches.b.Idle) {
			s.d.Log.Info("envd_watcher_idle", "session", w.c.sess.ID, "watcher", w.id)
			go w.close()
			return
		}
		began := time.Now()
		cur, err := s.listWatched(ctx, w)
		t.Reset(s.watches.charge(w.c.sess.Tenant, len(cur), time.Since(began)))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ce *connect.Error
			if !errors.As(err, &ce) {
				ce = s.toRPC(ctx, err, "watch directory")
			}
			if transient(ce) && failures < maxWatchRetries {
				// The files service busy, or the sandbox briefly out of
				// reach: try again, backing off.
				failures++
				t.Reset(min(s.watches.b.Interval<<failures, maxWatchBackoff))
				continue
			}
			if ce.Code() == connect.CodeNotFound {
				// The directory itself went: say so, and stop.
				w.add(s, []*filesystem.FilesystemEvent{{Name: "", Type: filesystem.EventType_EVENT_TYPE_REMOVE}})
			}
			w.stop(ce)
			return
		}
		failures = 0
		if evs := s.diff(ctx, w, prev, cur); len(evs) > 0 {
			if !w.add(s, evs) {
				return
			}
		}
		prev = cur
	}
}

// A watcher whose listing fails transiently tries again, backing off,
// up to maxWatchRetries times in a row.
const (
	maxWatchRetries = 8
	maxWatchBackoff = 30 * time.Second
)

// transient reports whether a listing's failure may pass: the files
// service unavailable or busy (not a sandbox that stopped: its watchers
// are stopped with it).
func transient(ce *connect.Error) bool {
	switch ce.Meta().Get(codeMeta) {
	case "files_unavailable", "too_many_file_transfers":
		return true
	}
	return false
}

// idle reports whether w's events went unfetched for longer than idle
// (a WatchDir stream fetches them all the time).
func (w *watcher) idle(idle time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.fetched) > idle
}

// diff is the events that turn prev into cur, in path order.
func (s *Server) diff(ctx context.Context, w *watcher, prev, cur map[string]fileState) []*filesystem.FilesystemEvent {
	var evs []*filesystem.FilesystemEvent
	var withEntry []*filesystem.FilesystemEvent
	var entries []dataplane.Entry
	for name, st := range cur {
		old, ok := prev[name]
		var t filesystem.EventType
		switch {
		case !ok:
			t = filesystem.EventType_EVENT_TYPE_CREATE
		case old.written(st):
			t = filesystem.EventType_EVENT_TYPE_WRITE
		case old.entry.Mode != st.entry.Mode:
			t = filesystem.EventType_EVENT_TYPE_CHMOD
		default:
			continue
		}
		ev := &filesystem.FilesystemEvent{Name: name, Type: t}
		evs = append(evs, ev)
		if w.includeEntry {
			withEntry, entries = append(withEntry, ev), append(entries, st.entry)
		}
	}
	for name := range prev {
		if _, ok := cur[name]; !ok {
			evs = append(evs, &filesystem.FilesystemEvent{Name: name, Type: filesystem.EventType_EVENT_TYPE_REMOVE})
		}
	}
	if len(withEntry) > 0 {
		if fsys, err := s.d.Plane.Files.Open(ctx, w.c.sess.ID, w.c.sess.Tenant, w.c.sess, false); err == nil {
			o := &owners{fsys: fsys}
			for i, ev := range withEntry {
				ev.Entry = entryInfo(fsys, o, entries[i])
			}
			_ = fsys.Close()
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].Name != evs[j].Name {
			return evs[i].Name < evs[j].Name
		}
		return evs[i].Type < evs[j].Type
	})
	return evs
}

// add queues evs; past MaxEvents the watcher fails (it reports false).
func (w *watcher) add(s *Server, evs []*filesystem.FilesystemEvent) bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	if len(w.events)+len(evs) > s.watches.b.MaxEvents {
		w.mu.Unlock()
		w.stop(rpcError(connect.CodeResourceExhausted, "too_many_events",
			fmt.Sprintf("more than %d events waited to be fetched: the watcher stopped; create another", s.watches.b.MaxEvents)))
		return false
	}
	w.events = append(w.events, evs...)
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
	return true
}

// take returns the queued events, why the watcher stopped (nil while it
// runs) and a channel closed at the next change.
func (w *watcher) take() ([]*filesystem.FilesystemEvent, error, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events = nil
	w.fetched = time.Now()
	return evs, w.err, w.changed
}

// watchRequest checks a watch's path.
func watchPath(p string) (string, error) {
	cp, err := checkPath(p)
	if err != nil {
		return "", err
	}
	return path.Clean(cp), nil
}

// WatchDir streams a directory's events until the client goes away: a
// start event once it watches, then each change, a keepalive event after
// every quiet interval.
func (f *fsService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	c := callOf(ctx)
	dir, err := watchPath(req.Msg.GetPath())
	if err != nil {
		return err
	}
	done, err := f.s.streams.open(c)
	if err != nil {
		return err
	}
	defer done()
	w, err := f.s.startWatch(ctx, c, dir, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return f.s.toRPC(ctx, err, "watch directory")
	}
	defer w.close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := time.NewTicker(keepaliveInterval(req.Header()))
	defer keepalive.Stop()
	for {
		evs, werr, changed := w.take()
		for _, ev := range evs {
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		if werr != nil {
			return werr
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-keepalive.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// CreateWatcher starts a watcher whose events GetWatcherEvents fetches.
func (f *fsService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	c := callOf(ctx)
	dir, err := watchPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := f.s.startWatch(ctx, c, dir, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, f.s.toRPC(ctx, err, "watch directory")
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: w.id}), nil
}

// GetWatcherEvents fetches a watcher's events since the last fetch; a
// watcher that stopped (its directory went, too many events waited, its
// session stopped) answers its events, then its error.
func (f *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	c := callOf(ctx)
	w, ok := f.s.watches.get(c.sess.ID, req.Msg.GetWatcherId())
	if !ok {
		return nil, rpcError(connect.CodeNotFound, "watcher_not_found", "watcher "+req.Msg.GetWatcherId()+" not found")
	}
	evs, werr, _ := w.take()
	if werr != nil && len(evs) == 0 {
		go w.close()
		return nil, werr
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: append([]*filesystem.FilesystemEvent{}, evs...)}), nil
}

// RemoveWatcher stops and forgets a watcher.
func (f *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	c := callOf(ctx)
	w, ok := f.s.watches.get(c.sess.ID, req.Msg.GetWatcherId())
	if !ok {
		return nil, rpcError(connect.CodeNotFound, "watcher_not_found", "watcher "+req.Msg.GetWatcherId()+" not found")
	}
	w.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
