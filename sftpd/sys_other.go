//go:build !linux

package sftpd

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NONBLOCK
	pathFlags = unix.O_RDONLY | unix.O_NONBLOCK
)

func renameNoReplace(ofd int, obase string, nfd int, nbase string) error {
	var st unix.Stat_t
	if unix.Fstatat(nfd, nbase, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		return unix.EEXIST
	}
	return unix.Renameat(ofd, obase, nfd, nbase)
}

var errNoStatvfs = errors.New("statvfs is only answered on Linux")

func statvfs(*os.File) ([11]uint64, error) { return [11]uint64{}, errNoStatvfs }

func statTimes(st *syscall.Stat_t) (atime, mtime int64) {
	return st.Atimespec.Sec, st.Mtimespec.Sec
}
