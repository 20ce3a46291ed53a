package gateway

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// MaxNameLen bounds a session name.
const MaxNameLen = 63

// namePattern is what a session name looks like.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// checkName accepts "" (no name) or 1 to MaxNameLen characters of
// namePattern.
func checkName(name string) error {
	if name == "" {
		return nil
	}
	if len(name) > MaxNameLen || !namePattern.MatchString(name) {
		return Invalid("invalid_name", fmt.Sprintf("name must be 1 to %d characters: a letter or digit, then letters, digits, '_', '.' or '-'", MaxNameLen))
	}
	return nil
}

// nameKey names one tenant's session name.
type nameKey struct{ tenant, name string }

// errNameTaken is the answer to a create whose name a live session of the
// tenant (or a create in progress) already has.
func errNameTaken(name string) error {
	return &Error{Kind: KindConflict, Code: "name_taken",
		Message: fmt.Sprintf("the name %q is taken by another live session of yours; delete it or choose another name", name)}
}

// claimName reserves k's name for a create in progress, or answers
// name_taken. A non-empty name must be released with unclaimNameLocked
// once the session is in m.sessions, or with unclaimName on failure.
func (m *Manager) claimName(k nameKey) error {
	if k.name == "" {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.naming[k]; ok {
		return errNameTaken(k.name)
	}
	for _, s := range m.sessions {
		if s.Tenant == k.tenant && s.Name == k.name && s.Live() {
			return errNameTaken(k.name)
		}
	}
	if m.naming == nil {
		m.naming = map[nameKey]struct{}{}
	}
	m.naming[k] = struct{}{}
	return nil
}

func (m *Manager) unclaimName(k nameKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unclaimNameLocked(k)
}

func (m *Manager) unclaimNameLocked(k nameKey) {
	if k.name != "" {
		delete(m.naming, k)
	}
}

// ListFilter narrows a listing; its zero value lists everything.
type ListFilter struct {
	// Name, when set, lists the session of that name: the live one, or
	// when none is live the newest that still shows (a failed one).
	Name string
}

// ListFiltered is List narrowed by f.
func (m *Manager) ListFiltered(ctx context.Context, p Principal, f ListFilter, limit, offset int) ([]*Session, int) {
	if f.Name == "" {
		return m.List(ctx, p, limit, offset)
	}
	m.mu.Lock()
	var named []*Session
	for _, s := range m.sessions {
		if s.Tenant == p.Tenant && s.Name == f.Name {
			named = append(named, s)
		}
	}
	m.mu.Unlock()
	named = SelectNamed(named, f.Name)
	if offset >= len(named) {
		return []*Session{}, len(named)
	}
	return named[offset:min(offset+limit, len(named))], len(named)
}

// SelectNamed picks from ss the session called name that a lookup by name
// finds: the live one, or when none is live the newest; nil when none is
// called name.
func SelectNamed(ss []*Session, name string) []*Session {
	var best *Session
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		switch {
		case best == nil:
			best = s
		case s.Live() != best.Live():
			if s.Live() {
				best = s
			}
		case s.CreatedAt.After(best.CreatedAt):
			best = s
		}
	}
	if best == nil {
		return nil
	}
	return slices.Clip([]*Session{best})
}

// Resolve returns the id of p's session ref, where a session id goes: ref
// itself when it is the id of one of p's sessions here, of one of p's
// sessions that ended (its tombstone answers 410), or of one in the
// cluster's directory (an id always wins); else the id of p's session
// named ref (the live one, or the newest failed one), or, when none is,
// of the one name that matches ref but for case; else ref, which then
// answers as an unknown id.
func (m *Manager) Resolve(ctx context.Context, p Principal, ref string) string {
	if len(ref) > MaxNameLen || !namePattern.MatchString(ref) {
		return ref
	}
	m.mu.Lock()
	if s, ok := m.sessions[ref]; ok && s.Tenant == p.Tenant {
		m.mu.Unlock()
		return ref
	}
	var named, folded []*Session
	foldedNames := map[string]bool{}
	for _, s := range m.sessions {
		switch {
		case s.Tenant != p.Tenant:
		case s.Name == ref:
			named = append(named, s)
		case strings.EqualFold(s.Name, ref):
			folded = append(folded, s)
			foldedNames[s.Name] = true
		}
	}
	m.mu.Unlock()
	name := ref
	if len(named) == 0 && len(foldedNames) == 1 {
		// OpenSSH lowercases the host name (ssh NAME.sandgate): a name
		// matched but for case, when only one does.
		named, name = folded, folded[0].Name
	}
	best := SelectNamed(named, name)
	if len(best) == 0 || m.gone(p, ref) != nil {
		return ref
	}
	if m.cfg.Directory != nil {
		if r, ok, err := m.cfg.Directory.Record(ctx, ref); err == nil && ok && r.Tenant == p.Tenant {
			return ref
		}
	}
	return best[0].ID
}

// Owner is the tenant of session id, of any state, for what finds a
// session without a principal (presigned links, which carry the id and
// a signature over the tenant).
func (m *Manager) Owner(id string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return "", false
	}
	return s.Tenant, true
}
