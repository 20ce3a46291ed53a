package workspace

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// Per-tenant bounds on what a tenant keeps, when Config leaves them 0.
const (
	DefaultMaxWorkspaces = 100
	DefaultMaxSnapshots  = 1000
)

// limit is one per-tenant bound: the docs under a tenant's prefix, at
// most max of them.
type limit struct {
	kind   string // "workspaces" or "snapshots", the prefix's last part
	max    int
	code   string
	flag   string
	advice string
}

// limits keeps the per-tenant bounds: what a tenant may keep, and the
// docs this gateway is creating or created lately, which a listing may
// not show yet.
type limits struct {
	maxWorkspaces, maxSnapshots int

	mu       sync.Mutex
	creating map[string]bool      // doc keys of workspaces and snapshots being created
	settled  map[string]time.Time // doc keys created lately -> when
}

func newLimits(cfg Config) *limits {
	return &limits{maxWorkspaces: cfg.MaxWorkspaces, maxSnapshots: cfg.MaxSnapshots,
		creating: map[string]bool{}, settled: map[string]time.Time{}}
}

func (l *limits) workspaceLimit() limit {
	return limit{kind: "workspaces", max: l.maxWorkspaces, code: "workspace_limit", flag: "max-workspaces-per-tenant",
		advice: "delete one first (DELETE /v1/workspaces/{name})"}
}

func (l *limits) snapshotLimit() limit {
	return limit{kind: "snapshots", max: l.maxSnapshots, code: "snapshot_limit", flag: "max-snapshots-per-tenant",
		advice: "delete one first (DELETE /v1/snapshots/{id})"}
}

// settleFor is how long a created doc stays counted from memory after
// its create returned: a listing that started before the doc was
// written (an object store's LIST is a network call) does not show it.
const settleFor = time.Minute

// reserve counts tenant's docs of l's kind and reserves key for one
// more, or answers l's quota error. The count is the union of the
// store's listing, the docs this gateway is creating (limits.creating)
// and those it created in the last settleFor (limits.settled), so a
// create that finished while this listing travelled is not missed. The
// caller calls the returned release once key's doc is written (written
// true) or will not be. A listing that fails fails the create: the bound
// is not guessed from the local store alone. Across gateways sharing an
// object store the count is the store's listing: two gateways creating
// at the same instant may both fit the last place.
func (s *Service) reserve(ctx context.Context, tenant, key string, l limit) (release func(written bool), err error) {
	prefix := tenantDir(tenant) + "/" + l.kind + "/"
	keys, err := s.listDocsStrict(ctx, prefix)
	if err != nil {
		return nil, s.errStore("could not count the tenant's "+l.kind, err)
	}
	return s.limits.admit(keys, prefix, key, l)
}

// admit is Service.reserve once the store listed keys under prefix.
func (t *limits) admit(keys []string, prefix, key string, l limit) (release func(written bool), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	counted := map[string]bool{}
	for _, k := range keys {
		if validDocKey(l.kind, strings.TrimPrefix(k, prefix)) {
			counted[k] = true
		}
	}
	for k := range t.creating {
		if strings.HasPrefix(k, prefix) {
			counted[k] = true
		}
	}
	for k, at := range t.settled {
		switch {
		case now.Sub(at) > settleFor:
			delete(t.settled, k)
		case strings.HasPrefix(k, prefix):
			counted[k] = true
		}
	}
	if n := len(counted); n >= l.max {
		return nil, &gateway.Error{Kind: gateway.KindQuota, Code: l.code,
			Message: fmt.Sprintf("the tenant has %d %s, as many as it may keep (%s=%d); %s", n, l.kind, l.flag, l.max, l.advice)}
	}
	if t.creating[key] {
		// The same name created twice at once: one of them will answer
		// workspace_exists or overwrite; count it once.
		return func(bool) {}, nil
	}
	t.creating[key] = true
	return func(written bool) {
		t.mu.Lock()
		delete(t.creating, key)
		if written {
			t.settled[key] = time.Now()
		}
		t.mu.Unlock()
	}, nil
}

// unsettle stops counting key from memory (its doc was deleted).
func (t *limits) unsettle(key string) {
	t.mu.Lock()
	delete(t.settled, key)
	t.mu.Unlock()
}

// validDocKey says whether name (a doc key's last part) is a workspace's
// or a snapshot's doc, as kind says.
func validDocKey(kind, name string) bool {
	id, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return false
	}
	if kind == "snapshots" {
		return snapIDRE.MatchString(id)
	}
	return nameRE.MatchString(id)
}
