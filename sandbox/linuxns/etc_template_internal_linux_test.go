//go:build linux

package linuxns

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEtcTemplateTmpfsReadOnly: the /etc template is every tenant's, so
// not only each mount of it is read-only but its tmpfs: a copy whose
// mount flag is cleared (what the holder of a mount may do: a sandbox's
// init owns its mount namespace, and its copy is not locked) still
// cannot write a byte of it.
func TestEtcTemplateTmpfsReadOnly(t *testing.T) {
	requireRoot(t, "the /etc template's mounts")
	tmpl := newEtcTemplate(slog.New(slog.DiscardHandler))
	tmpl.prepare()
	defer tmpl.close()
	if tmpl.fd < 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no /etc template: %v", tmpl.failed)
		}
		t.Skipf("no /etc template: %v", tmpl.failed)
	}
	c, err := unix.OpenTree(tmpl.fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(c)
	if err := unix.MountSetattr(c, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
		t.Fatal(err)
	}
	for _, try := range []func() error{
		func() error {
			return os.WriteFile(filepath.Join("/proc/self/fd", strconv.Itoa(c), "passwd"), []byte("x::0:0::/:/bin/sh\n"), 0o644)
		},
		func() error { return os.WriteFile(filepath.Join("/proc/self/fd", strconv.Itoa(c), "new"), nil, 0o644) },
		func() error { return os.Chmod(filepath.Join("/proc/self/fd", strconv.Itoa(c), "hostname"), 0o666) },
	} {
		if err := try(); !errors.Is(err, unix.EROFS) {
			t.Errorf("a write to the template through a copy made writable: %v, want EROFS", err)
		}
	}
}
