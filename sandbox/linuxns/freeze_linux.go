//go:build linux

package linuxns

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// Thaw attempts: a failed thaw is tried again after thawBackoff, then
// twice as long, and so on, thawTries times in all.
const (
	thawTries   = 5
	thawBackoff = 20 * time.Millisecond
)

// Freeze freezes every process of the sandbox through its cgroups'
// freezer (sandbox.Freezer), waiting at most cgroup.FreezeTimeout. A
// stopped sandbox has no process and no cgroup: there is nothing to
// freeze, and thaw does nothing.
//
// From Freeze to the first call of thaw the sandbox's lifecycle lock is
// held, so that no Stop, Resume, Destroy or Detach interleaves with a
// snapshot. thaw tries again with backoff when the kernel refuses, logs
// sandbox_thaw_failed when it still cannot, and lets the lock go either
// way: Stop and Destroy thaw the cgroups themselves, and an Adopt does.
func (s *linuxSandbox) Freeze(ctx context.Context) (func() error, error) {
	s.life.Lock()
	s.mu.Lock()
	closed, stopped, cgs := s.closed, s.st.Stopped, slices.Clone(s.st.Cgroups)
	paused := s.st.Paused
	s.mu.Unlock()
	if closed {
		s.life.Unlock()
		return nil, sandbox.ErrClosed
	}
	if stopped || paused { // a paused one is frozen already, and stays so
		s.life.Unlock()
		return func() error { return nil }, nil
	}
	thaw, err := cgroup.Freeze(ctx, cgs)
	if err != nil {
		s.life.Unlock()
		return nil, err
	}
	var unlock sync.Once
	return func() error {
		defer unlock.Do(s.life.Unlock)
		return s.thawRetrying(thaw)
	}, nil
}

// thawRetrying calls thaw until it succeeds, thawTries times at most.
func (s *linuxSandbox) thawRetrying(thaw func() error) error {
	var err error
	delay := thawBackoff
	for try := 1; ; try++ {
		if err = thaw(); err == nil {
			return nil
		}
		if try == thawTries {
			break
		}
		s.d.log.Warn("sandbox_thaw_retry", "sandbox", s.st.ID, "try", try, "err", err)
		time.Sleep(delay)
		delay *= 2
	}
	s.d.log.Error("sandbox_thaw_failed", "sandbox", s.st.ID, "tries", thawTries, "err", err,
		"effect", "the session stays frozen until it is stopped, destroyed or adopted again")
	return fmt.Errorf("thaw after %d tries: %w", thawTries, err)
}

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
