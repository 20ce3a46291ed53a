// Package connlimit bounds the gateway's HTTP connections that are waiting
// for a request: accepted but with no request read yet, or idle between
// keep-alive requests. Those cost a descriptor and a goroutine each and
// prove nothing, so a flood of them from anyone, with no credentials,
// could otherwise exhaust the gateway's descriptors.
//
// Past a bound, in total or for one source address, the oldest waiting
// connection (of that source, or overall) is closed to make room: a new
// client always gets its turn, and what a flood holds open is what it
// sends last. A connection stops waiting once its request has been read
// in full and reaches the handler.
package connlimit

import (
	"container/list"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/droplog"
)

// Config bounds waiting connections. Zero values get the defaults noted.
type Config struct {
	// MaxWaiting bounds waiting connections in total (default 1024).
	MaxWaiting int
	// MaxWaitingPerIP bounds them per source IP address (default 128).
	MaxWaitingPerIP int
	Log             *slog.Logger
	// WarnEvery is the least time between two warnings that a bound was
	// hit (default 10s): the first closing of a burst is logged at once,
	// the true count of the rest at the end of each window.
	WarnEvery time.Duration
}

// Limiter tracks waiting connections. Install it on an http.Server with
// Install.
type Limiter struct {
	cfg Config

	mu      sync.Mutex
	waiting *list.List            // of *entry, oldest first
	byIP    map[string]*list.List // of *entry, oldest first
	entries map[net.Conn]*entry   // by the accepted connection
	drops   *droplog.Counter
}

type entry struct {
	conn   net.Conn
	ip     string
	all    *list.Element
	fromIP *list.Element
}

type ctxKey struct{}

// New returns a Limiter for cfg.
func New(cfg Config) *Limiter {
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = 1024
	}
	if cfg.MaxWaitingPerIP <= 0 {
		cfg.MaxWaitingPerIP = 128
	}
	if cfg.WarnEvery <= 0 {
		cfg.WarnEvery = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{cfg: cfg, waiting: list.New(), byIP: map[string]*list.List{}, entries: map[net.Conn]*entry{}}
	l.drops = droplog.New(cfg.WarnEvery, l.warn)
	return l
}

// warn logs that n waiting connections were closed.
func (l *Limiter) warn(n int) {
	l.mu.Lock()
	total := l.waiting.Len()
	l.mu.Unlock()
	l.cfg.Log.Warn("connection_limit", "closed_waiting_connections", n, "waiting", total,
		"max_waiting", l.cfg.MaxWaiting, "max_waiting_per_ip", l.cfg.MaxWaitingPerIP,
		"reason", "too many connections without a request: the oldest were closed")
}

// Close reports the closings not yet logged and stops logging them.
func (l *Limiter) Close() { l.drops.Stop() }

// Install hooks l into srv (ConnState, ConnContext) and wraps its handler.
// It must be called before srv serves.
func (l *Limiter) Install(srv *http.Server) {
	srv.ConnState = l.connState
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, ctxKey{}, c)
	}
	next := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(ctxKey{}).(net.Conn); ok {
			l.done(c)
		}
		next.ServeHTTP(w, r)
	})
}

// Waiting reports how many connections wait now.
func (l *Limiter) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting.Len()
}

func (l *Limiter) connState(c net.Conn, st http.ConnState) {
	c = accepted(c)
	switch st {
	case http.StateNew, http.StateIdle:
		l.wait(c)
	case http.StateHijacked, http.StateClosed:
		l.done(c)
	}
}

// accepted is the connection as the listener returned it (what
// ConnContext sees), under a TLS layer.
func accepted(c net.Conn) net.Conn {
	if t, ok := c.(*tls.Conn); ok {
		return t.NetConn()
	}
	return c
}

// wait records c as waiting, closing the oldest waiting connections past
// the bounds.
func (l *Limiter) wait(c net.Conn) {
	ip := "?"
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip = a.IP.String()
	}
	var evict []net.Conn
	l.mu.Lock()
	if _, ok := l.entries[c]; !ok {
		fromIP := l.byIP[ip]
		if fromIP == nil {
			fromIP = list.New()
			l.byIP[ip] = fromIP
		}
		for fromIP.Len() >= l.cfg.MaxWaitingPerIP {
			evict = append(evict, l.removeLocked(fromIP.Front().Value.(*entry)))
		}
		for l.waiting.Len() >= l.cfg.MaxWaiting {
			evict = append(evict, l.removeLocked(l.waiting.Front().Value.(*entry)))
		}
		if l.byIP[ip] == nil { // emptied and dropped above
			l.byIP[ip] = fromIP
		}
		e := &entry{conn: c, ip: ip}
		e.all = l.waiting.PushBack(e)
		e.fromIP = fromIP.PushBack(e)
		l.entries[c] = e
	}
	l.mu.Unlock()
	for _, ec := range evict {
		ec.Close()
	}
	l.drops.Drop(len(evict))
}

// done records that c no longer waits.
func (l *Limiter) done(c net.Conn) {
	l.mu.Lock()
	if e, ok := l.entries[c]; ok {
		l.removeLocked(e)
	}
	l.mu.Unlock()
}

func (l *Limiter) removeLocked(e *entry) net.Conn {
	l.waiting.Remove(e.all)
	if fromIP := l.byIP[e.ip]; fromIP != nil {
		fromIP.Remove(e.fromIP)
		if fromIP.Len() == 0 {
			delete(l.byIP, e.ip)
		}
	}
	delete(l.entries, e.conn)
	return e.conn
}
