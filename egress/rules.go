package egress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Rules per request: an allow-list entry may be an object,
// {"host": "api.github.com", "port": 443, "methods": ["GET"], "paths":
// ["/repos/acme/*"]}, held in the list as its canonical JSON text. It
// allows connecting to host:port as the string entry would, and then only
// requests whose method is one of methods (none: any) and whose path
// matches one of paths (none: any; a final "*" matches any rest). The
// proxy enforces it on each request it reads: plain http:// requests
// (absolute-URI ones, and transparent connections, serveRules), and HTTPS
// requests it intercepts; a tunnel it cannot read (CONNECT or TLS without
// interception) to a host:port only rule entries allow is refused.

// errRulesUnread refuses a tunnel whose requests the proxy cannot read
// to a host:port that only object entries allow.
const errRulesUnread = "only rules per request allow this host:port, and the proxy reads requests on plain http:// and on HTTPS it intercepts only (this session has no egress CA: one is made at create for a session with rules or bound secrets, on the linux driver)"

// Bounds of an object entry.
const (
	maxRuleMethods = 16
	maxRulePaths   = 32
	maxRulePath    = 512
)

// ruleJSON is an object entry as the API spells it.
type ruleJSON struct {
	Host    string   `json:"host"`
	Port    int      `json:"port,omitempty"`
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
}

func (e entry) hasRules() bool { return len(e.methods) > 0 || len(e.paths) > 0 }

// ruleString is an object entry's canonical JSON text.
func (e entry) ruleString() string {
	b, _ := json.Marshal(ruleJSON{Host: e.hostString(), Port: int(e.port), Methods: e.methods, Paths: e.paths})
	return string(b)
}

// parseRule parses an object entry.
func parseRule(raw string) (entry, error) {
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	var r ruleJSON
	if err := dec.Decode(&r); err != nil {
		return entry{}, fmt.Errorf("invalid object: %v (want host, port, methods, paths)", err)
	}
	if dec.More() {
		return entry{}, fmt.Errorf("invalid object: trailing data")
	}
	if r.Host == "" || strings.HasPrefix(r.Host, "{") {
		return entry{}, fmt.Errorf("object without a host")
	}
	if r.Port < 0 || r.Port > 65535 {
		return entry{}, fmt.Errorf("invalid port %d: want 1..65535", r.Port)
	}
	hp := r.Host
	if r.Port != 0 {
		if _, _, hasPort, err := splitEntry(r.Host); err == nil && hasPort {
			return entry{}, fmt.Errorf("the port goes in port, not in host")
		}
		h := r.Host
		if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
			h = "[" + h + "]"
		}
		hp = h + ":" + strconv.Itoa(r.Port)
	}
	e, err := parseEntry(hp, false)
	if err != nil {
		return entry{}, err
	}
	if len(r.Methods) > maxRuleMethods || len(r.Paths) > maxRulePaths {
		return entry{}, fmt.Errorf("at most %d methods and %d paths", maxRuleMethods, maxRulePaths)
	}
	for _, m := range r.Methods {
		m = strings.ToUpper(m)
		if m == "" || len(m) > 16 || strings.ContainsFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) {
			return entry{}, fmt.Errorf("invalid method %q", m)
		}
		if !slices.Contains(e.methods, m) {
			e.methods = append(e.methods, m)
		}
	}
	for _, p := range r.Paths {
		if !strings.HasPrefix(p, "/") || len(p) > maxRulePath ||
			strings.ContainsFunc(p, func(c rune) bool { return c <= ' ' || c >= 0x7f || c == '?' || c == '#' }) {
			return entry{}, fmt.Errorf("invalid path %q: want /... without query, spaces or control characters", p)
		}
		if i := strings.IndexByte(p, '*'); i >= 0 && i != len(p)-1 {
			return entry{}, fmt.Errorf("invalid path %q: \"*\" only at the end", p)
		}
		if !slices.Contains(e.paths, p) {
			e.paths = append(e.paths, p)
		}
	}
	return e, nil
}

// allowsRequest reports whether e's rules allow method on urlPath (the
// request's decoded path).
func (e entry) allowsRequest(method, urlPath string) bool {
	if len(e.methods) > 0 && !slices.Contains(e.methods, method) {
		return false
	}
	if len(e.paths) == 0 {
		return true
	}
	for _, p := range e.paths {
		if pre, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(urlPath, pre) {
				return true
			}
		} else if urlPath == p {
			return true
		}
	}
	return false
}

// cleanPath reports whether p is a request path a rule may judge: no dot
// segments and no empty ones, which a server could resolve elsewhere.
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	return c == p || c+"/" == p
}

// AllowsRequest reports whether l allows a request of method to urlPath
// (decoded) on host:port. When it does not, refusedBy is the rule that
// refused it (the first object entry for host:port), or "" when no entry
// allows host:port at all.
func (l List) AllowsRequest(host string, port uint16, method, urlPath string) (ok bool, refusedBy string) {
	h, ip, valid := normalizeHost(host)
	if !valid || port == 0 {
		return false, ""
	}
	for _, e := range l.entries {
		if !e.matchesHost(h, ip) || !portAllowed(e.port, port) {
			continue
		}
		if !e.hasRules() {
			return true, ""
		}
		if refusedBy == "" {
			refusedBy = e.String()
		}
		if cleanPath(urlPath) && e.allowsRequest(method, urlPath) {
			return true, ""
		}
	}
	return false, refusedBy
}

// OnlyRules reports whether host:port is allowed, but only by object
// entries: its requests must be read to be judged.
func (l List) OnlyRules(host string, port uint16) bool {
	h, ip, valid := normalizeHost(host)
	if !valid {
		return false
	}
	rules := false
	for _, e := range l.entries {
		if !e.matchesHost(h, ip) || !portAllowed(e.port, port) {
			continue
		}
		if !e.hasRules() {
			return false
		}
		rules = true
	}
	return rules
}

// IsObjectEntry reports whether an allow-list entry is an object's JSON
// text (an entry with rules per request).
func IsObjectEntry(raw string) bool { return strings.HasPrefix(raw, "{") }

// CompactEntry is an object entry's JSON compacted, for the list: the
// API's JSON object as the text ParseList reads.
func CompactEntry(raw []byte) (string, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}

// HostEntries returns the entries in canonical string form with their
// rules per request left out (host[:port]): what each lets a connection
// reach.
func (l List) HostEntries() []string {
	out := make([]string, len(l.entries))
	for i, e := range l.entries {
		e.methods, e.paths = nil, nil
		out[i] = e.String()
	}
	return out
}
