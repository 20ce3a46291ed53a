// Package egress is the per-session HTTP forward proxy that enforces a
// sandbox session's egress allow-list. The gateway opens a listener inside
// the sandbox's network namespace and hands it to Session.Serve; tools in
// the sandbox reach the network only through it.
//
// Three rules are enforced on every connection and request:
//
//   - policy: the destination host and port must be allowed by the
//     session's List (and the operator's Bounds, checked by the caller);
//   - address: the destination is resolved once, every candidate address is
//     checked (no loopback, private, link-local, ... unless opened by the
//     operator with AllowCIDRs), and exactly a checked address is dialed;
//   - secrets: credentials bound to destinations are injected only into
//     HTTPS requests to those destinations, intercepted with the session's
//     CA; headers carrying a placeholder are stripped from every request the
//     proxy sees in clear (tunnels to other hosts pass through untouched:
//     placeholders are not secret).
package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// entryKind is what an entry or pattern names.
type entryKind uint8

const (
	kindHost     entryKind = iota + 1 // an exact hostname
	kindWildcard                      // any subdomain of name, not name itself
	kindIP                            // an IP literal
	kindAny                           // any host (bounds only)
)

// entry is one parsed allow-list entry or bounds pattern.
type entry struct {
	kind entryKind
	name string     // hostname, or the wildcard's suffix (without "*.")
	addr netip.Addr // kindIP
	port uint16     // 0: no port given
	// methods and paths are an object entry's rules per request (rules.go):
	// none means any.
	methods []string
	paths   []string
}

// hostString is the entry's host in canonical form (IPv6 in brackets).
func (e entry) hostString() string {
	switch e.kind {
	case kindAny:
		return "*"
	case kindWildcard:
		return "*." + e.name
	case kindIP:
		if e.addr.Is6() {
			return "[" + e.addr.String() + "]"
		}
		return e.addr.String()
	default:
		return e.name
	}
}

func (e entry) String() string {
	if e.hasRules() {
		return e.ruleString()
	}
	if e.port == 0 {
		return e.hostString()
	}
	return e.hostString() + ":" + strconv.Itoa(int(e.port))
}

// matchesHost reports whether e's host part covers host, which is
// normalized (lowercase, no trailing dot) or ip (valid when host is an IP).
func (e entry) matchesHost(host string, ip netip.Addr) bool {
	switch e.kind {
	case kindAny:
		return true
	case kindIP:
		return ip.IsValid() && e.addr == ip
	case kindHost:
		return !ip.IsValid() && host == e.name
	case kindWildcard:
		return !ip.IsValid() && strings.HasSuffix(host, "."+e.name)
	}
	return false
}

// BadEntry is one entry that could not be parsed.
type BadEntry struct {
	Entry  string
	Reason string
}

// ListError names every bad entry of a list.
type ListError struct {
	Entries []BadEntry
}

func (e *ListError) Error() string {
	parts := make([]string, len(e.Entries))
	for i, b := range e.Entries {
		parts[i] = fmt.Sprintf("%q: %s", b.Entry, b.Reason)
	}
	noun := "entry"
	if len(parts) > 1 {
		noun = "entries"
	}
	return "invalid egress " + noun + " " + strings.Join(parts, "; ")
}

// List is a parsed session allow-list. The zero List allows nothing.
//
// Entries: hostname ("pypi.org"), wildcard ("*.pythonhosted.org": any
// subdomain, not the apex), IP literal ("10.0.0.5", "[2001:db8::1]"), each
// with an optional ":port". An entry without a port allows ports 80 and 443.
type List struct {
	entries []entry
}

// ParseList parses session allow-list entries. Its error is a *ListError
// naming every bad entry. Duplicates (in canonical form) are dropped.
func ParseList(entries []string) (List, error) {
	var l List
	var bad []BadEntry
	seen := make(map[string]bool)
	for _, raw := range entries {
		e, err := parseEntry(raw, false)
		if err != nil {
			bad = append(bad, BadEntry{Entry: raw, Reason: err.Error()})
			continue
		}
		if k := e.String(); !seen[k] {
			seen[k] = true
			l.entries = append(l.entries, e)
		}
	}
	if len(bad) > 0 {
		return List{}, &ListError{Entries: bad}
	}
	return l, nil
}

// Entries returns the entries in canonical form (lowercase, IPv6 in
// brackets), for display.
func (l List) Entries() []string {
	out := make([]string, len(l.entries))
	for i, e := range l.entries {
		out[i] = e.String()
	}
	return out
}

// Empty reports whether l allows nothing.
func (l List) Empty() bool { return len(l.entries) == 0 }

// Allows reports whether l allows host (a hostname or an IP literal, with or
// without brackets) on port.
func (l List) Allows(host string, port uint16) bool {
	h, ip, ok := normalizeHost(host)
	if !ok || port == 0 {
		return false
	}
	for _, e := range l.entries {
		if e.matchesHost(h, ip) && portAllowed(e.port, port) {
			return true
		}
	}
	return false
}

// portAllowed: a session entry without a port allows 80 and 443.
func portAllowed(entryPort, port uint16) bool {
	if entryPort == 0 {
		return port == 80 || port == 443
	}
	return entryPort == port
}

// Bounds is the operator's ceiling on session allow-lists.
//
// Patterns: "*" (any host), "*.suffix", hostname, IP literal, each with an
// optional ":port". A pattern without a port allows any port. The zero
// Bounds allows nothing; the gateway's default is ParseBounds([]string{"*"}).
type Bounds struct {
	patterns []entry
}

// ParseBounds parses operator patterns; its error is a *ListError naming
// every bad pattern.
func ParseBounds(patterns []string) (Bounds, error) {
	var b Bounds
	var bad []BadEntry
	for _, raw := range patterns {
		e, err := parseEntry(raw, true)
		if err != nil {
			bad = append(bad, BadEntry{Entry: raw, Reason: err.Error()})
			continue
		}
		b.patterns = append(b.patterns, e)
	}
	if len(bad) > 0 {
		return Bounds{}, &ListError{Entries: bad}
	}
	return b, nil
}

// Patterns returns the patterns in canonical form.
func (b Bounds) Patterns() []string {
	out := make([]string, len(b.patterns))
	for i, e := range b.patterns {
		out[i] = e.String()
	}
	return out
}

// Outside returns the entries of l (canonical form) that ask for more than b
// allows, nil if none. An entry is inside when every (host, port) it allows
// is allowed by some pattern.
func (b Bounds) Outside(l List) []string {
	var out []string
	for _, e := range l.entries {
		ports := []uint16{80, 443}
		if e.port != 0 {
			ports = []uint16{e.port}
		}
		inside := true
		for _, p := range ports {
			if !slices.ContainsFunc(b.patterns, func(pat entry) bool { return pat.covers(e, p) }) {
				inside = false
				break
			}
		}
		if !inside {
			out = append(out, e.String())
		}
	}
	return out
}

// covers reports whether pattern pat allows every host of session entry e
// on port.
func (pat entry) covers(e entry, port uint16) bool {
	if pat.port != 0 && pat.port != port {
		return false
	}
	switch pat.kind {
	case kindAny:
		return true
	case kindIP:
		return e.kind == kindIP && e.addr == pat.addr
	case kindHost:
		return e.kind == kindHost && e.name == pat.name
	case kindWildcard:
		switch e.kind {
		case kindHost:
			return strings.HasSuffix(e.name, "."+pat.name)
		case kindWildcard:
			return e.name == pat.name || strings.HasSuffix(e.name, "."+pat.name)
		}
	}
	return false
}

// parseEntry parses a session entry, or a bounds pattern when pattern.
func parseEntry(raw string, pattern bool) (entry, error) {
	s := raw
	if s == "" {
		return entry{}, fmt.Errorf("empty")
	}
	if strings.HasPrefix(s, "{") {
		if pattern {
			return entry{}, fmt.Errorf("an operator pattern is host[:port], not an object")
		}
		return parseRule(s)
	}
	if strings.Contains(s, "://") {
		return entry{}, fmt.Errorf("has a scheme: want a host, not a URL")
	}
	if strings.ContainsAny(s, "/?#") {
		return entry{}, fmt.Errorf("has a path: want host[:port]")
	}
	if strings.Contains(s, "@") {
		return entry{}, fmt.Errorf("has userinfo: want host[:port]")
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return entry{}, fmt.Errorf("has whitespace, control or non-ASCII characters")
	}
	host, portStr, hasPort, err := splitEntry(s)
	if err != nil {
		return entry{}, err
	}
	var e entry
	if hasPort {
		p, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || p == 0 || portStr[0] == '+' {
			return entry{}, fmt.Errorf("invalid port %q: want 1..65535", portStr)
		}
		e.port = uint16(p)
	}
	switch {
	case host == "*":
		if !pattern {
			return entry{}, fmt.Errorf(`"*" alone is not allowed in a session list: name hosts or "*.domain"`)
		}
		e.kind = kindAny
	case strings.HasPrefix(host, "*."):
		name, err := normalizeName(host[2:])
		if err != nil {
			return entry{}, fmt.Errorf("invalid wildcard: %w", err)
		}
		e.kind, e.name = kindWildcard, name
	case strings.Contains(host, "*"):
		return entry{}, fmt.Errorf(`"*" is allowed only as a whole first label ("*.example.com")`)
	default:
		if a, err := netip.ParseAddr(host); err == nil {
			if a.Zone() != "" {
				return entry{}, fmt.Errorf("IP address with a zone")
			}
			e.kind, e.addr = kindIP, a.Unmap()
			break
		}
		if strings.Contains(host, ":") {
			return entry{}, fmt.Errorf("invalid IPv6 address %q", host)
		}
		name, err := normalizeName(host)
		if err != nil {
			return entry{}, err
		}
		e.kind, e.name = kindHost, name
	}
	return e, nil
}

// splitEntry splits host[:port], "[v6]", "[v6]:port" or a bare IPv6 literal.
func splitEntry(s string) (host, port string, hasPort bool, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", false, fmt.Errorf("missing ']'")
		}
		host, rest := s[1:end], s[end+1:]
		if _, perr := netip.ParseAddr(host); perr != nil || !strings.Contains(host, ":") {
			return "", "", false, fmt.Errorf("invalid IPv6 address %q in brackets", host)
		}
		if rest == "" {
			return host, "", false, nil
		}
		if !strings.HasPrefix(rest, ":") {
			return "", "", false, fmt.Errorf("unexpected %q after ']'", rest)
		}
		return host, rest[1:], true, nil
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, "", false, nil
	case 1:
		i := strings.IndexByte(s, ':')
		return s[:i], s[i+1:], true, nil
	default: // a bare IPv6 literal: no port possible
		return s, "", false, nil
	}
}

// normalizeName lowercases a DNS name, drops one trailing dot and checks
// it: letters, digits, '-' and '.', labels of 1..63 characters not starting
// or ending with '-', at most 253 characters, last label not all digits.
func normalizeName(s string) (string, error) {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" {
		return "", fmt.Errorf("empty hostname")
	}
	if len(s) > 253 {
		return "", fmt.Errorf("hostname longer than 253 characters")
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" {
			return "", fmt.Errorf("empty label in %q", s)
		}
		if len(l) > 63 {
			return "", fmt.Errorf("label longer than 63 characters in %q", s)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("invalid character %q in %q: want letters, digits, '-' and '.'", c, s)
			}
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("label %q starts or ends with '-'", l)
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return "", fmt.Errorf("%q is neither an IP address nor a hostname (numeric last label)", s)
	}
	return s, nil
}

// normalizeHost normalizes a request's host: an IP literal (brackets
// optional, unmapped) or a valid hostname (lowercase, no trailing dot).
func normalizeHost(host string) (string, netip.Addr, bool) {
	h := host
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", netip.Addr{}, false
		}
		a = a.Unmap()
		return a.String(), a, true
	}
	name, err := normalizeName(h)
	if err != nil {
		return "", netip.Addr{}, false
	}
	return name, netip.Addr{}, true
}

// AllowsName reports whether l allows the hostname name on some port: the
// transparent egress's resolver answers such names.
func (l List) AllowsName(name string) bool {
	h, ip, ok := normalizeHost(name)
	if !ok || ip.IsValid() {
		return false
	}
	for _, e := range l.entries {
		if e.matchesHost(h, ip) {
			return true
		}
	}
	return false
}
