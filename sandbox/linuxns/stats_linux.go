//go:build linux

package linuxns

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// Stats implements sandbox.Statser: memory, CPU time and pids from the
// sandbox's cgroups (v1 or v2, as this host made them), and the disk use
// of its workspace filesystem, which holds every file the session writes
// outside /tmp (an image sandbox's writable layer too). A stopped sandbox
// has no cgroups: only its disk use is known.
func (s *linuxSandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	s.mu.Lock()
	closed, stopped, cgs := s.closed, s.st.Stopped, slices.Clone(s.st.Cgroups)
	s.mu.Unlock()
	if closed {
		return sandbox.Stats{}, sandbox.ErrClosed
	}
	var st sandbox.Stats
	if !stopped {
		u := cgroup.ReadUsage(cgs)
		st.MemoryBytes, st.MemoryPeakBytes, st.CPUSeconds, st.Pids = u.MemoryBytes, u.MemoryPeakBytes, u.CPUSeconds, u.Pids
	}
	used, total, err := fsUsage(s.st.Workspace)
	if err != nil {
		return st, nil // no workspace mount to measure: the disk fields stay unknown
	}
	st.DiskUsedBytes, st.DiskTotalBytes = &used, &total
	return st, nil
}

// fsUsage is the used and total bytes of the filesystem mounted at dir,
// as df counts them; an error when dir is not a mount point (the numbers
// would be those of the filesystem below it).
func fsUsage(dir string) (used, total int64, err error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, 0, err
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return 0, 0, err
	}
	if st.Dev == parent.Dev {
		return 0, 0, fmt.Errorf("%s is not a mount point", dir)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, 0, err
	}
	bs := int64(fs.Bsize)
	return int64(fs.Blocks-fs.Bfree) * bs, int64(fs.Blocks) * bs, nil
}
