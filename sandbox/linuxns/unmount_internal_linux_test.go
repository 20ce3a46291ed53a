//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLinuxUnmountUnderReadsItsThreadsMounts: unmountUnder unmounts what
// the calling thread's mount namespace has below dir, even when the
// process's main thread (what /proc/self names) sees other mounts. A
// locked goroutine that ends in another namespace leaves the main thread
// parked there; reading /proc/self/mountinfo then missed every mount made
// since, and deletes left workspaces mounted, their loop devices attached.
func TestLinuxUnmountUnderReadsItsThreadsMounts(t *testing.T) {
	requireRoot(t, "mounts")
	dir := t.TempDir()
	sub := filepath.Join(dir, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := inPrivateMounts(func() error {
		// Mounts only this thread's namespace has: /proc/self (the
		// main thread, in the test's namespace) has neither.
		for _, p := range []string{filepath.Join(dir, "a"), sub} {
			if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
				return err
			}
			if p != sub {
				if err := os.Mkdir(sub, 0o755); err != nil {
					return err
				}
			}
		}
		if err := unmountUnder(dir); err != nil {
			return err
		}
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return err
		}
		for _, p := range []string{filepath.Join(dir, "a"), sub} {
			if mountedAt(string(mi), p) {
				return fmt.Errorf("%s is still mounted in the calling thread's namespace", p)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// mountedAt says whether mountinfo text mi has a mount at point.
func mountedAt(mi, point string) bool {
	for line := range strings.SplitSeq(mi, "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == point {
			return true
		}
	}
	return false
}

// inPrivateMounts runs fn on a locked thread in a private mount namespace
// of its own, and brings the thread back to the test's namespace before
// it ends: the runtime ends a locked thread with its goroutine, but parks
// the main thread instead, and /proc/self is the main thread's (the
// driver's unmountUnder once read a private namespace's stale mounts
// there, and later tests leaked their workspaces).
func inPrivateMounts(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		errc <- func() (err error) {
			home, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(home)
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return err
			}
			defer func() {
				if herr := unix.Setns(home, unix.CLONE_NEWNS); herr != nil {
					err = errors.Join(err, fmt.Errorf("back to the test's mounts: %w", herr))
				}
			}()
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			return fn()
		}()
	}()
	return <-errc
}
