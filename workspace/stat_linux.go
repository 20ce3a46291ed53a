//go:build linux

package workspace

import (
	"io/fs"
	"syscall"
)

// ctimeIno are a file's change time (which no user can set) and inode.
func ctimeIno(info fs.FileInfo) (int64, uint64) {
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		return sys.Ctim.Nano(), sys.Ino
	}
	return 0, 0
}
