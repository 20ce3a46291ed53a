//go:build linux

package sftpd

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// dirFlags opens a parent directory for the *at calls; pathFlags opens a
// file only to ask about it (statvfs). Neither needs read permission nor
// blocks on a FIFO.
const (
	dirFlags  = unix.O_PATH | unix.O_DIRECTORY
	pathFlags = unix.O_PATH
)

// renameNoReplace renames without replacing an existing target, atomically
// with renameat2(RENAME_NOREPLACE) where the filesystem has it.
func renameNoReplace(ofd int, obase string, nfd int, nbase string) error {
	err := unix.Renameat2(ofd, obase, nfd, nbase, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	var st unix.Stat_t
	if unix.Fstatat(nfd, nbase, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		return unix.EEXIST
	}
	return unix.Renameat(ofd, obase, nfd, nbase)
}

// statvfs answers statvfs@openssh.com: the eleven fields of statvfs(3).
func statvfs(f *os.File) ([11]uint64, error) {
	var st unix.Statfs_t
	rc, err := f.SyscallConn()
	if err != nil {
		return [11]uint64{}, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstatfs(int(fd), &st) }); err != nil {
		return [11]uint64{}, err
	}
	if serr != nil {
		return [11]uint64{}, serr
	}
	fsid := uint64(uint32(st.Fsid.Val[0])) | uint64(uint32(st.Fsid.Val[1]))<<32
	return [11]uint64{uint64(st.Bsize), uint64(st.Frsize), st.Blocks, st.Bfree, st.Bavail,
		st.Files, st.Ffree, st.Ffree, fsid, uint64(st.Flags) & stFlagMask, uint64(st.Namelen)}, nil
}

// stFlagMask keeps the f_flag bits the extension defines: ST_RDONLY (1)
// and ST_NOSUID (2), which Linux numbers the same.
const stFlagMask = 3

func statTimes(st *syscall.Stat_t) (atime, mtime int64) { return st.Atim.Sec, st.Mtim.Sec }
