//go:build linux

package linuxns

import (
	"context"
	"fmt"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// Rebind implements sandbox.Rebinder: memory, pids and CPUs change in
// the sandbox's cgroups. The sizes of /tmp and of the workspace are its
// filesystems', and the open files limit its init set from its pids for
// every command: a change of those is sandbox.ErrNotLive.
func (s *linuxSandbox) Rebind(ctx context.Context, l sandbox.Limits) error {
	lim := l.Or(s.d.limits)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.st.Stopped || s.st.Boot == nil {
		return sandbox.ErrNotLive
	}
	old := s.st.Boot.Limits
	soft := s.d.cfg.Nofile.Soft
	if lim.TmpBytes != old.TmpBytes || lim.WorkspaceBytes != old.WorkspaceBytes ||
		max(soft, initNofileFor(lim.Pids)) != max(soft, initNofileFor(old.Pids)) {
		return sandbox.ErrNotLive
	}
	if lim == old {
		return nil
	}
	if err := s.d.cg.SetLimits(s.st.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUs: lim.CPUs}); err != nil {
		return fmt.Errorf("rebind sandbox %s: %w", s.st.ID, err)
	}
	s.st.Boot.Limits = lim // what a Resume builds again
	return s.st.save(s.d.dir(s.st.ID))
}
