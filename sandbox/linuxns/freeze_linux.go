//go:build linux

package linuxns

import (
	"context"
	"path/filepath"
	"slices"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// Freeze freezes every process of the sandbox through its cgroups'
// freezer (sandbox.Freezer). A stopped sandbox has no process and no
// cgroup: there is nothing to freeze, and thaw does nothing.
func (s *linuxSandbox) Freeze(ctx context.Context) (func() error, error) {
	s.mu.Lock()
	stopped, cgs := s.st.Stopped, slices.Clone(s.st.Cgroups)
	s.mu.Unlock()
	if stopped {
		return func() error { return nil }, nil
	}
	return cgroup.Freeze(ctx, cgs)
}

var (
	_ sandbox.Freezer        = (*linuxSandbox)(nil)
	_ sandbox.WorkspaceHomer = (*linuxSandbox)(nil)
)

// WorkspaceHome is the host directory that is the sandbox's /workspace
// (sandbox.WorkspaceHomer): the workspace mount, or its home/ on an image.
func (s *linuxSandbox) WorkspaceHome() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Boot != nil && s.st.Boot.Image != nil {
		return filepath.Join(s.st.Workspace, imageHome)
	}
	return s.st.Workspace
}
