//go:build linux

package workspace

import (
	"errors"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ctimeIno are a file's change time (which no user can set) and inode.
func ctimeIno(info fs.FileInfo) (int64, uint64) {
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		return sys.Ctim.Nano(), sys.Ino
	}
	return 0, 0
}

// inodeOf is the file's (dev, inode), its number of names and the bytes
// its allocated blocks hold (ok false: unknown, then it has one name and
// is not sparse).
func inodeOf(info fs.FileInfo) (id inode, nlink uint64, allocated int64, ok bool) {
	sys, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return inode{}, 1, info.Size(), false
	}
	// Nlink is uint32 on arm64 (uint64 on amd64).
	return inode{dev: sys.Dev, ino: sys.Ino}, uint64(sys.Nlink), sys.Blocks * 512, true
}

// dataExtents lists the data regions of f, of size bytes, by
// SEEK_DATA/SEEK_HOLE: [offset, length] pairs in order. ok false: the
// filesystem cannot tell (the whole file is then data).
func dataExtents(f *os.File, size int64) (ext [][2]int64, ok bool, err error) {
	// A whole file is read from its start: whatever the seeks did.
	defer func() {
		if _, serr := f.Seek(0, 0); serr != nil && err == nil {
			ext, ok, err = nil, false, serr
		}
	}()
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole up to the end
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if start >= size {
			break
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, false, err
		}
		end = min(end, size)
		if end <= start {
			break
		}
		ext = appendExtent(ext, start, end-start)
		off = end
	}
	return ext, true, nil
}
