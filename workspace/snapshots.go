package workspace

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// SnapshotEntry is what a tenant's list shows of a snapshot.
type SnapshotEntry struct {
	SnapshotID string    `json:"snapshotId"`
	SizeBytes  int64     `json:"sizeBytes"`
	Files      int       `json:"files"`
	CreatedAt  time.Time `json:"createdAt"`
	// SessionID is the session it was taken of (absent for snapshots
	// taken before sessions were recorded).
	SessionID string `json:"sessionId,omitempty"`
}

// listDocs lists the doc keys under prefix: the object store's, when
// there is one and it answers (gateways sharing it change them), with
// this gateway's unpushed ones; otherwise the local store's.
func (s *Service) listDocs(ctx context.Context, prefix string) ([]string, error) {
	return s.listDocsFrom(ctx, prefix, false)
}

// listDocsStrict is listDocs that fails when the object store does,
// for counts that must not be guessed from the local store alone.
func (s *Service) listDocsStrict(ctx context.Context, prefix string) ([]string, error) {
	return s.listDocsFrom(ctx, prefix, true)
}

func (s *Service) listDocsFrom(ctx context.Context, prefix string, strict bool) ([]string, error) {
	keys, err := s.local.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	if s.cfg.Remote != nil {
		remote, err := s.cfg.Remote.List(ctx, prefix)
		if err != nil {
			if strict {
				return nil, err
			}
			s.cfg.Log.Warn("workspace_list_remote_failed", "err", err)
		} else {
			keys = slices.DeleteFunc(keys, func(k string) bool { return !s.pendingPush(k) })
		}
		keys = append(keys, remote...)
	}
	sort.Strings(keys)
	keys = slices.Compact(keys)
	return slices.DeleteFunc(keys, func(k string) bool { return !strings.HasSuffix(k, ".json") }), nil
}

// ListSnapshots lists tenant's snapshots, newest first; session, when
// not "", keeps only those taken of that session.
func (s *Service) ListSnapshots(ctx context.Context, tenant, session string) ([]SnapshotEntry, error) {
	prefix := tenantDir(tenant) + "/snapshots/"
	keys, err := s.listDocs(ctx, prefix)
	if err != nil {
		return nil, s.errStore("could not list snapshots", err)
	}
	out := []SnapshotEntry{}
	for _, k := range keys {
		id := strings.TrimSuffix(strings.TrimPrefix(k, prefix), ".json")
		if !snapIDRE.MatchString(id) {
			continue
		}
		d, err := s.readDoc(ctx, k)
		if err != nil {
			continue // deleted meanwhile
		}
		if session != "" && d.Session != session {
			continue
		}
		out = append(out, SnapshotEntry{SnapshotID: id, SizeBytes: d.SizeBytes, Files: d.Files, CreatedAt: d.CreatedAt, SessionID: d.Session})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// DeleteSnapshot removes tenant's snapshot id, here and in the object
// store, and collects the objects nothing names any more. Sessions
// already started from it keep their files.
func (s *Service) DeleteSnapshot(ctx context.Context, tenant, id string) error {
	if !snapIDRE.MatchString(id) {
		return errNotFound("snapshot_not_found", "no such snapshot")
	}
	key := snapshotKey(tenant, id)
	ok, err := s.exists(ctx, key)
	if err != nil {
		return s.errStore("could not look the snapshot up", err)
	}
	if !ok {
		return errNotFound("snapshot_not_found", fmt.Sprintf("no snapshot %q", id))
	}
	return s.remove(ctx, key)
}
