//go:build !linux

package images

import (
	"errors"
	"os"
)

var errNotLinux = errors.New("overlayfs whiteouts and xattrs need Linux")

func mknodWhiteout(dir *os.File, name string) error { return errNotLinux }

func setXattrs(f *os.File, x map[string]string) error {
	if len(x) == 0 {
		return nil
	}
	return errNotLinux
}

func syncFS(dir string) {}

func isNotEmpty(err error) bool { return false }

func fsSpace(dir string) (total, free int64, ok bool) { return 0, 0, false }

func allocated(fi os.FileInfo) int64 { return fi.Size() }
