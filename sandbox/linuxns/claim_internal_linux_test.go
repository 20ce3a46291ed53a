//go:build linux

package linuxns

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLinuxRebindTouchSkipsBoundFiles: the claim's touch of an image
// sandbox's root (touchMirror, run as host root) touches the files the
// build wrote, and never one a mount covers in the root: a host file bound
// over a file of the writable layer keeps its times.
func TestLinuxRebindTouchSkipsBoundFiles(t *testing.T) {
	requireRoot(t, "mounts")
	dir := t.TempDir()
	upper, root, host := filepath.Join(dir, "upper"), filepath.Join(dir, "root"), filepath.Join(dir, "host-file")
	for _, d := range []string{filepath.Join(upper, "etc"), root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(upper, "etc", "own"), filepath.Join(upper, "etc", "bound"), host} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(host, old, old); err != nil {
		t.Fatal(err)
	}
	if err := inPrivateMounts(func() error {
		// The root: a filesystem of its own, as the overlay is, with
		// what the build wrote, and the host file bound over one.
		if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
			return err
		}
		if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
			return err
		}
		for _, f := range []string{"own", "bound"} {
			p := filepath.Join(root, "etc", f)
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			if err := os.Chtimes(p, old, old); err != nil {
				return err
			}
		}
		if err := unix.Mount(host, filepath.Join(root, "etc", "bound"), "", unix.MS_BIND, ""); err != nil {
			return err
		}
		src, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		dst, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(src)
			return err
		}
		defer unix.Close(dst)
		mnt, _, err := mountOf(dst, "")
		if err != nil {
			unix.Close(src)
			return err
		}
		if err := touchMirror(src, dst, "/", mnt); err != nil {
			return err
		}
		fi, err := os.Stat(filepath.Join(root, "etc", "own"))
		if err != nil {
			return err
		}
		if !fi.ModTime().After(old) {
			return errors.New("the build's /etc/own was not touched")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(host)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(old) {
		t.Errorf("the host file bound into the root was touched: mtime %v, want %v", fi.ModTime(), old)
	}
}
