package linuxns

import (
	"errors"
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
// and nothing changes. Only an error opening dir is returned.
func spreadSubdirs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&fsTopDirFlag != 0 {
		return nil
	}
	_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, flags|fsTopDirFlag)
	return nil
}

// mkdirSpread makes dir (mode perm) if it is not there, and marks it
// (spreadSubdirs) either way.
func mkdirSpread(dir string, perm os.FileMode) error {
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return spreadSubdirs(dir)
}
