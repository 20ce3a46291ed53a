package sftpd

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fsys is the filesystem the server serves. Names are the client's paths,
// cleaned and absolute. With a root, every name resolves inside it through
// os.Root (the kernel-backed resolver refuses "..", absolute symlinks and
// links that leave it), and the client sees the root as "/". Without one,
// names are host paths: that is only for a process the kernel confines
// already, like a linux sandbox's.
type fsys struct {
	root *os.Root
}

// rel maps a client path to a path relative to the root.
func rel(name string) string {
	r := strings.TrimPrefix(path.Clean("/"+name), "/")
	if r == "" {
		return "."
	}
	return r
}

// OpenFile opens name. Under a root the mode of a new file keeps only its
// permission bits: os.Root refuses setuid, setgid and sticky on create.
func (f fsys) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if f.root == nil {
		return os.OpenFile(name, flag, perm)
	}
	return f.root.OpenFile(rel(name), flag, perm.Perm())
}

func (f fsys) Stat(name string) (fs.FileInfo, error) {
	if f.root == nil {
		return os.Stat(name)
	}
	return f.root.Stat(rel(name))
}

func (f fsys) Lstat(name string) (fs.FileInfo, error) {
	if f.root == nil {
		return os.Lstat(name)
	}
	return f.root.Lstat(rel(name))
}

// Mkdir makes a directory. os.Root takes permission bits only, so under a
// root the setgid and sticky bits asked for are set once it exists.
func (f fsys) Mkdir(name string, perm fs.FileMode) error {
	if f.root == nil {
		return os.Mkdir(name, perm)
	}
	if err := f.root.Mkdir(rel(name), perm.Perm()); err != nil {
		return err
	}
	if special := perm & (fs.ModeSetgid | fs.ModeSticky); special != 0 {
		fi, err := f.root.Lstat(rel(name))
		if err != nil {
			return err
		}
		return f.root.Chmod(rel(name), fi.Mode().Perm()|special)
	}
	return nil
}

func (f fsys) Readlink(name string) (string, error) {
	if f.root == nil {
		return os.Readlink(name)
	}
	return f.root.Readlink(rel(name))
}

// Symlink creates name pointing at target, stored as given: following it
// later goes through the root, so a target outside resolves to nothing.
func (f fsys) Symlink(target, name string) error {
	if f.root == nil {
		return os.Symlink(target, name)
	}
	return f.root.Symlink(target, rel(name))
}

func (f fsys) Link(oldname, newname string) error {
	if f.root == nil {
		return os.Link(oldname, newname)
	}
	return f.root.Link(rel(oldname), rel(newname))
}

func (f fsys) Chmod(name string, mode fs.FileMode) error {
	if f.root == nil {
		return os.Chmod(name, mode)
	}
	return f.root.Chmod(rel(name), mode)
}

func (f fsys) Chtimes(name string, atime, mtime time.Time) error {
	if f.root == nil {
		return os.Chtimes(name, atime, mtime)
	}
	return f.root.Chtimes(rel(name), atime, mtime)
}

func (f fsys) Lchown(name string, uid, gid int) error {
	if f.root == nil {
		return os.Lchown(name, uid, gid)
	}
	return f.root.Lchown(rel(name), uid, gid)
}

func (f fsys) Chown(name string, uid, gid int) error {
	if f.root == nil {
		return os.Chown(name, uid, gid)
	}
	return f.root.Chown(rel(name), uid, gid)
}

// at resolves name to its parent directory (as a descriptor) and its last
// element, for the *at system calls that have no os.Root method. The
// parent is opened through the root; the last element is a single name
// the calls do not follow. release closes the parent.
func (f fsys) at(name string) (dirfd int, base string, release func(), err error) {
	if f.root == nil {
		return unix.AT_FDCWD, name, func() {}, nil
	}
	r := rel(name)
	if r == "." {
		// The root itself has no parent inside the root.
		return -1, "", nil, fs.ErrPermission
	}
	// A path-only descriptor: no read permission is needed, and a FIFO in
	// the parent's place fails at once instead of blocking the open.
	d, err := f.root.OpenFile(path.Dir(r), dirFlags, 0)
	if err != nil {
		return -1, "", nil, err
	}
	return int(d.Fd()), path.Base(r), func() { d.Close() }, nil
}

// Remove removes a file (dir false) or an empty directory (dir true), and
// nothing else: REMOVE on a directory and RMDIR on a file fail.
func (f fsys) Remove(name string, dir bool) error {
	fd, base, release, err := f.at(name)
	if err != nil {
		return err
	}
	defer release()
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	return pathErr("remove", name, unix.Unlinkat(fd, base, flags))
}

// Rename renames oldname to newname. Without replace (SFTP v3 RENAME) an
// existing newname makes it fail, atomically where the kernel can.
func (f fsys) Rename(oldname, newname string, replace bool) error {
	ofd, obase, orel, err := f.at(oldname)
	if err != nil {
		return err
	}
	defer orel()
	nfd, nbase, nrel, err := f.at(newname)
	if err != nil {
		return err
	}
	defer nrel()
	if replace {
		return pathErr("rename", oldname, unix.Renameat(ofd, obase, nfd, nbase))
	}
	return pathErr("rename", oldname, renameNoReplace(ofd, obase, nfd, nbase))
}

// Truncate truncates the regular file name. It is opened without
// blocking, so a FIFO cannot stall the server; other files are refused,
// as truncate(2) refuses them.
func (f fsys) Truncate(name string, size int64) error {
	t, err := f.OpenFile(name, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer t.Close()
	if fi, err := t.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return pathErr("truncate", name, syscall.EINVAL)
	}
	return t.Truncate(size)
}

// LChtimes sets a symlink's own times (lsetstat).
func (f fsys) LChtimes(name string, atime, mtime time.Time) error {
	fd, base, release, err := f.at(name)
	if err != nil {
		return err
	}
	defer release()
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	return pathErr("lchtimes", name, unix.UtimesNanoAt(fd, base, ts, unix.AT_SYMLINK_NOFOLLOW))
}

// futimes sets an open file's times.
func futimes(f *os.File, atime, mtime int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.Futimes(int(fd), []unix.Timeval{{Sec: atime}, {Sec: mtime}})
	}); err != nil {
		return err
	}
	return serr
}

func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// escaped reports whether err is os.Root refusing a path that leaves it.
func escaped(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}

var errIsDir = errors.New("is a directory")
