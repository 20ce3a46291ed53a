package workdir

import (
	"context"
	"io/fs"
	"path/filepath"
	"syscall"

	"github.com/sandgate/sandgate/sandbox"
)

// Stats implements sandbox.Statser with what a plain directory can tell:
// the disk its files take (allocated blocks, as du counts them, hard
// links once). Memory, CPU and pids stay unknown (workdir puts its
// processes in no cgroup), and so does a total: the directory has no size
// of its own. The walk stops at ctx's end, answering ctx's error.
func (s *workdirSandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return sandbox.Stats{}, sandbox.ErrClosed
	}
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var used int64
	err := filepath.WalkDir(s.dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished or unreadable: not counted
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			used += fi.Size()
			return nil
		}
		if st.Nlink > 1 && !fi.IsDir() {
			k := inode{uint64(st.Dev), uint64(st.Ino)}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		used += int64(st.Blocks) * 512
		return nil
	})
	if err != nil {
		return sandbox.Stats{}, err
	}
	return sandbox.Stats{DiskUsedBytes: &used}, nil
}
