package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/httprate"

	"github.com/sandgate/sandgate/gateway"
)

// TokenHeader carries the cluster token on a request one node relays to
// another. It authenticates the node only: the request still carries the
// client's own bearer token, which the owner verifies as for any request,
// so a relay can do nothing the client could not.
const TokenHeader = "X-Sandgate-Cluster-Token"

// Sessions is what the front needs of the node's session manager.
type Sessions interface {
	// Known reports whether this node holds session id.
	Known(id string) bool
	// SessionsByStatus counts this node's sessions.
	SessionsByStatus() map[string]int
}

// Verifier turns a bearer token into a principal.
type Verifier interface {
	Verify(token string) (gateway.Principal, error)
}

// FrontConfig wires a Front.
type FrontConfig struct {
	Node     *Node
	Sessions Sessions
	Verifier Verifier
	// Local serves what this node answers itself (the REST API and CONNECT).
	Local http.Handler
	// WriteError writes a gateway error as the API does.
	WriteError func(http.ResponseWriter, error)
	// RateLimit is the cluster-wide requests per minute per tenant; each
	// node enforces its share, RateLimit / live nodes (0: none).
	RateLimit int
	// PeerTLS verifies peers served over https (nil: system roots).
	PeerTLS *tls.Config
	// CompatSession, when set, names the session a request of a
	// compatibility API (/compat/...) is for: by id, or by the session
	// name the API gives it (name, called once the request is
	// authenticated: it may read the body; "" or nil: none), and the
	// credential the API takes in a header of its own ("" for the bearer
	// token). Such a request is relayed to the session's owner like a
	// native session route.
	CompatSession func(r *http.Request) (id, token string, name func() string)
	// OwnerCredential, when set, reports whether a compat request that
	// names a session by id carries a credential only the session's owner
	// can check (E2B's per-sandbox access token, keyed by the owner): one
	// that no bearer token authenticates here is relayed to the owner like
	// a presigned link, and the owner answers it (401 when it is wrong).
	OwnerCredential func(r *http.Request) bool
	// PreviewSession, when set, names the session of a request on a
	// preview origin (rest.PreviewSession): relayed to its owner like a
	// presigned link.
	PreviewSession func(r *http.Request) (string, bool)
	Log            *slog.Logger
}

// Front is the node's HTTP handler: it serves what this node holds and
// relays the rest to the owner (REST through a reverse proxy, CONNECT as
// a spliced byte stream), so any node answers any request, the same way.
type Front struct {
	cfg       FrontConfig
	transport *http.Transport

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewFront returns the node's handler.
func NewFront(cfg FrontConfig) *Front {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg.PeerTLS
	tr.MaxIdleConnsPerHost = 64
	return &Front{cfg: cfg, transport: tr, conns: map[net.Conn]struct{}{}}
}

var (
	errRelayAuth = &gateway.Error{Kind: gateway.KindUnauthorized, Code: "cluster_auth_failed",
		Message: "the cluster token of a relayed request was wrong"}
	errNodeDown = &gateway.Error{Kind: gateway.KindUnavailable, Code: "node_unavailable", RetryAfter: 5 * time.Second,
		Message: "the node that holds this session cannot be reached now (it may be restarting); retry later"}
)

// sessionPath returns the session id of a session-scoped path.
func sessionPath(r *http.Request) (string, bool) {
	p := r.URL.Path
	rest, ok := strings.CutPrefix(p, "/v1/sessions/")
	if !ok {
		if r.Method != http.MethodConnect {
			return "", false
		}
		if rest, ok = strings.CutPrefix(p, "/sessions/"); !ok {
			return "", false
		}
	}
	id, _, _ := strings.Cut(rest, "/")
	return id, id != ""
}

// idPattern is what a session id looks like (gateway's newID).
var idPattern = regexp.MustCompile(`^sbx-[a-z2-7]{20}$`)

func looksLikeID(s string) bool { return idPattern.MatchString(s) }

// principal authenticates r: its bearer token, or fallback (a compat
// API's own credential header) when it has none.
func (f *Front) principal(r *http.Request, fallback string) (gateway.Principal, bool) {
	token := gateway.BearerToken(r)
	if token == "" {
		token = fallback
	}
	p, err := f.cfg.Verifier.Verify(token)
	return p, err == nil
}

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.cfg.RateLimit > 0 { // the node that serves a request counts it, relayed or not
		share := max(1, (f.cfg.RateLimit+f.cfg.Node.liveNodes()-1)/f.cfg.Node.liveNodes())
		r = r.WithContext(httprate.WithRequestLimit(r.Context(), share))
	}
	if tok := r.Header.Values(TokenHeader); len(tok) > 0 {
		if len(tok) != 1 || subtle.ConstantTimeCompare([]byte(tok[0]), []byte(f.cfg.Node.cfg.Token)) != 1 {
			f.cfg.Log.Warn("cluster_relay_refused", "remote", r.RemoteAddr, "path", r.URL.Path)
			f.cfg.WriteError(w, errRelayAuth)
			return
		}
		r.Header.Del(TokenHeader)
		f.cfg.Local.ServeHTTP(w, r)
		return
	}
	if f.cfg.PreviewSession != nil {
		// A preview origin's request, whatever its path: none of it is the API's.
		if id, ok := f.cfg.PreviewSession(r); ok {
			f.forwardLink(w, r, id)
			return
		}
	}
	if r.Method == http.MethodPost && r.URL.Path == "/v1/sessions" {
		f.create(w, r)
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/v1/audit" {
		f.audit(w, r) // audit.go
		return
	}
	if id, ok := linkSession(r.URL.Path); ok {
		f.forwardLink(w, r, id)
		return
	}
	id, token, name := f.sessionOf(r)
	if id == "" && name == nil || id != "" && f.cfg.Sessions.Known(id) {
		f.cfg.Local.ServeHTTP(w, r)
		return
	}
	p, ok := f.principal(r, token)
	if !ok && id != "" && name == nil && f.cfg.OwnerCredential != nil && f.cfg.OwnerCredential(r) {
		f.forwardLink(w, r, id) // the owner checks its own credential
		return
	}
	if !ok { // the API answers 401, counting the failure
		f.cfg.Local.ServeHTTP(w, r)
		return
	}
	if id != "" && name == nil && !looksLikeID(id) {
		// A native path may name the session instead (gateway.Manager's
		// Resolve): relay to the node of the tenant's live session of
		// that name, whose API resolves it the same way. An id always
		// wins: an id-shaped segment is never looked up as a name here.
		if nid, err := f.cfg.Node.lookupName(r.Context(), p.Tenant, id); err == nil && nid != "" {
			if f.cfg.Sessions.Known(nid) {
				f.cfg.Local.ServeHTTP(w, r)
				return
			}
			id = nid
		}
	}
	if id == "" { // named: the live session of that name, wherever it is
		n := name()
		if n == "" {
			f.cfg.Local.ServeHTTP(w, r)
			return
		}
		var err error
		if id, err = f.cfg.Node.lookupName(r.Context(), p.Tenant, n); err != nil || id == "" || f.cfg.Sessions.Known(id) {
			f.cfg.Local.ServeHTTP(w, r) // none yet (the API makes it here), or this node's
			return
		}
	}
	f.forward(w, r, p, id)
}

// sessionOf names the session r is for: by id (a native session route,
// CONNECT, or a compat route with the id in its path) or by name (a compat
// API that names its sessions itself, known once r is authenticated with
// token, the API's own credential, or its bearer token).
func (f *Front) sessionOf(r *http.Request) (id, token string, name func() string) {
	if id, ok := sessionPath(r); ok {
		return id, "", nil
	}
	if f.cfg.CompatSession != nil && strings.HasPrefix(r.URL.Path, "/compat/") {
		return f.cfg.CompatSession(r)
	}
	return "", "", nil
}

// forward serves a request for session id of principal p: locally when
// the session is unknown, another tenant's or this node's, otherwise by a
// relay to its owner.
func (f *Front) forward(w http.ResponseWriter, r *http.Request, p gateway.Principal, id string) {
	o, err := f.cfg.Node.lookupOwner(r.Context(), id)
	if err != nil {
		f.cfg.WriteError(w, unavailable(err))
		return
	}
	if o.node == "" {
		if t, found, err := f.cfg.Node.Tombstone(r.Context(), id); err == nil && found && t.Tenant == p.Tenant {
			f.cfg.WriteError(w, &gateway.GoneError{Tombstone: t})
			return
		}
	}
	if o.node == "" || o.tenant != p.Tenant || o.node == f.cfg.Node.ID() {
		f.cfg.Local.ServeHTTP(w, r) // not found, or another tenant's: the same answer
		return
	}
	target, live := f.cfg.Node.peer(o.node)
	if !live { // a node that just joined, or one that is gone
		f.cfg.Node.refresh()
		target, live = f.cfg.Node.peer(o.node)
	}
	if !live {
		f.ownerGone(w, r, id, o)
		return
	}
	f.relay(w, r, target, func(w http.ResponseWriter) bool {
		// The owner cannot be reached: if the cluster now knows it is gone,
		// answer as for a gone owner; otherwise node_unavailable.
		f.cfg.Node.refresh()
		if _, live := f.cfg.Node.peer(o.node); live {
			return false
		}
		f.ownerGone(w, r, id, o)
		return true
	})
}

// forwardLink serves a presigned link (a file's or a port's) of session
// id: the node that holds the session signed it with its own key and
// verifies it, so the link goes there. Nothing of the link is trusted
// here: an id that names no session of another live node is answered
// locally (link_gone or link_invalid, as the API says).
func (f *Front) forwardLink(w http.ResponseWriter, r *http.Request, id string) {
	if f.cfg.Sessions.Known(id) {
		f.cfg.Local.ServeHTTP(w, r)
		return
	}
	o, err := f.cfg.Node.lookupOwner(r.Context(), id)
	if err != nil {
		f.cfg.WriteError(w, unavailable(err))
		return
	}
	if o.node == "" || o.node == f.cfg.Node.ID() {
		f.cfg.Local.ServeHTTP(w, r)
		return
	}
	target, live := f.cfg.Node.peer(o.node)
	if !live {
		f.cfg.Node.refresh()
		target, live = f.cfg.Node.peer(o.node)
	}
	switch {
	case live:
		f.relay(w, r, target, nil)
	case f.cfg.Node.restarting(o.node):
		f.cfg.WriteError(w, errNodeDown)
	default:
		f.cfg.Local.ServeHTTP(w, r) // its node is lost: the link is dead
	}
}

// maxLinkToken bounds the link token the front decodes.
const maxLinkToken = 4 << 10

// linkSession returns the session a presigned link path names:
// /links/{token} (a file) or /links/ports/{token}[/...] (a port), whose
// token is base64url(payload) "." base64url(signature) and whose payload
// is a JSON object with the session id in "s" (rest/links.go,
// rest/ports.go). It is read, not verified: only the owner can verify it.
func linkSession(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, "/links/")
	if !ok {
		return "", false
	}
	if port, ok := strings.CutPrefix(rest, "ports/"); ok {
		rest, _, _ = strings.Cut(port, "/")
	} else if strings.Contains(rest, "/") {
		return "", false
	}
	enc, _, ok := strings.Cut(rest, ".")
	if !ok || enc == "" || len(rest) > maxLinkToken {
		return "", false
	}
	data, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", false
	}
	var payload struct {
		Session string `json:"s"`
	}
	if json.Unmarshal(data, &payload) != nil || !validID(payload.Session) {
		return "", false
	}
	return payload.Session, true
}

// validID reports whether id can be a session id: the front looks such
// ids up in etcd, so it takes only their alphabet.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ownerGone answers a request for session id, whose owner o is not live.
func (f *Front) ownerGone(w http.ResponseWriter, r *http.Request, id string, o owner) {
	rec, found, err := f.cfg.Node.Record(r.Context(), id)
	switch {
	case err != nil:
		f.cfg.WriteError(w, err)
	case found && isLive(rec.Status) || f.cfg.Node.restarting(o.node):
		// Not yet marked lost, or drained and coming back.
		f.cfg.WriteError(w, errNodeDown)
	case !found:
		// Deleted meanwhile (through another node): its tombstone answers.
		if t, ok, err := f.cfg.Node.Tombstone(r.Context(), id); err == nil && ok && t.Tenant == o.tenant {
			f.cfg.WriteError(w, &gateway.GoneError{Tombstone: t})
			return
		}
		f.cfg.Local.ServeHTTP(w, r)
	default:
		// The API shows the failed record and refuses the rest; a DELETE
		// goes through it like any other (rate limit, audit, tombstone):
		// the manager forgets the record of a lost node (Node.ForgetLost).
		f.cfg.Local.ServeHTTP(w, r)
	}
}

// create places a new session: on this node when it has room, otherwise
// on the least-loaded live node that has.
func (f *Front) create(w http.ResponseWriter, r *http.Request) {
	n := f.cfg.Node
	p, ok := f.principal(r, "")
	if !ok {
		f.cfg.Local.ServeHTTP(w, r) // 401
		return
	}
	// An Idempotency-Key a create on another node already used: that
	// node answers (the replay, or idempotency_key_reused).
	if keys := r.Header.Values("Idempotency-Key"); len(keys) == 1 && keys[0] != "" {
		if id, err := n.lookupIdem(r.Context(), p.Tenant, keys[0]); err == nil && id != "" && !f.cfg.Sessions.Known(id) {
			f.forward(w, r, p, id)
			return
		}
	}
	if !n.Healthy() {
		f.cfg.WriteError(w, ErrUnavailable)
		return
	}
	mine := n.info()
	if hasRoom(mine) {
		f.cfg.Local.ServeHTTP(w, r)
		return
	}
	cands := n.candidates()
	if len(cands) == 0 { // nodes that joined since the last refresh
		n.refresh()
		cands = n.candidates()
	}
	if f.placeCreate(w, r, cands) {
		return
	}
	if mine.Draining {
		f.cfg.WriteError(w, &gateway.Error{Kind: gateway.KindUnavailable, Code: "shutting_down", Message: "the node is draining and no other node has room"})
		return
	}
	f.cfg.Local.ServeHTTP(w, r) // answers capacity
}

// errFull is a placed create its node refused for want of room.
var errFull = errors.New("the node has no room")

// placeCreate relays create r to the candidates in turn until one takes
// it. A node that answers capacity (its view of itself is fresher than
// ours) or cannot be reached is skipped; once a node has the request, its
// answer is the answer. It reports false, having written nothing, when
// no candidate took it.
func (f *Front) placeCreate(w http.ResponseWriter, r *http.Request, cands []Info) bool {
	if len(cands) == 0 {
		return false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxCreateBody+1))
	r.Body = io.NopCloser(bytes.NewReader(body)) // for the local answer, if it comes to that
	if err != nil || len(body) > maxCreateBody {
		return false // the API answers it (body_too_large)
	}
	for _, t := range cands {
		u, err := url.Parse(t.URL)
		if err != nil || u.Host == "" {
			continue
		}
		skipped := false
		rp := &httputil.ReverseProxy{
			Rewrite:   f.rewrite(u, r),
			Transport: f.transport,
			ErrorLog:  slog.NewLogLogger(f.cfg.Log.Handler(), slog.LevelDebug),
			ModifyResponse: func(resp *http.Response) error {
				if resp.StatusCode != http.StatusServiceUnavailable {
					return nil
				}
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				if json.Unmarshal(b, &e) == nil && (e.Error.Code == "capacity" || e.Error.Code == "shutting_down") {
					return errFull
				}
				resp.Body = io.NopCloser(bytes.NewReader(b))
				return nil
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if notSent(err) || errors.Is(err, errFull) {
					skipped = true // nothing was created there
					return
				}
				f.cfg.Log.Warn("cluster_relay_failed", "node", t.ID, "path", r.URL.Path, "err", err)
				f.cfg.WriteError(w, errNodeDown)
			},
		}
		out := r.Clone(r.Context())
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		rp.ServeHTTP(w, out)
		if !skipped {
			f.cfg.Node.placed(t.ID)
			return true
		}
	}
	return false
}

// notSent reports whether err, a relay's failure, means the request never
// reached the peer: only a failed dial says so. Any other failure (a
// reset or a timeout once the request was written, a broken answer) may
// come after the peer acted on it.
func notSent(err error) bool {
	oe, ok := errors.AsType[*net.OpError](err)
	return ok && oe.Op == "dial"
}

// maxCreateBody bounds the body of a create the front holds to place it
// (the API's own bound).
const maxCreateBody = 64 << 10

// minMemAvail is the memory a node must have free to take a session.
const minMemAvail = 256 << 20

func hasRoom(i Info) bool {
	return !i.Draining && (i.MaxSessions <= 0 || i.Sessions < i.MaxSessions) && (i.MemAvail == 0 || i.MemAvail >= minMemAvail)
}

// candidates are the other live nodes with room, least loaded first:
// fewest sessions, then most memory available.
func (n *Node) candidates() []Info {
	peers := slices.DeleteFunc(n.peers(), func(i Info) bool { return !hasRoom(i) || i.ID == n.ID() })
	slices.SortFunc(peers, func(a, b Info) int {
		if a.Sessions != b.Sessions {
			return a.Sessions - b.Sessions
		}
		switch {
		case a.MemAvail > b.MemAvail:
			return -1
		case a.MemAvail < b.MemAvail:
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	return peers
}

// placed counts a session placed on node id in this node's view, until
// the node's own record says more.
func (n *Node) placed(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i, ok := n.nodes[id]; ok {
		i.Sessions++
		n.nodes[id] = i
	}
}

// relay sends r to node t and its answer back. When t cannot be reached
// (nothing was sent), unreachable may answer instead (it reports whether
// it did); otherwise the answer is node_unavailable.
func (f *Front) relay(w http.ResponseWriter, r *http.Request, t Info, unreachable func(http.ResponseWriter) bool) {
	u, err := url.Parse(t.URL)
	if err != nil || u.Host == "" {
		f.cfg.WriteError(w, errNodeDown)
		return
	}
	if r.Method == http.MethodConnect {
		f.relayConnect(w, r, u, unreachable)
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       f.rewrite(u, r),
		Transport:     f.transport,
		FlushInterval: -1, // command output streams
		ErrorLog:      slog.NewLogLogger(f.cfg.Log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f.cfg.Log.Warn("cluster_relay_failed", "node", t.ID, "path", r.URL.Path, "err", err)
			if notSent(err) && unreachable != nil && unreachable(w) {
				return
			}
			f.cfg.WriteError(w, errNodeDown)
		},
	}
	rp.ServeHTTP(w, r)
}

// rewrite makes a relayed request to u from r: the same path, query and
// headers (the client's token among them), with the cluster token.
func (f *Front) rewrite(u *url.URL, r *http.Request) func(*httputil.ProxyRequest) {
	return func(pr *httputil.ProxyRequest) {
		pr.SetURL(u)
		pr.Out.URL.Path, pr.Out.URL.RawPath = r.URL.Path, r.URL.RawPath
		pr.Out.Host = r.Host
		pr.SetXForwarded()
		pr.Out.Header.Set(TokenHeader, f.cfg.Node.cfg.Token)
	}
}

// relayConnect relays a CONNECT tunnel to u, the owner: it opens a
// connection, sends the CONNECT (the client's token and the cluster's),
// and on 200 splices the two connections both ways; any other answer
// goes back to the client as it came.
func (f *Front) relayConnect(w http.ResponseWriter, r *http.Request, u *url.URL, unreachable func(http.ResponseWriter) bool) {
	if !f.track(nil) {
		f.cfg.WriteError(w, &gateway.Error{Kind: gateway.KindUnavailable, Code: "shutting_down", Message: "gateway is shutting down"})
		return
	}
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	up, err := f.dial(ctx, u)
	if err != nil {
		f.cfg.Log.Warn("cluster_relay_failed", "host", u.Host, "err", err)
		if unreachable != nil && unreachable(w) {
			return
		}
		f.cfg.WriteError(w, errNodeDown)
		return
	}
	if !f.track(up) {
		up.Close()
		return
	}
	defer f.untrack(up)
	// Every way out closes it (splice closes it too: a second Close is
	// harmless), so no answer of the owner leaves a connection behind.
	defer up.Close()
	_ = up.SetDeadline(time.Now().Add(10 * time.Second))
	req := "CONNECT " + r.URL.RequestURI() + " HTTP/1.1\r\nHost: " + r.Host + "\r\n"
	for _, h := range []string{"Proxy-Authorization", "Authorization", "X-Request-Id"} {
		if v := r.Header.Get(h); v != "" {
			req += h + ": " + v + "\r\n"
		}
	}
	req += TokenHeader + ": " + f.cfg.Node.cfg.Token + "\r\n\r\n"
	if _, err := io.WriteString(up, req); err != nil {
		f.cfg.WriteError(w, errNodeDown)
		return
	}
	ubr := bufio.NewReader(up)
	resp, err := http.ReadResponse(ubr, &http.Request{Method: http.MethodConnect})
	if err != nil {
		f.cfg.WriteError(w, errNodeDown)
		return
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, 1<<20))
		return
	}
	_ = up.SetDeadline(time.Time{})
	down, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		f.cfg.WriteError(w, err)
		return
	}
	if !f.track(down) {
		down.Close()
		return
	}
	defer f.untrack(down)
	defer down.Close() // hijacked: the server no longer closes it
	_ = down.SetDeadline(time.Time{})
	if _, err := io.WriteString(down, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	// Bytes already read on either side go first.
	if n := ubr.Buffered(); n > 0 {
		b, _ := ubr.Peek(n)
		if _, err := down.Write(b); err != nil {
			return
		}
	}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
	}
	splice(up, down)
}

func (f *Front) dial(ctx context.Context, u *url.URL) (net.Conn, error) {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"https": "443"}[u.Scheme]+map[string]string{"http": "80"}[u.Scheme])
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" {
		return c, nil
	}
	cfg := &tls.Config{ServerName: u.Hostname()}
	if f.cfg.PeerTLS != nil {
		cfg = f.cfg.PeerTLS.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("tls to peer: %w", err)
	}
	return tc, nil
}

// halfCloser is a connection whose write side closes alone.
type halfCloser interface{ CloseWrite() error }

// splice copies a to b and b to a until both directions end; the end of
// one direction half-closes the other side's write.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if hc, ok := dst.(halfCloser); ok {
			_ = hc.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
}

func (f *Front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if c == nil {
		f.wg.Add(1)
	} else {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *Front) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// Shutdown closes the relayed tunnels still open and waits for them.
func (f *Front) Shutdown() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.transport.CloseIdleConnections()
}
