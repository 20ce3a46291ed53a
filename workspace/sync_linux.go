//go:build linux

package workspace

import (
	"os"

	"golang.org/x/sys/unix"
)

// fsSize is the size of the filesystem holding dir (0: unknown).
func fsSize(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Blocks) * int64(st.Bsize)
}

// syncStore makes everything written to the local store durable: one
// syncfs of its filesystem (every new object, page and directory) before
// a doc that names them is written, instead of an fsync per object.
func (s *store) syncStore() error {
	f, err := os.Open(s.local.dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
