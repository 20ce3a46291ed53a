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

	"github.com/sandgate/sandgate/sandbox"
)

// The default root's /etc comes from the gateway's template (one clone
// per create, the init adds the files that name the sandbox), yet it is
// what the init built before: each sandbox has its own hostname and
// machine-id (the sandbox root's files, one link each), /etc is
// read-only, nothing of the init's own files is left in /, and a change of a host /etc file (new, rewritten in place,
// removed) shows in the sandboxes created after it, as it did when each
// init copied the host's /etc.
func TestLinuxEtcTemplateFollowsHost(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	d.SetEtcCheck(time.Nanosecond) // every create checks the host
	host := filepath.Join("/etc", fmt.Sprintf("sandgate-etc-test-%d", os.Getpid()))
	t.Cleanup(func() { os.Remove(host) })
	n := 0
	look := func(want string) string {
		t.Helper()
		n++
		id := fmt.Sprintf("sbx-etc-%d", n)
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := sb.Destroy(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		out, _, e := runIn(t, sb, "cat "+host+" 2>/dev/null || echo absent; cat /etc/hostname /etc/machine-id; ls -a / | grep -c '^\\.etc-' ; touch /etc/x 2>&1 | grep -c 'Read-only'; stat -c '%h %U %a' /etc/hostname")
		if e.Code != 0 {
			t.Fatalf("%s: exit %+v: %s", id, e, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 6 {
			t.Fatalf("%s: %q", id, out)
		}
		if lines[0] != want {
			t.Errorf("%s sees %s as %q, want %q", id, host, lines[0], want)
		}
		if lines[1] != sandbox.ShortID(id) {
			t.Errorf("%s: /etc/hostname %q, want %q", id, lines[1], sandbox.ShortID(id))
		}
		if lines[3] != "0" {
			t.Errorf("%s: the init's own /etc files are left in /: %q", id, out)
		}
		if lines[4] != "1" {
			t.Errorf("%s: /etc is not read-only: %q", id, out)
		}
		if lines[5] != "1 root 644" {
			t.Errorf("%s: /etc/hostname has links, owner and mode %q, want the sandbox root's file with its one link", id, lines[5])
		}
		return lines[2] // machine-id
	}
	m1 := look("absent")
	if err := os.WriteFile(host, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m2 := look("one")
	if m1 == m2 || len(m1) != 32 {
		t.Errorf("machine-ids %q and %q: want each sandbox's own", m1, m2)
	}
	// Rewritten in place: the same inode, a new mtime.
	time.Sleep(10 * time.Millisecond)
	f, err := os.OpenFile(host, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	look("two")
	if err := os.Remove(host); err != nil {
		t.Fatal(err)
	}
	look("absent")

	// A host file that others may not read is an empty entry of mode 0,
	// as when the init (no owner of the host's files) copied /etc: the
	// gateway, host root, copies no more than it could.
	secret := host + "-private"
	t.Cleanup(func() { os.Remove(secret) })
	if err := os.WriteFile(secret, []byte("host only\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-etc-private"})
	if err != nil {
		t.Fatal(err)
	}
	out, _, _ := runIn(t, sb, "stat -c '%s %a' "+secret)
	if err := sb.Destroy(context.Background()); err != nil {
		t.Error(err)
	}
	if out != "0 0\n" {
		t.Errorf("a host file of mode 0640 in the sandbox's /etc: %q, want an empty entry of mode 0", out)
	}
	checkNoLeaks(t, dataDir)
}

// Without the template (a kernel before 6.15), each init builds its /etc
// from the host's, as before: its files the sandbox root's, read-only,
// with a session CA's bundle.
func TestLinuxEtcWithoutTemplate(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	d.NoEtcTemplate()
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-etc-own", TrustPEM: []byte(testPEM)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
		checkNoLeaks(t, dataDir)
	}()
	out, stderr, e := runIn(t, sb, "stat -c '%U %a' /etc /etc/passwd; cat /etc/hostname; grep -c 'BEGIN CERTIFICATE' "+sandbox.TrustBundle+" >/dev/null && echo trusted; touch /etc/x 2>/dev/null || echo ro")
	want := "root 755\nroot 644\n" + sandbox.ShortID("sbx-etc-own") + "\ntrusted\nro\n"
	if e.Code != 0 || out != want {
		t.Errorf("/etc built by the init: %q (%q, exit %+v), want %q", out, stderr, e, want)
	}
}

// The template's files are the sandbox root's, as when each init built its
// /etc (the gateway, host root, wrote them: without the copy's idmap the
// sandbox sees them as nobody's, which tools that want root's config files
// refuse), and the tmpfs under the sandbox's /etc, every tenant's, is
// read-only itself, not only the sandbox's mount of it.
func TestLinuxEtcTemplateOwnerAndReadOnly(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-etc-owner"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
		checkNoLeaks(t, dataDir)
	}()
	out, stderr, e := runIn(t, sb, "stat -c '%U:%G %a' /etc /etc/passwd /etc/shadow /etc/hostname; awk '$5 == \"/etc\" { print $NF }' /proc/self/mountinfo | cut -d, -f1")
	want := "root:root 755\nroot:root 644\nroot:root 0\nroot:root 644\nro\n"
	if e.Code != 0 || out != want {
		t.Errorf("/etc from the template: %q (%q, exit %+v), want %q", out, stderr, e, want)
	}
}
