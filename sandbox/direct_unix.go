//go:build unix

package sandbox

import (
	"io/fs"
	"syscall"
)

type owner struct{ uid, gid int }

func statOwner(fi fs.FileInfo) (owner, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{int(st.Uid), int(st.Gid)}, true
}
