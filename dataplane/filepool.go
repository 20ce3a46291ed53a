package dataplane

import (
	"context"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Files shares one SFTP server per session among the session's file
// operations, and bounds its transfers (downloads and uploads: streams).
//
// Before, every operation started its own sftp-server in the sandbox
// (about 5 pids each), so a flood of link fetches could use up the
// session's pids. Now a session has at most one server, started by the
// first operation, kept while any operation uses it and for Idle after
// the last, and ended with the session. A server that has died (the
// sandbox user killed it, the sandbox stopped) is replaced by the next
// operation.
//
// Streams are counted per session, per tenant and in all; past a bound
// Open fails with KindBusy, so that one tenant's readers cannot hold the
// gateway's memory (each stream holds at most a few of its read windows:
// see streamFile).
//
// The zero value is ready to use, with the defaults below.
type Files struct {
	// Idle is how long an unused server is kept (default 30 s).
	Idle time.Duration
	// MaxStreamsPerSession, MaxStreamsPerTenant and MaxStreams bound the
	// streams open at once (defaults 16, 64 and 256).
	MaxStreamsPerSession int
	MaxStreamsPerTenant  int
	MaxStreams           int
	// Journal is a gateway-owned directory where uploads in flight are
	// noted (see noteTemp); "" notes nothing.
	Journal string

	mu      sync.Mutex
	servers map[string]*pooled // by session id
	tenants map[string]int     // streams per tenant
	streams int                // streams in all
}

// Defaults of Files' bounds.
const (
	DefaultFilesIdle            = 30 * time.Second
	DefaultMaxStreamsPerSession = 16
	DefaultMaxStreamsPerTenant  = 64
	DefaultMaxStreams           = 256
)

// pooled is a session's shared server.
type pooled struct {
	ready   chan struct{} // closed once srv or err is set
	srv     *server
	err     error
	refs    int // FSes handed out and not yet closed
	streams int
	links   int // of streams, those of link fetches
	idle    *time.Timer
	gone    bool   // removed from the pool (dead, or the session ended)
	remove  func() // unregisters from the session's end
}

// Open returns an FS on the session id's shared server (s, of tenant),
// starting the server if there is none; ctx is for the start. stream
// counts it as a transfer, refused with KindBusy past a bound. Close the
// FS when done.
func (p *Files) Open(ctx context.Context, id, tenant string, s FileSession, stream bool) (*FS, error) {
	return p.openFS(ctx, id, tenant, s, stream, false)
}

// OpenLink is Open for the stream of a presigned link's fetch: link
// fetches hold at most half of a session's streams (at least one), so
// that a link's holders cannot lock the session's owner out.
func (p *Files) OpenLink(ctx context.Context, id, tenant string, s FileSession) (*FS, error) {
	return p.openFS(ctx, id, tenant, s, true, true)
}

func (p *Files) openFS(ctx context.Context, id, tenant string, s FileSession, stream, link bool) (*FS, error) {
	p.mu.Lock()
	if stream {
		if err := p.admitLocked(id, tenant, link); err != nil {
			p.mu.Unlock()
			return nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		e := p.servers[id]
		if e == nil {
			e = p.startLocked(ctx, id, s)
		}
		e.refs++
		if e.idle != nil {
			e.idle.Stop()
			e.idle = nil
		}
		if stream {
			e.streams++
		}
		if link {
			e.links++
		}
		p.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			p.put(id, e, stream, link)
			p.unadmit(tenant, stream)
			return nil, fileErr(KindUnavailable, ctx.Err(), "cannot start the sandbox's file server")
		}
		if e.err != nil {
			p.put(id, e, stream, link)
			p.unadmit(tenant, stream)
			return nil, e.err
		}
		if !e.srv.dead() {
			var once sync.Once
			return &FS{c: e.srv.c, streams: p.open, temp: func(tmp string) func() { return p.noteTemp(id, tmp) }, release: func() error {
				once.Do(func() {
					p.put(id, e, stream, link)
					p.unadmit(tenant, stream)
				})
				return nil
			}}, nil
		}
		// It died since: drop it and start another, once.
		p.put(id, e, stream, link)
		p.mu.Lock()
		p.dropLocked(id, e)
		if attempt == 2 {
			p.mu.Unlock()
			p.unadmit(tenant, stream)
			return nil, fileErr(KindUnavailable, nil, "the sandbox's file server ended at its start")
		}
	}
}

// open is how many streams are open.
func (p *Files) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streams
}

// unadmit uncounts a stream of tenant.
func (p *Files) unadmit(tenant string, stream bool) {
	if !stream {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.streams--
	if p.tenants[tenant]--; p.tenants[tenant] <= 0 {
		delete(p.tenants, tenant)
	}
}

// admitLocked counts a new stream of session id, of tenant, or refuses it
// (link: a link fetch's).
func (p *Files) admitLocked(id, tenant string, link bool) error {
	perSession := orDefault(p.MaxStreamsPerSession, DefaultMaxStreamsPerSession)
	perTenant := orDefault(p.MaxStreamsPerTenant, DefaultMaxStreamsPerTenant)
	total := orDefault(p.MaxStreams, DefaultMaxStreams)
	perLinks := max(1, perSession/2)
	n, links := 0, 0
	if e := p.servers[id]; e != nil {
		n, links = e.streams, e.links
	}
	switch {
	case n >= perSession:
		return fileErr(KindBusy, nil, "the session already has %d file transfers open (the limit per session); retry when one ends", perSession)
	case link && links >= perLinks:
		return fileErr(KindBusy, nil, "the session's links already have %d file transfers open (half the limit per session); retry when one ends", perLinks)
	case p.tenants[tenant] >= perTenant:
		return fileErr(KindBusy, nil, "the tenant already has %d file transfers open (the limit per tenant); retry when one ends", perTenant)
	case p.streams >= total:
		return fileErr(KindBusy, nil, "the gateway already has %d file transfers open (its limit); retry later", total)
	}
	if p.tenants == nil {
		p.tenants = map[string]int{}
	}
	p.tenants[tenant]++
	p.streams++
	return nil
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// startLocked adds session id's entry and starts its server in the
// background; the entry's ready is closed when it is up or failed.
func (p *Files) startLocked(ctx context.Context, id string, s FileSession) *pooled {
	e := &pooled{ready: make(chan struct{})}
	if p.servers == nil {
		p.servers = map[string]*pooled{}
	}
	p.servers[id] = e
	// The start outlives one caller's cancellation: others may wait on it.
	ctx = context.WithoutCancel(ctx)
	go func() {
		srv, err := startServer(ctx, s.Sandbox())
		remove, ok := func() {}, true
		if err == nil {
			remove, ok = s.AddConn(func() {
				p.mu.Lock()
				p.dropLocked(id, e)
				p.mu.Unlock()
			})
			if ps, can := s.(pausedConns); ok && can {
				// A pause freezes the server: the operations in flight on
				// it (a download, an upload) would wait for the resume.
				// It is dropped, and its connection closed at once, so
				// that they fail now (the API says session_paused); the
				// next operation, which resumes the session, starts another.
				onEnd := remove
				onPause, _ := ps.AddPausedConn(func() { p.dropPaused(id, e, srv) })
				remove = func() { onPause(); onEnd() }
			}
			if !ok {
				go srv.close()
				srv, err = nil, fileErr(KindUnavailable, nil, "the session has ended")
			}
		}
		p.mu.Lock()
		e.srv, e.err, e.remove = srv, err, remove
		close(e.ready)
		switch {
		case err != nil:
			// Not kept: the next Open tries again.
			if p.servers[id] == e {
				delete(p.servers, id)
			}
			e.gone = true
		case e.refs == 0:
			// Every caller that waited for it gave up meanwhile.
			p.releasedLocked(id, e)
		}
		p.mu.Unlock()
	}()
	return e
}

// pausedConns is implemented by sessions that can be paused
// (gateway.Session): what AddPausedConn registers, a pause calls.
type pausedConns interface {
	AddPausedConn(closeFn func()) (remove func(), ok bool)
}

// dropPaused drops e, session id's server srv, which a pause froze, and
// closes its connection now, whoever uses it: their operations fail at
// once instead of waiting for the resume. The server process itself ends
// as a dropped one does, once its last FS is closed (it sees the end of
// its input when the session resumes).
//
// Never in the pause's way: the SFTP client's Close waits for its reader,
// which a frozen server never answers, so the reader's pipe is closed
// first (its Read fails, and so do the operations waiting on it), and all
// of it runs on its own.
func (p *Files) dropPaused(id string, e *pooled, srv *server) {
	p.mu.Lock()
	p.dropLocked(id, e)
	p.mu.Unlock()
	go func() {
		if rc, ok := srv.proc.Stdout().(io.Closer); ok {
			_ = rc.Close()
		}
		_ = srv.c.Close()
	}()
}

// put hands back one FS of entry e.
func (p *Files) put(id string, e *pooled, stream, link bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e.refs--
	if stream {
		e.streams--
	}
	if link {
		e.links--
	}
	if e.refs > 0 || e.srv == nil {
		return
	}
	p.releasedLocked(id, e)
}

// releasedLocked handles e, up and used by no FS: dropped if it is gone
// or dead, else kept for Idle.
func (p *Files) releasedLocked(id string, e *pooled) {
	if e.gone || e.srv.dead() {
		p.dropLocked(id, e)
		return
	}
	var tm *time.Timer
	tm = time.AfterFunc(orDuration(p.Idle, DefaultFilesIdle), func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if e.refs == 0 && e.idle == tm { // not used, nor kept again, since
			p.dropLocked(id, e)
		}
	})
	e.idle = tm
}

func orDuration(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// dropLocked removes e from the pool; its server ends once no FS uses it.
func (p *Files) dropLocked(id string, e *pooled) {
	if p.servers[id] == e {
		delete(p.servers, id)
	}
	e.gone = true
	if e.idle != nil {
		e.idle.Stop()
		e.idle = nil
	}
	if e.refs > 0 || e.srv == nil {
		return // put drops it again at its last FS
	}
	srv, remove := e.srv, e.remove
	e.srv = nil
	go func() {
		if remove != nil {
			remove()
		}
		_ = srv.close()
	}()
}

// Close drops every server of the pool, at the gateway's shutdown once no
// API serves any more: an idle one ends now, one in use when its last FS
// closes. An Open after it starts a new server, as after an idle end.
func (p *Files) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, e := range p.servers {
		p.dropLocked(id, e)
	}
}

// Servers is how many sessions have a server in the pool (for tests).
func (p *Files) Servers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.servers)
}

// Uploads in flight are journaled, so that the temporary file of one cut
// off by a crash of the gateway is removed at the next start (SFTP has no
// O_TMPFILE: an upload's bytes go to a named file next to its target,
// renamed over it once complete). Each in-flight upload is one small file
// in Files.Journal, holding its session's id and the temporary file's
// path as the sandbox's SFTP server sees it; it is removed once the
// temporary file is renamed or removed.

// StaleUpload is one journaled upload.
type StaleUpload struct {
	file, session, tmp string
}

// noteTemp journals tmp, an upload's temporary file in session id; done
// forgets it. Without a Journal it does nothing.
func (p *Files) noteTemp(id, tmp string) (done func()) {
	if p.Journal == "" {
		return func() {}
	}
	if err := os.MkdirAll(p.Journal, 0o700); err != nil {
		return func() {}
	}
	f, err := os.CreateTemp(p.Journal, "upload-*")
	if err != nil {
		return func() {}
	}
	_, werr := f.WriteString(id + "\x00" + tmp)
	if cerr := f.Close(); werr != nil || cerr != nil {
		_ = os.Remove(f.Name())
		return func() {}
	}
	return func() { _ = os.Remove(f.Name()) }
}

// StaleUploads lists the uploads journaled by an earlier run of the
// gateway: call it before any upload of this run starts.
func (p *Files) StaleUploads() []StaleUpload {
	if p.Journal == "" {
		return nil
	}
	des, err := os.ReadDir(p.Journal)
	if err != nil {
		return nil
	}
	var out []StaleUpload
	for _, de := range des {
		file := filepath.Join(p.Journal, de.Name())
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		id, tmp, ok := strings.Cut(string(b), "\x00")
		if !ok || id == "" || !strings.HasPrefix(path.Base(tmp), tempPrefix) {
			_ = os.Remove(file) // not one of ours
			continue
		}
		out = append(out, StaleUpload{file: file, session: id, tmp: tmp})
	}
	return out
}

// SweepUploads removes the temporary files of stale (StaleUploads),
// through each live session's SFTP server; lookup finds a session and its
// tenant (ok false: the session is gone, and its files with it). An entry
// whose session lives but whose file cannot be removed now is kept for
// the next start. It returns how many files it removed.
func (p *Files) SweepUploads(ctx context.Context, stale []StaleUpload, lookup func(id string) (s Session, tenant string, live, ok bool)) int {
	removed := 0
	for _, e := range stale {
		s, tenant, live, ok := lookup(e.session)
		if !ok {
			_ = os.Remove(e.file)
			continue
		}
		if !live {
			continue
		}
		f, err := p.Open(ctx, e.session, tenant, s, false)
		if err != nil {
			continue
		}
		err = f.c.Remove(e.tmp)
		_ = f.Close()
		switch {
		case err == nil:
			removed++
		case classify(err, e.tmp).Kind != KindNotFound:
			continue
		}
		_ = os.Remove(e.file)
	}
	return removed
}
