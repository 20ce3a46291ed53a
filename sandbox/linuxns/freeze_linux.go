//go:build linux

package linuxns

import (
	"context"
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

var _ sandbox.Freezer = (*linuxSandbox)(nil)
