package rest

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/go-chi/httprate"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// Presigned links: POST /v1/sessions/{id}/files/link signs a URL,
// /links/{token}, that anyone holding it may GET, without a bearer token,
// until it expires or its session ends. The token is
//
//	base64url(payload) "." base64url(HMAC-SHA256(key, linkDomain 0 tenant 0 base64url(payload)))
//
// where payload is the JSON object {"v":1,"s":session,"p":path,"e":expiry
// (Unix seconds)}. The tenant is signed but not carried: it is the
// session's owner, looked up by id. A fetch reads the file through the
// same SFTP server in the sandbox as GET /files, so the link is bound to
// its path as the sandbox resolves it and never leaves the sandbox.

// Link expiry bounds, in seconds.
const (
	DefaultLinkExpiry = 3600
	MaxLinkExpiry     = 7 * 24 * 3600
)

// Default bounds on link fetches, per minute (DataPlane.LinkFetchesPerLink
// and LinkFetchesPerIP).
const (
	DefaultLinkFetchesPerLink = dataplane.DefaultLinkFetchesPerLink
	DefaultLinkFetchesPerIP   = dataplane.DefaultLinkFetchesPerIP
)

// linkLimits bound the fetches of file links: per link (its signature)
// and per client address. A nil limiter is unlimited.
type linkLimits struct {
	perLink, perIP *httprate.RateLimiter
	trusted        []netip.Prefix // proxies whose X-Forwarded-For counts
}

func newLinkLimits(d DataPlane) linkLimits {
	l := linkLimits{trusted: d.TrustedProxies}
	if d.LinkFetchesPerLink > 0 {
		l.perLink = httprate.NewRateLimiter(d.LinkFetchesPerLink, time.Minute)
	}
	if d.LinkFetchesPerIP > 0 {
		l.perIP = httprate.NewRateLimiter(d.LinkFetchesPerIP, time.Minute)
	}
	return l
}

// linkLimited answers 429 rate_limited (Retry-After set) when a fetch of
// the link signed sig, from r's address, is over a bound.
func (a *api) linkLimited(w http.ResponseWriter, r *http.Request, fail func(int, string, string), sig []byte) bool {
	if l := a.linkLimits.perIP; l != nil {
		if ip := clientIP(r, a.linkLimits.trusted); l.OnLimit(w, r, ip) {
			a.rateLimited("link_ip")
			fail(http.StatusTooManyRequests, "rate_limited",
				fmt.Sprintf("too many link fetches from this address (the limit is %d a minute)", a.dp.Bounds.LinkFetchesPerIP))
			return true
		}
	}
	if l := a.linkLimits.perLink; l != nil && l.OnLimit(w, r, string(sig)) {
		a.rateLimited("link")
		fail(http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("too many fetches of this link (the limit is %d a minute)", a.dp.Bounds.LinkFetchesPerLink))
		return true
	}
	return false
}

// clientIP is the address r came from: the connection's, or, when that
// is a trusted proxy's, the rightmost X-Forwarded-For hop that is not a
// trusted proxy's (the ones left of it are the client's to write).
func clientIP(r *http.Request, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return httprate.CanonicalizeIP(host)
	}
	isTrusted := func(ip netip.Addr) bool {
		return slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(ip.Unmap()) })
	}
	if isTrusted(ip) {
		var hops []string
		for _, v := range r.Header.Values("X-Forwarded-For") {
			hops = append(hops, strings.Split(v, ",")...)
		}
		for i := len(hops) - 1; i >= 0; i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // not an address: the last trusted hop is the client
			}
			ip = hop
			if !isTrusted(hop) {
				break
			}
		}
	}
	return httprate.CanonicalizeIP(ip.Unmap().String())
}

// linkDomain separates link signatures from any other use of the key.
const linkDomain = "sandgate-link-v1"

// LinkKeyBytes is the size of a generated link signing key.
const LinkKeyBytes = 32

// NewLinkKey returns a random link signing key.
func NewLinkKey() []byte {
	k := make([]byte, LinkKeyBytes)
	_, _ = rand.Read(k) // never fails (crypto/rand)
	return k
}

// linkPayload is what a link carries, signed.
type linkPayload struct {
	V       int    `json:"v"`
	Session string `json:"s"`
	Path    string `json:"p"`
	Expires int64  `json:"e"`
}

// tokenMAC is the signature of a link's encoded payload for tenant, in
// domain: file links (linkDomain) and port links (portLinkDomain) sign in
// their own, so neither kind opens the other.
func tokenMAC(key []byte, domain, tenant, payload string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(payload))
	return h.Sum(nil)
}

// signToken returns the token of payload for tenant, signed in domain.
func signToken(key []byte, domain, tenant string, payload any) string {
	data, _ := json.Marshal(payload)
	enc := base64.RawURLEncoding.EncodeToString(data)
	return enc + "." + base64.RawURLEncoding.EncodeToString(tokenMAC(key, domain, tenant, enc))
}

// parseToken decodes a token without verifying it: the payload's encoded
// form, the payload (which valid accepts) and the signature.
func parseToken[P any](token string, valid func(P) bool) (string, P, []byte, bool) {
	var zero P
	enc, sigEnc, ok := strings.Cut(token, ".")
	if !ok || enc == "" || sigEnc == "" {
		return "", zero, nil, false
	}
	data, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", zero, nil, false
	}
	sig, err := base64.RawURLEncoding.DecodeString(sigEnc)
	if err != nil || len(sig) != sha256.Size {
		return "", zero, nil, false
	}
	var lp P
	if err := json.Unmarshal(data, &lp); err != nil || !valid(lp) {
		return "", zero, nil, false
	}
	return enc, lp, sig, true
}

// signLink returns the token of a link to path of tenant's session until
// expires.
func signLink(key []byte, tenant, session, path string, expires time.Time) string {
	return signToken(key, linkDomain, tenant, linkPayload{V: 1, Session: session, Path: path, Expires: expires.Unix()})
}

// parseLink decodes a file link's token without verifying it.
func parseLink(token string) (string, linkPayload, []byte, bool) {
	return parseToken(token, func(lp linkPayload) bool { return lp.V == 1 && lp.Session != "" && lp.Path != "" })
}

// linkRequest is the body of POST /v1/sessions/{id}/files/link.
type linkRequest struct {
	Path      *string `json:"path"`
	ExpiresIn *int    `json:"expiresIn"`
}

type linkJSON struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// linkExpiresIn reads a link request's expiresIn (default
// DefaultLinkExpiry), answering invalid_expires_in out of bounds; ok is
// false once it answered.
func linkExpiresIn(w http.ResponseWriter, in *int) (seconds int, ok bool) {
	if in == nil {
		return DefaultLinkExpiry, true
	}
	if *in < 1 || *in > MaxLinkExpiry {
		WriteError(w, http.StatusBadRequest, "invalid_expires_in",
			fmt.Sprintf("expiresIn must be between 1 and %d seconds (7 days), got %d", MaxLinkExpiry, *in))
		return 0, false
	}
	return *in, true
}

// linkExpiry is when a link made now for seconds expires, to the second.
func linkExpiry(seconds int) time.Time {
	return time.Now().Add(time.Duration(seconds) * time.Second).Truncate(time.Second).UTC()
}

// linkedSession is the session a link is being made for (dataSession),
// or links_unavailable on a gateway whose sessions cannot say their
// owner, which a link's check needs; ok is false once it answered.
func (a *api) linkedSession(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	if _, ok := a.cfg.Sessions.(SessionOwners); !ok {
		WriteError(w, http.StatusServiceUnavailable, "links_unavailable", "this gateway cannot serve presigned links")
		return nil, false
	}
	return a.dataSession(w, r)
}

// createLink serves POST /v1/sessions/{id}/files/link: a presigned URL
// for the regular file at path.
func (a *api) createLink(w http.ResponseWriter, r *http.Request) {
	var req linkRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	expiresIn, ok := linkExpiresIn(w, req.ExpiresIn)
	if !ok {
		return
	}
	raw := ""
	if req.Path != nil {
		raw = *req.Path
	}
	p, err := dataplane.CheckPath(raw)
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	s, ok := a.linkedSession(w, r)
	if !ok {
		return
	}
	fsys, ok := a.openFS(w, r, s)
	if !ok {
		return
	}
	e, err := fsys.Stat(p)
	fsys.Close()
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	if e.Type != "file" {
		code, what := "not_a_regular_file", "not a regular file"
		if e.Type == "dir" {
			code, what = "is_a_directory", "a directory"
		}
		WriteError(w, http.StatusConflict, code, fmt.Sprintf("%s is %s; links are to regular files", p, what))
		return
	}
	expires := linkExpiry(expiresIn)
	token := signLink(a.cfg.LinkKey, s.Tenant, s.ID, p, expires)
	a.cfg.Log.InfoContext(r.Context(), "link_created", "session", s.ID, "tenant", s.Tenant, "path", p, "expires_at", expires)
	_ = WriteJSON(w, http.StatusOK, linkJSON{URL: a.baseURL(r) + "/links/" + token, ExpiresAt: expires})
}

// fetchLink serves GET /links/{token}, without authentication: the file
// the link names, if the link verifies, has not expired and its session
// still runs. Every fetch is logged (never the signature).
func (a *api) fetchLink(w http.ResponseWriter, r *http.Request) {
	ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
	var lp linkPayload
	code := ""
	defer func() {
		status := ww.Status()
		if status == 0 {
			status = http.StatusOK
		}
		args := []any{"session", lp.Session, "path", lp.Path, "remote", r.RemoteAddr, "status", status, "bytes", ww.BytesWritten()}
		if code != "" {
			args = append(args, "code", code)
		}
		a.cfg.Log.InfoContext(r.Context(), "link_fetch", args...)
	}()
	fail := func(status int, c, msg string) {
		code = c
		WriteError(ww, status, c, msg)
	}
	// A link's file runs nowhere: whatever it holds, no browser renders it
	// as a page of the API's origin, sniffs it into a script, or installs
	// it as a service worker.
	sandboxed(ww)
	if refuseServiceWorker(ww, r) {
		code = "service_worker_refused"
		return
	}
	enc, lp, sig, ok := parseLink(chi.URLParam(r, "token"))
	if !ok {
		a.badLink(ww, r, fail)
		return
	}
	tenant, s, ok := a.linkSession(ww, r, fail, lp.Session, lp.Expires, func(tenant string) bool {
		return hmac.Equal(sig, tokenMAC(a.cfg.LinkKey, linkDomain, tenant, enc))
	}, func(err error) {
		code = "internal"
		WriteGatewayError(ww, err)
	})
	if !ok {
		return
	}
	p, err := dataplane.CheckPath(lp.Path)
	if err != nil {
		a.badLink(ww, r, fail)
		return
	}
	// The link is the credential: the call is the session tenant's.
	if c := callOf(r.Context()); c != nil {
		c.tenant, c.auth, c.session = tenant, "link", s.ID
	}
	if a.linkLimited(ww, r, fail, sig) {
		return
	}
	auditFile(r, "read", p, -1)
	fsys, ok := a.openLinkStream(ww, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	ww.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	a.serveFile(ww, r, fsys, p)
}

// sandboxed marks an answer whose body is a sandbox's file: never sniffed
// into another type, and, if a browser shows it at all, in a sandbox of
// its own origin with no script.
func sandboxed(w http.ResponseWriter) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "sandbox")
}

// badLink answers a link that does not verify: 403 link_invalid, or 429
// past the failed-authentication limit per address (a link is a
// credential: guessing is bounded like guessing tokens).
// linkSession checks a presigned link of session, signed as verify says,
// expiring at expires (Unix seconds), and returns its tenant and live
// session. When it returns false it has answered: through fail, badLink,
// or internal for an error of the session store.
func (a *api) linkSession(w http.ResponseWriter, r *http.Request, fail func(int, string, string), session string, expires int64,
	verify func(tenant string) bool, internal func(error)) (string, *gateway.Session, bool) {
	owners, ok := a.cfg.Sessions.(SessionOwners)
	if !ok {
		fail(http.StatusServiceUnavailable, "links_unavailable", "this gateway cannot serve presigned links")
		return "", nil, false
	}
	tenant, known := owners.Owner(session)
	if !known {
		fail(http.StatusGone, "link_gone", "the link's session is gone (deleted or expired), so the link is dead")
		return "", nil, false
	}
	if !verify(tenant) {
		a.badLink(w, r, fail)
		return "", nil, false
	}
	if exp := time.Unix(expires, 0).UTC(); !time.Now().Before(exp) {
		fail(http.StatusForbidden, "link_expired", "the link expired at "+exp.Format(time.RFC3339)+"; ask for a new one")
		return "", nil, false
	}
	s, err := a.cfg.Sessions.Get(r.Context(), gateway.Principal{Tenant: tenant}, session)
	if errors.Is(err, gateway.ErrNotFound) || (err == nil && !s.Live()) {
		fail(http.StatusGone, "link_gone", "the link's session is gone (deleted, expired or failed), so the link is dead")
		return "", nil, false
	}
	if err != nil {
		internal(err)
		return "", nil, false
	}
	return tenant, s, true
}

func (a *api) badLink(w http.ResponseWriter, r *http.Request, fail func(int, string, string)) {
	if a.authFailures != nil {
		if ip, err := httprate.KeyByIP(r); err == nil && a.authFailures.OnLimit(w, r, ip) {
			a.rateLimited("auth_failures")
			fail(http.StatusTooManyRequests, "rate_limited", "too many invalid links from this address")
			return
		}
	}
	fail(http.StatusForbidden, "link_invalid", "the link is invalid: its signature does not match (tampered with, or signed by another key)")
}
