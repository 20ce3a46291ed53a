package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/gateway"
)

// Named workspaces (package workspace) live in the object store the
// nodes share; which session holds one is kept in etcd, so that one live
// session holds it in the whole cluster:
//
//	workspaces/<tenant>/<name>  "<session>\x00<node>\x00<lease>"
//
// The key is written when a create claims the workspace (before its
// sandbox is filled), checked again by the create's transaction (Store),
// and deleted once the session's last sync is in the object store. A key
// holds only while its session is live, or its node is the one that
// wrote it and still has that lease (the last sync may be on its way),
// or its node is restarting: so a node that dies lets go of its
// workspaces once the sweep marks its sessions lost.

func keyWorkspace(t, name string) string { return Prefix + "workspaces/" + tenantKey(t) + "/" + name }

// wsClaim is a workspaces/ key's value.
type wsClaim struct {
	session, node string
	lease         int64
}

func (c wsClaim) String() string {
	return c.session + "\x00" + c.node + "\x00" + strconv.FormatInt(c.lease, 16)
}

func parseClaim(v string) wsClaim {
	parts := strings.SplitN(v, "\x00", 3)
	if len(parts) != 3 {
		return wsClaim{session: v}
	}
	l, _ := strconv.ParseInt(parts[2], 16, 64)
	return wsClaim{parts[0], parts[1], l}
}

// bySession compares a workspaces/ key's value with session's claims.
func bySession(k, session string) []Cmp {
	return []Cmp{
		CompareValue(k, ">", session+"\x00"),
		CompareValue(k, "<", session+"\x01"),
	}
}

func errWorkspaceBusy(name string) error {
	return &gateway.Error{Kind: gateway.KindConflict, Code: "workspace_busy",
		Message: fmt.Sprintf("workspace %q is held by another live session in the cluster (or its last sync is not stored yet); end it first, or retry", name)}
}

// WorkspaceLocks keeps the cluster's workspace holders (workspace.Locks).
type WorkspaceLocks struct{ n *Node }

// WorkspaceLocks returns the node's workspace.Locks.
func (n *Node) WorkspaceLocks() *WorkspaceLocks { return &WorkspaceLocks{n} }

// held reports whether c still holds its workspace.
func (n *Node) held(ctx context.Context, tenant string, c wsClaim) (bool, error) {
	if ok, err := n.exists(ctx, keyLive(tenant, c.session)); err != nil || ok {
		return ok, err
	}
	kv, err := n.cli.Get(ctx, Prefix+"nodes/"+c.node)
	if err != nil {
		return false, err
	}
	if kv != nil && kv.Lease == c.lease {
		return true, nil
	}
	mark, err := n.cli.Get(ctx, Prefix+"restarting/"+c.node)
	if err != nil || mark == nil {
		return false, err
	}
	return openMark(n.cfg.Token, c.node, []byte(mark.Value), mark.Lease) == nil, nil
}

// Acquire reserves tenant's workspace name for session. A claim of this
// node's is taken over (the node's workspace engine already refused a
// live holder), as is one that no longer holds.
func (l *WorkspaceLocks) Acquire(ctx context.Context, tenant, name, session string) error {
	n := l.n
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	k := keyWorkspace(tenant, name)
	for range 8 {
		kv, err := n.cli.Get(ctx, k)
		if err != nil {
			return unavailable(err)
		}
		cmp := CompareCreate(k, "=", 0)
		if kv != nil {
			c := parseClaim(kv.Value)
			if c.session != session && c.node != n.cfg.NodeID {
				held, err := n.held(ctx, tenant, c)
				if err != nil {
					return unavailable(err)
				}
				if held {
					return errWorkspaceBusy(name)
				}
			}
			cmp = CompareMod(k, "=", kv.ModRev)
		}
		v := wsClaim{session, n.cfg.NodeID, n.leaseID()}.String()
		tr, err := n.cli.Txn(ctx, []Cmp{cmp}, []Op{OpPut(k, v, 0)}, nil)
		if err != nil {
			return unavailable(err)
		}
		if tr.Succeeded {
			return nil
		}
	}
	return errWorkspaceBusy(name)
}

// Release deletes session's claim of tenant's workspace name, if it
// still has it. A failure (no etcd) is the caller's to retry: until then
// the claim holds while this node keeps its lease.
func (l *WorkspaceLocks) Release(ctx context.Context, tenant, name, session string) error {
	n := l.n
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	k := keyWorkspace(tenant, name)
	if _, err := n.cli.Txn(ctx, bySession(k, session), []Op{OpDelete(k)}, nil); err != nil {
		n.log.Warn("cluster_workspace_release_failed", "workspace", name, "session", session, "err", err)
		return unavailable(err)
	}
	return nil
}

// Tidy goes through this node's claims: one that keep wants, or whose
// session is live, is made to hold with the node's current lease (after
// a restart, the claim of a workspace whose last sync is still queued
// must not stop holding when the restarting mark goes); any other is
// deleted (a release that failed, or a claim no session of this node
// holds any more).
func (l *WorkspaceLocks) Tidy(ctx context.Context, keep func(tenant, name, session string) bool) error {
	n := l.n
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	prefix := Prefix + "workspaces/"
	kvs, err := n.cli.List(ctx, prefix)
	if err != nil {
		return unavailable(err)
	}
	var errs []error
	for _, kv := range kvs {
		c := parseClaim(kv.Value)
		if c.node != n.cfg.NodeID {
			continue
		}
		tk, name, ok := strings.Cut(strings.TrimPrefix(kv.Key, prefix), "/")
		tenant, err := url.PathUnescape(tk)
		if !ok || err != nil {
			continue // not a key this code writes
		}
		hold := keep(tenant, name, c.session)
		if !hold {
			if hold, err = n.exists(ctx, keyLive(tenant, c.session)); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		k := kv.Key
		same := CompareMod(k, "=", kv.ModRev)
		var op Op
		switch {
		case hold && c.lease == n.leaseID():
			continue
		case hold:
			op = OpPut(k, wsClaim{c.session, n.cfg.NodeID, n.leaseID()}.String(), 0)
		default:
			op = OpDelete(k)
		}
		if _, err := n.cli.Txn(ctx, []Cmp{same}, []Op{op}, nil); err != nil {
			errs = append(errs, err)
			continue
		}
		n.log.Info("cluster_workspace_tidied", "workspace", name, "session", c.session, "kept", hold)
	}
	if err := errors.Join(errs...); err != nil {
		return unavailable(err)
	}
	return nil
}

// Holder is the session holding tenant's workspace name ("": none).
func (l *WorkspaceLocks) Holder(ctx context.Context, tenant, name string) (string, error) {
	n := l.n
	ctx, cancel := context.WithTimeout(ctx, n.cfg.OpTimeout)
	defer cancel()
	kv, err := n.cli.Get(ctx, keyWorkspace(tenant, name))
	if err != nil {
		return "", unavailable(err)
	}
	if kv == nil {
		return "", nil
	}
	c := parseClaim(kv.Value)
	held, err := n.held(ctx, tenant, c)
	if err != nil {
		return "", unavailable(err)
	}
	if !held {
		return "", nil
	}
	return c.session, nil
}

// workspaceClaimOps are the compare and read a new live record's create
// transaction adds for its named workspace: the claim must still be the
// session's (no other node took it over since).
func workspaceClaimOps(r gateway.Record) ([]Cmp, []Op) {
	if r.WorkspaceRef.Name == "" || !isLive(r.Status) {
		return nil, nil
	}
	k := keyWorkspace(r.Tenant, r.WorkspaceRef.Name)
	return bySession(k, r.ID), []Op{OpGet(k)}
}

// workspaceConflict looks at the last of a failed create transaction's
// reads (resps), the workspace claim's when workspaceClaimOps added one,
// and returns the others, for claimConflict.
func workspaceConflict(r gateway.Record, resps []*KeyValue) ([]*KeyValue, error) {
	if _, get := workspaceClaimOps(r); get == nil || len(resps) == 0 {
		return resps, nil
	}
	last := resps[len(resps)-1]
	if last == nil || parseClaim(last.Value).session != r.ID {
		return nil, errWorkspaceBusy(r.WorkspaceRef.Name)
	}
	return resps[:len(resps)-1], nil
}
