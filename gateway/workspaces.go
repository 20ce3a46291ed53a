package gateway

import (
	"context"

	"github.com/sandgate/sandgate/sandbox"
)

// WorkspaceRef says what a new session's /workspace starts from: a named
// workspace it holds while it lives, or a snapshot (fork). Both empty: a
// fresh, empty workspace.
type WorkspaceRef struct {
	Name         string `json:"workspace,omitempty"`
	FromSnapshot string `json:"fromSnapshot,omitempty"`
}

// Workspaces keeps workspaces beyond sessions (package workspace). The
// Manager calls it at three points of a session's life.
type Workspaces interface {
	// Claim checks that tenant may start session from ref before its
	// sandbox is made, and reserves a named workspace for it
	// (workspace_busy when another live session holds it).
	Claim(ctx context.Context, tenant, session string, ref WorkspaceRef) error
	// Attach fills the new sandbox's workspace from ref (fill is false
	// for a session restored after a restart, whose files are there).
	Attach(ctx context.Context, tenant, session string, ref WorkspaceRef, sb sandbox.Sandbox, fill bool) error
	// Detach is called when session ends, before its sandbox is
	// destroyed, and after a failed create: it releases what Claim took.
	Detach(ctx context.Context, session string)
}

// claimWorkspace asks the workspaces to reserve what s starts from.
func (m *Manager) claimWorkspace(ctx context.Context, s *Session) error {
	if s.Workspace == (WorkspaceRef{}) {
		return nil
	}
	if m.cfg.Workspaces == nil {
		return Invalid("workspaces_unavailable", "this gateway keeps no workspaces")
	}
	return m.cfg.Workspaces.Claim(ctx, s.Tenant, s.ID, s.Workspace)
}

// attachWorkspace fills the new sandbox's workspace (fill) or re-attaches
// a restored session's.
func (m *Manager) attachWorkspace(ctx context.Context, s *Session, fill bool) error {
	if s.Workspace == (WorkspaceRef{}) || m.cfg.Workspaces == nil {
		return nil
	}
	return m.cfg.Workspaces.Attach(ctx, s.Tenant, s.ID, s.Workspace, s.Sandbox(), fill)
}

// detachWorkspace tells the workspaces that s ends (its sandbox is still
// there): a named workspace is synced a last time and released.
func (m *Manager) detachWorkspace(ctx context.Context, s *Session) {
	if m.cfg.Workspaces != nil {
		m.cfg.Workspaces.Detach(context.WithoutCancel(ctx), s.ID)
	}
}

// restoreWorkspace re-claims a restored session's workspace.
func (m *Manager) restoreWorkspace(ctx context.Context, s *Session) {
	if s.Workspace == (WorkspaceRef{}) || m.cfg.Workspaces == nil {
		return
	}
	ref := WorkspaceRef{Name: s.Workspace.Name} // a fork's snapshot is not held
	err := m.cfg.Workspaces.Claim(ctx, s.Tenant, s.ID, ref)
	if err == nil {
		err = m.attachWorkspace(ctx, s, false)
	}
	if err != nil {
		m.log.Error("workspace_restore_failed", "session", s.ID, "err", err)
	}
}
