package dataplane

import (
	"context"
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
	idle    *time.Timer
	gone    bool   // removed from the pool (dead, or the session ended)
	remove  func() // unregisters from the session's end
}

// Open returns an FS on the session id's shared server (s, of tenant),
// starting the server if there is none; ctx is for the start. stream
// counts it as a transfer, refused with KindBusy past a bound. Close the
// FS when done.
func (p *Files) Open(ctx context.Context, id, tenant string, s Session, stream bool) (*FS, error) {
	p.mu.Lock()
	if stream {
		if err := p.admitLocked(id, tenant); err != nil {
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
		p.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			p.put(id, e, stream)
			p.unadmit(tenant, stream)
			return nil, fileErr(KindUnavailable, ctx.Err(), "cannot start the sandbox's file server")
		}
		if e.err != nil {
			p.put(id, e, stream)
			p.unadmit(tenant, stream)
			return nil, e.err
		}
		if !e.srv.dead() {
			var once sync.Once
			return &FS{c: e.srv.c, streams: p.open, release: func() error {
				once.Do(func() {
					p.put(id, e, stream)
					p.unadmit(tenant, stream)
				})
				return nil
			}}, nil
		}
		// It died since: drop it and start another, once.
		p.put(id, e, stream)
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

// admitLocked counts a new stream of session id, of tenant, or refuses it.
func (p *Files) admitLocked(id, tenant string) error {
	perSession := orDefault(p.MaxStreamsPerSession, DefaultMaxStreamsPerSession)
	perTenant := orDefault(p.MaxStreamsPerTenant, DefaultMaxStreamsPerTenant)
	total := orDefault(p.MaxStreams, DefaultMaxStreams)
	n := 0
	if e := p.servers[id]; e != nil {
		n = e.streams
	}
	switch {
	case n >= perSession:
		return fileErr(KindBusy, nil, "the session already has %d file transfers open (the limit per session); retry when one ends", perSession)
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
func (p *Files) startLocked(ctx context.Context, id string, s Session) *pooled {
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
			if !ok {
				go srv.close()
				srv, err = nil, fileErr(KindUnavailable, nil, "the session has ended")
			}
		}
		p.mu.Lock()
		e.srv, e.err, e.remove = srv, err, remove
		close(e.ready)
		if err != nil {
			// Not kept: the next Open tries again.
			if p.servers[id] == e {
				delete(p.servers, id)
			}
			e.gone = true
		}
		p.mu.Unlock()
	}()
	return e
}

// put hands back one FS of entry e.
func (p *Files) put(id string, e *pooled, stream bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e.refs--
	if stream {
		e.streams--
	}
	if e.refs > 0 || e.srv == nil {
		return
	}
	if e.gone || e.srv.dead() {
		p.dropLocked(id, e)
		return
	}
	e.idle = time.AfterFunc(orDuration(p.Idle, DefaultFilesIdle), func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if e.refs == 0 && e.idle != nil {
			p.dropLocked(id, e)
		}
	})
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

// Servers is how many sessions have a server in the pool (for tests).
func (p *Files) Servers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.servers)
}
