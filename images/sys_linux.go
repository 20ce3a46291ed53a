package images

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// mknodWhiteout creates name in the directory dir as overlayfs's whiteout:
// a character device 0:0, mode 0, owned by root.
func mknodWhiteout(dir *os.File, name string) error {
	return control(dir, func(fd int) error {
		return unix.Mknodat(fd, name, unix.S_IFCHR, 0)
	})
}

// setXattrs sets xattrs on an open file or directory. A filesystem without
// user xattrs drops them; trusted.* failing is an error.
func setXattrs(f *os.File, x map[string]string) error {
	return control(f, func(fd int) error {
		for k, v := range x {
			err := unix.Fsetxattr(fd, k, []byte(v), 0)
			if errors.Is(err, unix.ENOTSUP) && k != opaqueXattr {
				continue
			}
			if err != nil {
				return &os.PathError{Op: "setxattr " + k, Path: f.Name(), Err: err}
			}
		}
		return nil
	})
}

func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// syncFS flushes the filesystem holding dir (one syncfs for a whole
// unpacked layer instead of an fsync per file).
func syncFS(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	defer d.Close()
	control(d, func(fd int) error { return unix.Syncfs(fd) })
}

func isNotEmpty(err error) bool { return errors.Is(err, unix.ENOTEMPTY) }

// fsSpace is the size and the space free to unprivileged users of the
// filesystem holding dir.
func fsSpace(dir string) (total, free int64, ok bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, false
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), true
}

// allocated is the bytes a file takes on disk (its blocks).
func allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}
