//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
)

// claimTrees are the filesystems a sandbox's build makes and writes (the
// default root's tmpfs, its /etc, /dev, /dev/shm, /dev/pts and /tmp, and
// the workspace, the sandbox user's home). Only their own files are
// touched: what is bound in from the host (/usr, /etc's directories and
// large files) is on another device and left alone.
var claimTrees = []string{"/", "/etc", "/dev", "/dev/shm", "/dev/pts", "/tmp", "/workspace"}

// refreshTimes gives every file of claimTrees the current time as its
// access, modification and change time, so that a sandbox built ahead
// (the gateway's warm pool) shows the time of the create that claimed it,
// as one built for that create would, not the time the pool filled. It
// runs on a thread of its own in the sandbox's mount namespace (entered
// through the init's pidfd), which is thrown away after: the thread
// leaves the gateway's filesystem context for the sandbox's. Read-only
// mounts are made writable for the moment and read-only again. Nothing
// runs in a warm sandbox before its claim, and no path is followed
// through a symlink. An image sandbox's root is the image's overlay:
// there only what the build wrote, the files of its writable layer, is
// touched (imageTreeTimes), never the image's own files (the touch would
// copy each one up, and a cold create shows the image's times).
func (s *linuxSandbox) refreshTimes() error {
	s.mu.Lock()
	pidfd := s.pidfd
	// A shared /etc (the template, or a checkpointable sandbox's /etc
	// dir) is every sandbox's: only the files bound over it are touched.
	upperDir, etcTemplate := "", s.st.EtcTemplate || s.st.EtcDir != ""
	if s.st.Boot != nil && s.st.Boot.Image != nil {
		upperDir = filepath.Join(s.st.Workspace, imageUpper)
	}
	var fd int = -1
	var derr error = errors.New("the sandbox has no init")
	if pidfd != nil {
		rc, err := pidfd.SyscallConn()
		if err != nil {
			derr = err
		} else if err := rc.Control(func(p uintptr) { fd, derr = unix.FcntlInt(p, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
			derr = err
		}
	}
	s.mu.Unlock()
	if fd < 0 {
		return fmt.Errorf("claim times: %w", derr)
	}
	var err error
	defer unix.Close(fd)
	upper := -1
	if upperDir != "" {
		// Opened on the host, read after entering the sandbox's mounts.
		if upper, err = unix.Open(upperDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("claim times: the image's writable layer: %w", err)
		}
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with the goroutine,
		// so no other goroutine ever runs in the sandbox's namespace.
		runtime.LockOSThread()
		errc <- touchTrees(fd, upper, etcTemplate)
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("claim times: %w", err)
	}
	return nil
}

// touchTrees enters the mount namespace of the init of pidfd on the
// calling thread, which must be locked and discarded after, and touches
// claimTrees there; with upper, the open writable layer of an image
// sandbox (which it consumes), the root and /etc are the image's: only
// the paths upper holds are touched, through the sandbox's root. With
// etcTemplate, /etc is the gateway's template, shared by every sandbox:
// only the sandbox's own files bound over it are touched (touchOwnEtc).
func touchTrees(pidfd, upper int, etcTemplate bool) (err error) {
	if upper >= 0 {
		defer unix.Close(upper)
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	// The thread goes back to the gateway's mounts after: the runtime
	// ends a locked thread with its goroutine, but the process's main
	// thread is parked instead, and it would hold the sandbox's mounts
	// (its workspace's loop device) for good.
	home, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the gateway's mounts: %w", err)
	}
	defer unix.Close(home)
	if err := unix.Setns(pidfd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the sandbox's mounts: %w", err)
	}
	defer func() {
		if herr := unix.Setns(home, unix.CLONE_NEWNS); herr != nil {
			err = errors.Join(err, fmt.Errorf("leave the sandbox's mounts: %w", herr))
		}
	}()
	var errs []error
	for _, root := range claimTrees {
		if upper >= 0 && (root == "/" || root == "/etc") {
			continue
		}
		if etcTemplate && root == "/etc" {
			errs = append(errs, touchOwnEtc())
			continue
		}
		errs = append(errs, touchTree(root))
	}
	if upper >= 0 {
		errs = append(errs, touchUpper(upper))
	}
	return errors.Join(errs...)
}

// touchUpper touches, in the image root mounted at /, each path that the
// writable layer upper (an open directory, not consumed) holds: what the
// sandbox's build wrote over the image. Whiteouts (character devices 0:0)
// are no file of the root, and are skipped.
func touchUpper(upper int) error {
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the image root: %w", err)
	}
	defer unix.Close(root)
	mnt, _, err := mountOf(root, "")
	if err != nil {
		return fmt.Errorf("the image root: %w", err)
	}
	if err := unix.UtimesNanoAt(root, ".", claimNow, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("touch /: %w", err)
	}
	up, err := unix.Dup(upper)
	if err != nil {
		return err
	}
	return touchMirror(up, root, "/", mnt)
}

// mountOf is the id of the mount that name (below the directory dirfd;
// "": dirfd itself) is on, not following a symlink, and its file type.
// It tells a mount point from the files of a filesystem where st_dev
// cannot: overlayfs reports its files' layers' devices.
func mountOf(dirfd int, name string) (mnt uint64, mode uint16, err error) {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_TYPE|unix.STATX_MNT_ID, &stx); err != nil {
		return 0, 0, err
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, 0, errors.New("statx gives no mount id (linux 5.8 or later)")
	}
	return stx.Mnt_id, stx.Mode & unix.S_IFMT, nil
}

// touchMirror touches, below the directory dst (on the mount mnt), each
// entry of the directory src (consumed), and recurses into the
// directories of both. An entry of dst on another mount is a mount point
// (/proc, /dev..., or a file bound over one the build wrote): claimTrees'
// or none of the claim's, never touched through.
func touchMirror(src, dst int, dir string, mnt uint64) error {
	f := os.NewFile(uintptr(src), dir)
	defer f.Close()
	if _, err := unix.Seek(src, 0, 0); err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	entries, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		var st unix.Stat_t
		if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 { // a whiteout
			continue
		}
		// What the root shows at name: a mount point (a file bound in as
		// well as a directory) is not the build's.
		dmnt, dmode, err := mountOf(dst, name)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		if dmnt != mnt || st.Mode&unix.S_IFMT == unix.S_IFDIR && dmode != unix.S_IFDIR {
			continue
		}
		if err := unix.UtimesNanoAt(dst, name, claimNow, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("touch %s: %w", filepath.Join(dir, name), err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(src, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		dsub, err := unix.Openat(dst, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(sub)
			return fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		err = touchMirror(sub, dsub, filepath.Join(dir, name), mnt)
		unix.Close(dsub)
		if err != nil {
			return err
		}
	}
	return nil
}

// touchTree touches every file below root (itself included) that is on
// root's filesystem, making that mount writable meanwhile when it is
// read-only. A root that is missing is skipped.
func touchTree(root string) (err error) {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%s: %w", root, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err != nil {
		return fmt.Errorf("%s: %w", root, err)
	}
	if sfs.Flags&unix.ST_RDONLY != 0 {
		if err := setMountRO(root, false); err != nil {
			return err
		}
		defer func() {
			if rerr := setMountRO(root, true); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}()
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, root, claimNow, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("touch %s: %w", root, err)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", root, err)
	}
	return touchBelow(fd, root, st.Dev)
}

// touchOwnEtc touches the files of /etc that are the sandbox's own, in a
// default root whose /etc is the gateway's template: those bound over it
// from a tmpfs of the sandbox's (initd's etcFromTemplate), on
// /etc/hostname's device, which are among initd.EtcOwnNames (looked up
// by name, not by a listing of /etc's 150-odd entries). Each is a
// read-only mount of its own, writable for the moment.
func touchOwnEtc() error {
	var root unix.Stat_t
	if err := unix.Stat("/etc/hostname", &root); err != nil {
		return fmt.Errorf("/etc/hostname: %w", err)
	}
	for _, name := range initd.EtcOwnNames() {
		p := filepath.Join("/etc", name)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Dev != root.Dev || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if err := setMountRO(p, false); err != nil {
			return err
		}
		err := unix.UtimesNanoAt(unix.AT_FDCWD, p, claimNow, unix.AT_SYMLINK_NOFOLLOW)
		if rerr := setMountRO(p, true); err == nil {
			err = rerr
		}
		if err != nil {
			return fmt.Errorf("touch %s: %w", p, err)
		}
	}
	return nil
}

// claimNow is utimensat's "now" for both times.
var claimNow = []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}

// touchBelow touches the entries of the directory dirfd (named dir, for
// errors) that are on the device dev, and below them; it consumes dirfd.
// Every step is relative to a descriptor, and none follows a symlink.
func touchBelow(dirfd int, dir string, dev uint64) error {
	f := os.NewFile(uintptr(dirfd), dir)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("%s/%s: %w", dir, name, err)
		}
		if st.Dev != dev { // a mount point: another filesystem
			continue
		}
		if err := unix.UtimesNanoAt(dirfd, name, claimNow, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("touch %s/%s: %w", dir, name, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", dir, name, err)
		}
		if err := touchBelow(sub, filepath.Join(dir, name), dev); err != nil {
			return err
		}
	}
	return nil
}

// setMountRO makes the mount at p read-only, or writable (not its
// submounts).
func setMountRO(p string, ro bool) error {
	attr := &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}
	if ro {
		attr = &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, p, 0, attr); err != nil {
		return fmt.Errorf("make %s read-only=%v: %w", p, ro, err)
	}
	return nil
}
