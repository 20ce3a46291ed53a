package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/sandbox"
)

// EgressConfig is how the gateway lets sessions out: the proxy that
// enforces each session's allow-list, and the operator's ceiling on what
// a session may ask for (serve --egress-allow).
type EgressConfig struct {
	Proxy  *egress.Proxy
	Bounds egress.Bounds
	// TripwireStop stops a session whose request carried a bound secret's
	// placeholder to a host the secret is not bound to (serve
	// --tripwire-action stop); the request is refused either way.
	TripwireStop bool
}

// Bounds of the egress and secrets fields.
const (
	MaxEgressEntries = 256
	MaxSecrets       = 64
	// DefaultSecretHeader and DefaultSecretFormat are what a secret bound
	// to hosts sets when it names no header or format.
	DefaultSecretHeader = "Authorization"
	DefaultSecretFormat = "Bearer {value}"
)

// SecretRef is a secret a session asked for, by name. Without Hosts it is
// injected into every process of the session as the environment variable
// Name. With Hosts it never enters the sandbox: $Name holds a placeholder,
// and the egress proxy sets Header to Format (with {value} replaced) on
// HTTPS requests to those hosts only. Its JSON is the name alone for the
// first kind, an object for the second, as the create request gives them.
type SecretRef struct {
	Name   string   `json:"name"`
	Hosts  []string `json:"hosts,omitempty"`
	Header string   `json:"header,omitempty"`
	Format string   `json:"format,omitempty"`
}

// Bound reports whether the secret is bound to hosts.
func (r SecretRef) Bound() bool { return len(r.Hosts) > 0 }

// MarshalJSON renders an environment secret as its name.
func (r SecretRef) MarshalJSON() ([]byte, error) {
	if !r.Bound() {
		return json.Marshal(r.Name)
	}
	type plain SecretRef
	return json.Marshal(plain(r))
}

// UnmarshalJSON accepts a name or an object with no unknown fields.
func (r *SecretRef) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		*r = SecretRef{}
		return json.Unmarshal(b, &r.Name)
	}
	type plain SecretRef
	var p plain
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		return err
	}
	*r = SecretRef(p)
	return nil
}

// EgressView is a session's egress as the API shows it: the allow-list in
// force and the bytes its connections carried each way.
type EgressView struct {
	Allow    EgressEntries `json:"allow"`
	BytesIn  int64         `json:"bytesIn"`
	BytesOut int64         `json:"bytesOut"`
	// Mode is "ask" for a session that parks connections outside Allow
	// for approval (approvals.go); absent: "deny".
	Mode string `json:"mode,omitempty"`
	// Deny is what approvals denied for good (remember), in ask mode.
	Deny []string `json:"deny,omitempty"`
}

// EgressEntries is an egress allow-list as the API spells it: each entry a
// string ("host[:port]") or an object with rules per request ({"host",
// "port", "methods", "paths"}), which the list holds as its compact JSON
// text (egress.IsObjectEntry) and shows as the object again.
type EgressEntries []string

// UnmarshalJSON reads strings and objects.
func (e *EgressEntries) UnmarshalJSON(b []byte) error {
	var raws []json.RawMessage
	if err := json.Unmarshal(b, &raws); err != nil {
		return err
	}
	if raws == nil {
		*e = nil
		return nil
	}
	out := make(EgressEntries, 0, len(raws))
	for _, r := range raws {
		r = bytes.TrimSpace(r)
		switch {
		case len(r) > 0 && r[0] == '"':
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				return err
			}
			out = append(out, s)
		case len(r) > 0 && r[0] == '{':
			s, err := egress.CompactEntry(r)
			if err != nil {
				return err
			}
			out = append(out, s)
		default:
			return fmt.Errorf("an egress entry is a string or an object, not %.20s", r)
		}
	}
	*e = out
	return nil
}

// MarshalJSON writes object entries as objects.
func (e EgressEntries) MarshalJSON() ([]byte, error) {
	if e == nil {
		return []byte("[]"), nil
	}
	out := make([]json.RawMessage, len(e))
	for i, s := range e {
		if egress.IsObjectEntry(s) && json.Valid([]byte(s)) {
			out[i] = json.RawMessage(s)
			continue
		}
		b, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return json.Marshal(out)
}

// checkEgress parses a requested allow-list and holds it to the
// operator's bounds.
func (m *Manager) checkEgress(entries []string) (egress.List, error) {
	if len(entries) > MaxEgressEntries {
		return egress.List{}, Invalid("invalid_egress", fmt.Sprintf("egress has %d entries; at most %d", len(entries), MaxEgressEntries))
	}
	list, err := egress.ParseList(entries)
	if err != nil {
		if le, ok := errors.AsType[*egress.ListError](err); ok {
			return egress.List{}, Invalid("invalid_egress", le.Error())
		}
		return egress.List{}, Invalid("invalid_egress", err.Error())
	}
	if list.Empty() {
		return list, nil
	}
	if m.cfg.Egress == nil {
		return egress.List{}, Invalid("egress_unavailable", "this gateway has no egress proxy: sessions have no network")
	}
	if out := m.cfg.Egress.Bounds.Outside(list); len(out) > 0 {
		return egress.List{}, Invalid("egress_not_allowed", fmt.Sprintf(
			"egress entries outside what this gateway allows (serve --egress-allow): %s", quoteAll(out)))
	}
	return list, nil
}

// checkSecrets checks a create's secrets for tenant: valid, distinct,
// defined for the tenant (unknown_secret names every one that is not),
// and, for secrets bound to hosts, with hosts the allow-list covers.
func (m *Manager) checkSecrets(src SecretSource, tenant string, refs []SecretRef, allow egress.List) ([]SecretRef, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	if len(refs) > MaxSecrets {
		return nil, Invalid("invalid_secret", fmt.Sprintf("secrets has %d entries; at most %d", len(refs), MaxSecrets))
	}
	out := make([]SecretRef, 0, len(refs))
	seen := map[string]bool{}
	var unknown []string
	for _, r := range refs {
		if !validEnvName(r.Name) {
			return nil, Invalid("invalid_secret", fmt.Sprintf("secret name %q is not a valid environment variable name", r.Name))
		}
		if seen[r.Name] {
			return nil, Invalid("invalid_secret", fmt.Sprintf("secret %s is listed twice", r.Name))
		}
		seen[r.Name] = true
		if src == nil {
			unknown = append(unknown, r.Name)
			continue
		}
		if _, ok := src.Lookup(tenant, r.Name); !ok {
			unknown = append(unknown, r.Name)
			continue
		}
		pins, pinned := secretPins(src, tenant, r.Name)
		if !r.Bound() {
			if r.Header != "" || r.Format != "" {
				return nil, Invalid("invalid_secret", fmt.Sprintf("secret %s has a header or format but no hosts", r.Name))
			}
			if pinned {
				return nil, Invalid("secret_pinned", fmt.Sprintf("secret %s is pinned by the operator to %s: bind it to those hosts (hosts in the secret's object), it cannot be an environment variable",
					r.Name, quoteAll(pins.Patterns())))
			}
			out = append(out, SecretRef{Name: r.Name})
			continue
		}
		_, isKey := secretKey(src, tenant, r.Name)
		if isKey && (r.Header != "" || r.Format != "") {
			return nil, Invalid("invalid_secret", fmt.Sprintf("secret %s is an ssh-key (offered by the session's SSH agent): it has no header or format", r.Name))
		}
		b, err := m.checkBinding(r, allow)
		if err != nil {
			return nil, err
		}
		if isKey {
			b.Header, b.Format = "", ""
		}
		if pinned {
			hosts, _ := egress.ParseList(b.Hosts)
			if outside := pins.Outside(hosts); len(outside) > 0 {
				return nil, Invalid("secret_pinned", fmt.Sprintf("secret %s is pinned by the operator to %s; these hosts are outside them: %s",
					r.Name, quoteAll(pins.Patterns()), quoteAll(outside)))
			}
		}
		out = append(out, b)
	}
	if len(unknown) > 0 {
		return nil, Invalid("unknown_secret", "unknown secrets: "+strings.Join(unknown, ", "))
	}
	return out, nil
}

// checkBinding checks a secret bound to hosts and fills its defaults.
func (m *Manager) checkBinding(r SecretRef, allow egress.List) (SecretRef, error) {
	if r.Header == "" {
		r.Header = DefaultSecretHeader
	}
	if r.Format == "" {
		r.Format = DefaultSecretFormat
	}
	if !validHeaderName(r.Header) || hopHeader(r.Header) {
		return r, Invalid("invalid_secret", fmt.Sprintf("secret %s: %q cannot be set as a request header", r.Name, r.Header))
	}
	r.Header = textproto.CanonicalMIMEHeaderKey(r.Header)
	if !strings.Contains(r.Format, "{value}") || strings.ContainsAny(r.Format, "\r\n\x00") || len(r.Format) > 256 {
		return r, Invalid("invalid_secret", fmt.Sprintf("secret %s: format must contain {value} on one line", r.Name))
	}
	hosts, err := m.checkEgress(r.Hosts)
	if err != nil {
		e, _ := AsError(err)
		return r, Invalid(e.Code, fmt.Sprintf("secret %s hosts: %s", r.Name, e.Message))
	}
	if out := coverage(allow).Outside(hosts); len(out) > 0 {
		return r, Invalid("egress_not_allowed", fmt.Sprintf("secret %s is bound to hosts not in the session's egress list: %s", r.Name, quoteAll(out)))
	}
	r.Hosts = hosts.Entries()
	return r, nil
}

// coverage turns a session's allow-list into bounds with explicit ports
// (an entry with no port allows 80 and 443), to ask whether another list
// stays within it.
func coverage(l egress.List) egress.Bounds {
	var pats []string
	for _, e := range l.HostEntries() {
		if hasPort(e) {
			pats = append(pats, e)
			continue
		}
		pats = append(pats, e+":80", e+":443")
	}
	b, _ := egress.ParseBounds(pats)
	return b
}

// hasPort reports whether a canonical entry ends with :port.
func hasPort(e string) bool {
	i := strings.LastIndexByte(e, ':')
	if i < 0 || strings.HasSuffix(e, "]") {
		return false
	}
	if strings.Count(e, ":") > 1 && !strings.HasPrefix(e, "[") { // a bare IPv6 literal
		return false
	}
	_, err := strconv.ParseUint(e[i+1:], 10, 16)
	return err == nil
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}

func validHeaderName(h string) bool {
	if h == "" || len(h) > 64 {
		return false
	}
	for _, c := range h {
		if !(c == '-' || c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

// hopHeader reports headers a secret may not set: hop-by-hop ones and
// those that frame the request.
func hopHeader(h string) bool {
	return slices.Contains([]string{"Connection", "Content-Length", "Host", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"},
		textproto.CanonicalMIMEHeaderKey(h))
}

// caEnv are the variables that point tools at a trust store.
var caEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PIP_CERT"}

// policy is the egress policy of s as it stands.
func (m *Manager) policy(s *Session) egress.Policy {
	allow, _ := egress.ParseList(s.EgressAllow())
	pol := egress.Policy{Allow: allow}
	if mode, deny := s.askState(); mode == EgressModeAsk && m.cfg.Egress != nil {
		pol.Ask, pol.AskWithin = true, m.cfg.Egress.Bounds
		pol.Deny, _ = egress.ParseList(deny)
	}
	src := m.secretSource(s.secretScope)
	for _, r := range s.Secrets {
		if !r.Bound() {
			continue
		}
		tenant, name := s.Tenant, r.Name
		if src != nil {
			if _, isKey := secretKey(src, tenant, name); isKey {
				continue // the SSH agent's, never a header
			}
		}
		hosts, _ := egress.ParseList(r.Hosts)
		pol.Secrets = append(pol.Secrets, egress.Secret{
			Name: r.Name, Hosts: hosts, Header: r.Header, Format: r.Format, Placeholder: egress.Placeholder(r.Name),
			Value: func() (string, bool) {
				if src == nil {
					return "", false
				}
				// Pins set by a reload since the session was created
				// hold too.
				if pins, pinned := secretPins(src, tenant, name); pinned && len(pins.Outside(hosts)) > 0 {
					return "", false
				}
				if _, isKey := secretKey(src, tenant, name); isKey {
					return "", false // made an ssh-key by a reload since
				}
				return src.Lookup(tenant, name)
			},
		})
	}
	return pol
}

// openProxy starts s's egress proxy on a listener its sandbox reaches.
func (m *Manager) openProxy(ctx context.Context, s *Session) error {
	if m.cfg.Egress == nil {
		return Invalid("egress_unavailable", "this gateway has no egress proxy: sessions have no network")
	}
	pl, ok := s.sandbox.(sandbox.ProxyListener)
	if !ok {
		return Invalid("egress_unsupported", "this sandbox driver cannot give sessions an egress proxy")
	}
	ln, addr, err := pl.ListenProxy(ctx)
	if err != nil {
		return &Error{Kind: KindUnavailable, Code: "egress_failed", Message: "could not start the session's egress proxy", Err: err}
	}
	ps := m.cfg.Egress.Proxy.NewSession(s.Tenant, s.ID, m.policy(s), s.egressCA)
	ps.OnRecord(func(r egress.Record) {
		s.noteEgress(r)
		m.auditEgress(s, r)
		if r.Tripwire != "" && m.cfg.Egress.TripwireStop {
			// Not from the proxy's own goroutine: stopping closes the proxy,
			// which waits for it.
			go func() {
				if _, err := m.Stop(context.Background(), Principal{Tenant: s.Tenant}, s.ID); err != nil {
					m.log.Warn("tripwire_stop_failed", "session", s.ID, "err", err)
				} else {
					m.log.Warn("tripwire_stopped_session", "session", s.ID, "secret", r.Tripwire, "host", s.redact(r.Host))
				}
			}()
		}
	})
	if in, out := s.savedEgressBytes(); in > 0 || out > 0 {
		ps.AddBytes(in, out)
	}
	go func() {
		if err := ps.Serve(ln); err != nil {
			m.log.Error("egress_proxy_failed", "session", s.ID, "err", err)
		}
	}()
	// Transparent egress: every TCP connection and DNS, where the driver
	// can route them. Without it the proxy variables still work.
	if tn, ok := s.sandbox.(sandbox.TransparentNet); ok {
		if t, err := tn.ListenTransparent(ctx); err != nil {
			m.log.Warn("egress_transparent_failed", "session", s.ID, "err", err)
		} else {
			go func() {
				if err := ps.ServeTransparent(t.TCP); err != nil {
					m.log.Error("egress_transparent_failed", "session", s.ID, "err", err)
				}
			}()
			go func() {
				if err := ps.ServeDNS(t.DNSUDP, t.DNSTCP); err != nil {
					m.log.Error("egress_resolver_failed", "session", s.ID, "err", err)
				}
			}()
		}
	}
	// The SSH agent of its ssh-key secrets: without it the rest of egress
	// still works (a create refuses the session: Create checks).
	agent, agentPath, err := m.openAgent(ctx, s, ps)
	if err != nil {
		m.log.Error("ssh_agent_failed", "session", s.ID, "err", err)
	}
	s.setProxy(ps, addr, agent, agentPath)
	return nil
}

// needsProxy reports whether s needs an egress proxy: it has an
// allow-list or a secret bound to hosts.
func (s *Session) needsProxy() bool {
	mode, _ := s.askState()
	return len(s.EgressAllow()) > 0 || slices.ContainsFunc(s.Secrets, SecretRef.Bound) || mode == EgressModeAsk
}

// newEgressCA makes s's egress CA.
func (s *Session) newEgressCA() error {
	ca, err := egress.NewCA(s.ID)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		return err
	}
	s.egressCA, s.egressCAPEM, s.egressCAKey = ca, certPEM, keyPEM
	return nil
}
