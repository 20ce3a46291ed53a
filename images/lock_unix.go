//go:build unix

package images

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fileLock is a flock(2) lock on a file of its own. Each lock opens the
// file anew, so two locks in one process exclude each other as two
// processes' locks do.
type fileLock struct{ f *os.File }

func lockFile(path string, exclusive, wait bool) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	if !wait {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, errLocked
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &fileLock{f: f}, nil
}

// unlock releases the lock; a second unlock does nothing.
func (l *fileLock) unlock() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the last descriptor releases the lock
		l.f = nil
	}
}
