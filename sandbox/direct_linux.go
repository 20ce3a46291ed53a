package sandbox

import (
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// statPath is os.Stat refusing the kernel's magic links (/proc/self/exe,
// /proc/self/fd/N, /dev/fd/N through it...): the caller (the init, the
// gateway) would resolve them to its own process, where bash, or the
// program after its exec, resolves them to itself.
func statPath(p string) (fs.FileInfo, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, &fs.PathError{Op: "openat2", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return f.Stat()
}

// hasACL reports whether p may carry an access ACL (the kernel's
// permission check then reads it, not the mode bits alone): it has one,
// or whether it does cannot be told.
func hasACL(p string) bool {
	_, err := unix.Getxattr(p, "system.posix_acl_access", nil)
	return err != unix.ENODATA && err != unix.EOPNOTSUPP
}
