//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
)

// busyboxLayer makes an unpacked base layer: a static busybox with its
// applets, an /etc/passwd with root alone, and a few files to look at.
func busyboxLayer(t *testing.T) string {
	t.Helper()
	bb := gwtest.RequireTool(t, "busybox")
	dir := t.TempDir()
	for _, d := range []string{"bin", "etc", "opq", "data"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" {
			if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, content := range map[string]string{
		"etc/passwd":     "root:x:0:0:root:/root:/bin/sh\n",
		"etc/os-release": "ID=testimage\n",
		"hidden":         "from the lower layer\n",
		"opq/a":          "lower\n",
		"data/owned":     "owned by 1234\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(filepath.Join(dir, "data", "owned"), 1234, 1234); err != nil {
		t.Fatal(err)
	}
	return dir
}

// whiteoutLayer hides /hidden and makes /opq opaque with a file b.
func whiteoutLayer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mknod(filepath.Join(dir, "hidden"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "opq"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(dir, "opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "opq", "b"), []byte("upper\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLinuxImageRoot(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	base, top := busyboxLayer(t), whiteoutLayer(t)
	img := &sandbox.Image{Name: "test/busybox", Digest: "sha256:test", Layers: []string{base, top},
		Env: []string{"PATH=/bin", "IMAGE_VAR=from-the-image"}, WorkingDir: "/workspace"}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-image", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	for _, c := range []struct{ cmd, want string }{
		{"id -u; id -un; id -gn", "1000\nsandbox\nsandbox\n"},
		{"cat /etc/os-release", "ID=testimage\n"},
		{"echo $IMAGE_VAR $PATH $HOME; pwd", "from-the-image /bin /workspace\n/workspace\n"},
		{"ls /opq", "b\n"},
		{"test -e /hidden && echo visible || echo hidden", "hidden\n"},
		{"stat -c '%u %g' /bin/busybox /data/owned", "0 0\n1234 1234\n"},
		{"hostname; grep -c sandbox /etc/passwd", "image\n1\n"},
		{"touch /workspace/mine && echo ok", "ok\n"},
		{"touch /etc/mine 2>/dev/null || echo denied", "denied\n"},
		{"touch /tmp/t && echo tmp", "tmp\n"},
	} {
		stdout, stderr, exit := runIn(t, sb, c.cmd)
		if stdout != c.want || exit.Code != 0 {
			t.Errorf("%q: %q (stderr %q, exit %+v), want %q", c.cmd, stdout, stderr, exit, c.want)
		}
	}
	// The overlay's options name no host path: the mount table is the
	// sandbox's to read.
	mounts, stderr, _ := runIn(t, sb, "cat /proc/mounts /proc/self/mountinfo")
	if !strings.Contains(mounts, "overlay") || !strings.Contains(mounts, "lowerdir=") {
		t.Errorf("no overlay in the sandbox's mount table: %q (stderr %q)", mounts, stderr)
	}
	if strings.Contains(mounts, dataDir) || strings.Contains(mounts, "/sandboxes/") {
		t.Errorf("the sandbox's mount table shows host paths:\n%s", mounts)
	}
	// The image's layers are untouched by what the session wrote.
	for _, l := range []string{base, top} {
		if _, err := os.Stat(filepath.Join(l, "workspace")); err == nil {
			t.Errorf("the session wrote into layer %s", l)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "hidden")); err != nil {
		t.Errorf("the lower layer lost /hidden: %v", err)
	}
}

func TestLinuxImageWithoutShell(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "README"), []byte("no shell here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-noshell", Image: &sandbox.Image{Name: "test/empty", Layers: []string{empty}}})
	if bad, ok := errors.AsType[*sandbox.BadImageError](err); !ok || !strings.Contains(bad.Reason, "/bin/sh") {
		t.Fatalf("create on an image without /bin/sh: %v, want a BadImageError naming /bin/sh", err)
	}
}

func TestWorkdirRefusesImages(t *testing.T) {
	d, err := openDriver("workdir", sandbox.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Create(context.Background(), sandbox.Spec{ID: "sbx-wd-image", Image: &sandbox.Image{Name: "x", Layers: []string{t.TempDir()}}})
	if !errors.Is(err, sandbox.ErrNoImages) {
		t.Fatalf("workdir create with an image: %v", err)
	}
}
