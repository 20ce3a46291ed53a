package linuxns

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fsTopDirFlag is FS_TOPDIR_FL (linux/fs.h), which golang.org/x/sys does
// not name.
const fsTopDirFlag = 0x00020000

// spreadSubdirs marks dir so that ext4 places each new subdirectory of it
// in a block group of its own choosing (the Orlov allocator's rule for a
// top of a directory hierarchy), and the files made in that subdirectory
// with it, rather than all of them beside dir. dir is one whose subdirs
// come and go by the hundred: the sandboxes', a fork's images, the
// restore stages.
//
// Why: ext4 without a journal (this driver's data dir on such a host, as
// on the VMs this is built on) skips, at each new inode, every free inode
// of the group deleted in the last 60 s (5 minutes more while its inode
// table block is dirty), looking each one up. Beside the hundreds of files
// each fork or sandbox makes and removes, a file's create took 0.3–0.5 ms
// of CPU: 9% of a fork ×4's CPU (bench/results/s58-fork-behind.md).
//
// The flag is a hint: a filesystem without it (tmpfs, xfs) refuses it,
// and nothing changes. Only an error opening dir is returned; dir is not
// followed if it is a symlink.
func spreadSubdirs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&fsTopDirFlag != 0 {
		return nil
	}
	_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopDirFlag))
	return nil
}

// mkdirSpread makes dir (mode perm) if it is not there, checks that it is
// root's own directory, which nobody else may write to (dir may be in a
// shared one, as the host's temporary dir: another user could have made
// it first, or a symlink in its place), and marks it (spreadSubdirs).
func mkdirSpread(dir string, perm os.FileMode) error {
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("%s is not a directory of root's that only root may write to (mode %#o, owner %d): remove it", dir, st.Mode, st.Uid)
	}
	return spreadSubdirs(dir)
}
