//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// A checkpointable default root's /etc is one read-only bind of the
// gateway's /etc dir (the host's /etc copied, not a bind per host
// directory), with the sandbox's own hostname, hosts, machine-id and
// resolv.conf bound over it from a small tmpfs of its own: a handful of
// mounts where there were some 80, each dumped and restored by CRIU. It
// shows what the host's /etc held when the dir was built, masks what
// others may not read and the secrets, follows a change of the host's in
// the sandboxes created after it (not in those made before), and a fork
// and a resume from a pause have their source's.
func TestLinuxCheckpointEtcDir(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	// The data dir on a shared mount, as / is on a systemd host: nothing
	// a sandbox mounts on its /etc may show on the host.
	if err := unix.Mount(dataDir, dataDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dataDir, unix.MNT_DETACH) })
	if err := unix.Mount("", dataDir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	d.SetEtcCheck(time.Nanosecond) // every create checks the host
	host := filepath.Join("/etc", fmt.Sprintf("sandgate-etcdir-test-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(host) })
	if err := os.MkdirAll(filepath.Join(host, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "sub", "f"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "private"), []byte("host only\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	look := "awk '$5 ~ \"^/etc\"' /proc/self/mountinfo | wc -l; cat /etc/hostname " + host + "/sub/f; stat -c '%s %a' " +
		host + "/private /etc/shadow; grep -c '^sandbox:x:1000:' /etc/passwd; touch /etc/x " + host + "/sub/x 2>/dev/null || echo ro; cat /etc/machine-id"
	check := func(sb sandbox.Sandbox, what, hostname, f string) string {
		t.Helper()
		out := strings.Split(strings.TrimSpace(mustRun(t, sb, look)), "\n")
		if len(out) != 8 {
			t.Fatalf("%s: %q", what, out)
		}
		// /etc, and hostname, hosts, machine-id, resolv.conf over it.
		if out[0] != "5" {
			t.Errorf("%s: %s mounts at or below /etc, want 5", what, out[0])
		}
		if out[1] != hostname || out[2] != f {
			t.Errorf("%s: hostname %q and the host dir's file %q, want %q and %q", what, out[1], out[2], hostname, f)
		}
		if out[3] != "0 0" || out[4] != "0 0" {
			t.Errorf("%s: a host file of mode 0640 %q and /etc/shadow %q, want both empty entries of mode 0", what, out[3], out[4])
		}
		if out[5] != "1" || out[6] != "ro" {
			t.Errorf("%s: the sandbox's passwd (%s) and a read-only /etc (%s)", what, out[5], out[6])
		}
		if len(out[7]) != 32 {
			t.Errorf("%s: machine-id %q", what, out[7])
		}
		return out[7]
	}
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-etcdir-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	srcID := check(src, "source", sandbox.ShortID("sbx-etcdir-src"), "one")
	hostMounts := func() []string {
		mi, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		var under []string
		for _, line := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], filepath.Join(dataDir, "sandboxes", ".etc")) {
				under = append(under, f[4])
			}
		}
		return under
	}
	if m := hostMounts(); len(m) != 0 {
		t.Errorf("the sandbox's mounts on its /etc show on the host: %v", m)
	}

	// A change of the host's /etc shows in the sandboxes created after it.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(host, "sub", "f"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other, err := d.Create(ctx, sandbox.Spec{ID: "sbx-etcdir-new"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Destroy(ctx) })
	if id := check(other, "a sandbox created after the change", sandbox.ShortID("sbx-etcdir-new"), "two"); id == srcID {
		t.Errorf("two sandboxes share the machine-id %s", id)
	}
	if dirs, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", ".etc", "g-*")); len(dirs) != 2 {
		t.Errorf("/etc dirs %v, want the source's and the new one", dirs)
	}
	check(src, "the source after the change", sandbox.ShortID("sbx-etcdir-src"), "one")

	// A fork, and a resume from a pause by checkpoint, have the source's.
	for i, f := range forkAll(ctx, t, src, "sbx-etcdir-a", "sbx-etcdir-b") {
		if id := check(f, fmt.Sprintf("fork %d", i), sandbox.ShortID("sbx-etcdir-src"), "one"); id != srcID {
			t.Errorf("fork %d: machine-id %s, want the source's %s", i, id, srcID)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(d.RestoreStagesDir(), "*")); len(left) != 0 {
		t.Errorf("restore stages left: %v", left)
	}
	pa := src.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	check(src, "the resumed source", sandbox.ShortID("sbx-etcdir-src"), "one")

	// A session CA: its bundle, and the store, bound over the dir's.
	tr, err := d.Create(ctx, sandbox.Spec{ID: "sbx-etcdir-trust", TrustPEM: []byte(testPEM)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Destroy(ctx) })
	if out := mustRun(t, tr, "grep -c 'c2FuZGdhdGUgdGVzdA==' "+sandbox.TrustBundle+"; awk '$5 ~ \"^/etc\"' /proc/self/mountinfo | wc -l"); out != "1\n7\n" {
		t.Errorf("a session CA: %q, want its certificate in the bundle, and 7 mounts at or below /etc (the bundle and the store bound too)", out)
	}
}
