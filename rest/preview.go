package rest

import (
	"crypto/hmac"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Preview origins. A page that a sandbox serves must never run on the
// API's origin, nor on another session's: a service worker it registers,
// its storage and its cookies are the origin's, so a page on a shared
// origin could read what every later page there loads (another tenant's
// presigned file, say). Origin is scheme, host and port, so previews tell
// sessions apart by host name: a presigned preview URL is
//
//	http://p{port}-{session}-{expiry}{signature}.{domain}:{port of the API}/
//
// one DNS label (lowercase base32: host names are case-insensitive) under
// Config.PreviewDomain ("localhost" unless the operator sets
// --preview-domain). Browsers and curl resolve every *.localhost name to
// the loopback without any DNS set-up, and the label reaches the same
// listener as the API, so a preview needs no port of its own: two
// gateways on one host never collide, and no origin is ever reused (the
// label holds the session id, which is never reused, and the link's
// expiry). The label is the credential, as a file link's token is: it is
// signed like one (links.go), never reaches the sandbox, and expires.
//
// What a preview's server sends is filtered whatever its origin (ports.go):
// no Service-Worker-Allowed, no request for a service worker's script, no
// redirect off the preview's origin, cookies only host-only on the
// preview's own origin and none on the API's, where the bearer-
// authenticated route serves with Content-Security-Policy: sandbox.

// DefaultPreviewDomain is the domain of preview origins when the operator
// names none: *.localhost is the loopback in browsers and curl.
const DefaultPreviewDomain = "localhost"

// previewOriginDomain separates preview origins' signatures from links'.
const previewOriginDomain = "sandgate-preview-origin-v1"

// Sizes in a preview label: the session id's random part, the expiry's
// encoding (5 bytes: Unix seconds) and the signature's (16 bytes).
const (
	previewIDChars  = 20
	previewExpChars = 8
	previewMACBytes = 16
	previewMACChars = 26
)

// previewEncoding is the session ids' alphabet (gateway/credentials.go):
// lowercase, valid in a host name.
var previewEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// previewLabel is a preview origin's first DNS label, parsed.
type previewLabel struct {
	port    int
	session string
	expires int64
	signed  string // what the signature covers: the label without it
	mac     []byte
}

// previewPayload is what a preview label's signature covers.
func previewPayload(port int, session string, expires int64) (string, bool) {
	core, ok := strings.CutPrefix(session, "sbx-")
	if !ok || len(core) != previewIDChars || strings.Trim(core, "abcdefghijklmnopqrstuvwxyz234567") != "" {
		return "", false
	}
	var e [8]byte
	binary.BigEndian.PutUint64(e[:], uint64(expires))
	return "p" + strconv.Itoa(port) + "-" + core + "-" + previewEncoding.EncodeToString(e[3:]), true
}

// signPreviewLabel returns the label of tenant's session's port until
// expires, or false for a session id that cannot be put in a host name.
func signPreviewLabel(key []byte, tenant, session string, port int, expires time.Time) (string, bool) {
	payload, ok := previewPayload(port, session, expires.Unix())
	if !ok {
		return "", false
	}
	mac := tokenMAC(key, previewOriginDomain, tenant, payload)[:previewMACBytes]
	return payload + previewEncoding.EncodeToString(mac), true
}

// parsePreviewLabel decodes a label without verifying it.
func parsePreviewLabel(label string) (previewLabel, bool) {
	var l previewLabel
	rest, ok := strings.CutPrefix(label, "p")
	if !ok {
		return l, false
	}
	portS, rest, ok := strings.Cut(rest, "-")
	if !ok {
		return l, false
	}
	port, ok := parsePort(portS)
	if !ok || strconv.Itoa(port) != portS {
		return l, false
	}
	core, tail, ok := strings.Cut(rest, "-")
	if !ok || len(core) != previewIDChars || len(tail) != previewExpChars+previewMACChars {
		return l, false
	}
	exp, err := previewEncoding.DecodeString(tail[:previewExpChars])
	if err != nil || len(exp) != 5 {
		return l, false
	}
	mac, err := previewEncoding.DecodeString(tail[previewExpChars:])
	if err != nil || len(mac) != previewMACBytes {
		return l, false
	}
	var e [8]byte
	copy(e[3:], exp)
	l = previewLabel{port: port, session: "sbx-" + core, expires: int64(binary.BigEndian.Uint64(e[:])), mac: mac}
	l.signed, ok = previewPayload(l.port, l.session, l.expires)
	// Re-encoded, the label must be what was sent: one spelling each.
	if !ok || l.signed+previewEncoding.EncodeToString(mac) != label {
		return previewLabel{}, false
	}
	return l, true
}

// verify reports whether l was signed for tenant with key.
func (l previewLabel) verify(key []byte, tenant string) bool {
	return hmac.Equal(l.mac, tokenMAC(key, previewOriginDomain, tenant, l.signed)[:previewMACBytes])
}

// previewDomain is the domain preview origins are under, lowercase as
// previewHost reads a Host header.
func (a *api) previewDomain() string {
	if a.cfg.PreviewDomain == "" {
		return DefaultPreviewDomain
	}
	return strings.ToLower(a.cfg.PreviewDomain)
}

// previewHost returns the first label of host (a Host header) when host
// is a preview origin's name: one label, starting with "p" and a digit,
// under the preview domain. Anything else is the API's.
func (a *api) previewHost(host string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+a.previewDomain())
	if !ok || len(label) < 2 || label[0] != 'p' || label[1] < '0' || label[1] > '9' || strings.Contains(label, ".") {
		return "", false
	}
	return label, true
}

// isPreviewHost reports whether host names a preview origin.
func (a *api) isPreviewHost(host string) bool {
	_, ok := a.previewHost(host)
	return ok
}

// baseURL is the base of the URLs the gateway hands out (Links.BaseURL).
func (a *api) baseURL(r *http.Request) string {
	return Links{PublicURL: a.cfg.PublicURL}.BaseURL(r)
}

// previewURL is the presigned URL of tenant's session's port until expires:
// the base URL's scheme and port, the preview label under the preview
// domain, and the path "/".
func (a *api) previewURL(r *http.Request, tenant, session string, port int, expires time.Time) (string, error) {
	label, ok := signPreviewLabel(a.cfg.LinkKey, tenant, session, port, expires)
	if !ok {
		return "", fmt.Errorf("session id %q cannot name a preview origin", session)
	}
	base, err := url.Parse(a.baseURL(r))
	if err != nil {
		return "", fmt.Errorf("public URL: %w", err)
	}
	host := label + "." + a.previewDomain()
	if p := base.Port(); p != "" {
		host = net.JoinHostPort(host, p)
	}
	return (&url.URL{Scheme: base.Scheme, Host: host, Path: "/"}).String(), nil
}

// CheckPublicURL reports what is wrong with u as serve --public-url: an
// http or https URL with a host, and nothing but a path after it.
func CheckPublicURL(u string) error {
	p, err := url.Parse(u)
	switch {
	case err != nil:
		return err
	case p.Scheme != "http" && p.Scheme != "https":
		return fmt.Errorf("%q: want an http:// or https:// URL", u)
	case p.Host == "" || p.Hostname() == "":
		return fmt.Errorf("%q: no host", u)
	case p.User != nil || p.RawQuery != "" || p.Fragment != "" || p.Opaque != "":
		return fmt.Errorf("%q: want scheme://host[:port][/path], without user, query or fragment", u)
	}
	return nil
}

// CheckPreviewDomain reports what is wrong with d as serve
// --preview-domain: a host name (previews are one label under it).
func CheckPreviewDomain(d string) error {
	if d == "" || len(d) > 190 || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".") || net.ParseIP(d) != nil {
		return fmt.Errorf("%q: want a DNS name such as preview.example.com", d)
	}
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 || strings.Trim(strings.ToLower(l), "abcdefghijklmnopqrstuvwxyz0123456789-") != "" ||
			l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q: want a DNS name such as preview.example.com", d)
		}
	}
	return nil
}

// PreviewSession returns what names the session of a request on a preview
// origin under domain ("": DefaultPreviewDomain), for the cluster's front,
// which relays it to the session's node. It reads the label, not its
// signature: only the owner can verify it.
func PreviewSession(domain string) func(r *http.Request) (string, bool) {
	a := &api{cfg: Config{PreviewDomain: domain}}
	return func(r *http.Request) (string, bool) {
		label, ok := a.previewHost(r.Host)
		if !ok {
			return "", false
		}
		l, ok := parsePreviewLabel(label)
		return l.session, ok
	}
}
