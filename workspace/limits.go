package workspace

import (
	"context"
	"fmt"
	"strings"

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

func (s *Service) workspaceLimit() limit {
	return limit{kind: "workspaces", max: s.cfg.MaxWorkspaces, code: "workspace_limit", flag: "max-workspaces-per-tenant",
		advice: "delete one first (DELETE /v1/workspaces/{name})"}
}

func (s *Service) snapshotLimit() limit {
	return limit{kind: "snapshots", max: s.cfg.MaxSnapshots, code: "snapshot_limit", flag: "max-snapshots-per-tenant",
		advice: "delete one first (DELETE /v1/snapshots/{id})"}
}

// reserve counts tenant's docs of l's kind, those being created on this
// gateway included, and reserves key for one more, or answers l's
// quota error. The caller calls the returned release once key's doc is
// written (or will not be). Across gateways sharing an object store the
// count is the store's listing: two gateways creating at the same
// instant may both fit the last place.
func (s *Service) reserve(ctx context.Context, tenant, key string, l limit) (release func(), err error) {
	prefix := tenantDir(tenant) + "/" + l.kind + "/"
	keys, err := s.listDocs(ctx, prefix)
	if err != nil {
		return nil, errStore("could not count the tenant's "+l.kind, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if !s.creating[k] && validDocKey(l.kind, strings.TrimPrefix(k, prefix)) {
			n++
		}
	}
	for k := range s.creating {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	if n >= l.max {
		return nil, &gateway.Error{Kind: gateway.KindQuota, Code: l.code,
			Message: fmt.Sprintf("the tenant has %d %s, as many as it may keep (%s=%d); %s", n, l.kind, l.flag, l.max, l.advice)}
	}
	s.creating[key] = true
	return func() {
		s.mu.Lock()
		delete(s.creating, key)
		s.mu.Unlock()
	}, nil
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
