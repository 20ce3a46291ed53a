//go:build linux

package linuxns_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// tmpfsTree fills the sandbox's /tmp and /dev/shm (tmpfs mounts, which
// CRIU archives at a dump and unpacks at a restore: .ci/criu-patches'
// 0007 without tar) with what an archive can hold: nested directories,
// modes 0600, 04755 and 02755 on files of the sandbox user, a 1777
// directory, a 0500 one with contents, symlinks (relative, absolute,
// dangling), hard links (two in one directory, one across), names over
// 100 bytes (a file, a symlink's target, a hard link's, a directory and
// a file under it), an empty file, a file over 64 KiB, and every mtime,
// the directories' too, in the past (whole seconds: an archive's; /tmp
// and /dev/shm, root's, keep theirs).
const tmpfsTree = `set -e
cd /tmp
mkdir -p a/b/c sticky ro/in
echo hi > a/b/c/f; chmod 0600 a/b/c/f
cp /bin/true suid; chmod 04755 suid
cp /bin/true sgid; chmod 02755 sgid
chmod 1777 sticky; echo s > sticky/s
echo in > ro/in/x
: > empty
head -c 70000 /dev/zero | tr '\0' z > big
ln -s a/b/c/f rel; ln -s /etc/hostname abs; ln -s nowhere dangling
ln a/b/c/f hard; ln a/b/c/f a/b/hard2
long=$(printf 'n%.0s' $(seq 150)); echo long > $long
ln -s $long longtarget-link; ln $long a/$(printf 'h%.0s' $(seq 120))
d=$(printf 'p%.0s' $(seq 90))/$(printf 'q%.0s' $(seq 90)); mkdir -p $d; echo deep > $d/$(printf 'r%.0s' $(seq 80))
echo shm > /dev/shm/seg; chmod 0640 /dev/shm/seg
find /tmp /dev/shm -mindepth 1 -exec touch -h -d '2001-02-03 04:05:06' {} +
touch -d '1999-12-31 23:59:58' a/b/c/f; touch -h -d '1990-05-05 05:05:05' abs
chmod 0500 ro
touch -d '2002-02-02 02:02:02' ro /tmp/a
`

// tmpfsList is every entry of /tmp and /dev/shm as stat sees it: name,
// mode, owner, group, size, mtime (seconds), links, symlink target.
const tmpfsList = `find /tmp /dev/shm -exec stat -c '%n %f %u %g %s %Y %h %N' {} + | sort`

// criuTmpfsMark is a line patch 0007 of .ci/criu-patches adds to criu's
// log: a criu holding it restores tmpfs contents without running tar.
const criuTmpfsMark = "entries restored in %s without tar"

// tmpfsDriver is a checkpointing driver on the criu of the tests
// (criuForTest), and whether that criu holds 0007 (an error under CI=true
// without it); with trace, tar's runs are logged (tarTrace) to the
// returned file.
func tmpfsDriver(t *testing.T, trace bool) (d *linuxns.Driver, inProcess bool, tars string) {
	t.Helper()
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	criu := criuForTest(t)
	bin, err := os.ReadFile(criu)
	if err != nil {
		t.Fatal(err)
	}
	inProcess = bytes.Contains(bin, []byte(criuTmpfsMark))
	if !inProcess && os.Getenv("CI") == "true" {
		t.Errorf("%s lacks %q: .ci/criu-patches/0007 not applied", criu, criuTmpfsMark)
	}
	if trace {
		tars = tarTrace(t)
	}
	d, err = linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	return d, inProcess, tars
}

// tarTrace puts a tar first in $PATH for the test (criu runs tar by
// name) that logs each run's arguments, then runs the real one; it
// returns the log. The tar runs as the sandbox's root, a host uid with
// no rights: the directories are searchable, the log writable by all.
func tarTrace(t *testing.T) string {
	t.Helper()
	real, err := exec.LookPath("tar")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for p := dir; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(dir, "tar.log")
	if err := os.WriteFile(log, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(log, 0o666); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"$*\" >>" + log + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "tar"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return log
}

// TestLinuxForkTmpfsContents: a fork's and a resumed session's /tmp and
// /dev/shm are the source's, entry by entry (mode with setuid, setgid
// and sticky bits, owner, size, mtime, link count, symlink target), and
// their files hold the source's bytes. With the criu .ci/build-criu
// builds (0007), no restore runs tar, and the dumps do (the archives
// the restores read are tar's).
func TestLinuxForkTmpfsContents(t *testing.T) {
	d, inProcess, tars := tmpfsDriver(t, true)
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-tmpfs-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	if _, stderr, e := runIn(t, src, tmpfsTree); e.Code != 0 {
		t.Fatalf("fill /tmp: %+v %s", e, stderr)
	}
	want := mustRun(t, src, tmpfsList)
	sums := `cd /tmp && find . -type f -exec md5sum {} + | sort`
	wantSums := mustRun(t, src, sums)
	for _, line := range []string{" 89ed 1000 1000 ", " 85ed 1000 1000 ", " 43ff 0 0 ", " 4140 1000 1000 ", "/tmp/hard 8180 1000 1000 3 ",
		"'/tmp/abs' -> '/etc/hostname'", "/tmp/a/b/c/f 8180 1000 1000 3 946684798 "} {
		if !strings.Contains(want, line) {
			t.Fatalf("the source's /tmp lacks %q (the test's tree is not what it says):\n%s", line, want)
		}
	}
	forks := forkAll(ctx, t, src, "sbx-tmpfs-a", "sbx-tmpfs-b")
	for i, f := range forks {
		if got := mustRun(t, f, tmpfsList); got != want {
			t.Errorf("fork %d's /tmp and /dev/shm differ from the source's:\n%s", i, lineDiff(want, got))
		}
		if got := mustRun(t, f, sums); got != wantSums {
			t.Errorf("fork %d's files' contents differ:\n%s", i, lineDiff(wantSums, got))
		}
	}
	// A fork's tree is archived and unpacked again: a fork of a fork.
	ff := forkAll(ctx, t, forks[0], "sbx-tmpfs-a-a")[0]
	if got := mustRun(t, ff, tmpfsList); got != want {
		t.Errorf("a fork of a fork's /tmp and /dev/shm differ from the source's:\n%s", lineDiff(want, got))
	}
	// A pause by checkpoint and a resume in place.
	pa := src.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, src, tmpfsList); got != want {
		t.Errorf("the resumed source's /tmp and /dev/shm differ from before its pause:\n%s", lineDiff(want, got))
	}
	runs, err := os.ReadFile(tars)
	if err != nil {
		t.Fatal(err)
	}
	created, extracted := strings.Count(string(runs), "--create"), strings.Count(string(runs), "--extract")
	t.Logf("tar runs: %d --create, %d --extract (in-process restore: %v)", created, extracted, inProcess)
	// 3 dumps (2 forks, a pause) of 4 tmpfs mounts each.
	if created < 12 {
		t.Errorf("%d tar --create runs, want one per tmpfs per dump: the trace sees no tar\n%s", created, runs)
	}
	if inProcess && extracted != 0 {
		t.Errorf("criu with 0007 ran tar --extract %d times:\n%s", extracted, runs)
	}
}

// lineDiff lists the lines only one of a and b has.
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// tmpfsMarker names a file the tests put in a sandbox's /tmp, to find
// /tmp's archive among a checkpoint's images.
const tmpfsMarker = "sandgate-tmpfs-marker"

// tmpfsImage is the image of the checkpoint in dir that archives the
// sandbox's /tmp (the one holding tmpfsMarker).
func tmpfsImage(t *testing.T, dir string) string {
	t.Helper()
	imgs, _ := filepath.Glob(filepath.Join(dir, "tmpfs-*.img"))
	var found []string
	for _, p := range imgs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(tmpfsMarker)) {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("/tmp's archive among %v: %v", imgs, found)
	}
	return found[0]
}

type tarEntry struct {
	name, link string
	typ        byte
	body       string
}

func writeTar(t *testing.T, path string, entries []tarEntry) {
	t.Helper()
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Format: tar.FormatGNU}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLinuxForkTamperedTmpfsImage: a checkpoint's archive of /tmp
// tampered with to write outside the sandbox's /tmp (through a symlink it
// makes to a host directory, with "..", with an absolute name, through a
// hard link to a host file) writes nothing on the host: the in-process
// extraction (0007) refuses the write through a symlink and fails the
// restore, and leaves the others to tar, which refuses ".." and strips a
// leading "/". The archive as it was still restores. (A criu without
// 0007 runs tar for all: nothing is written outside either, but its
// failures do not say what refused them.)
func TestLinuxForkTamperedTmpfsImage(t *testing.T) {
	d, inProcess, _ := tmpfsDriver(t, false)
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-tmpfs-evil"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	mustRun(t, src, "echo x > /tmp/"+tmpfsMarker)
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	img := tmpfsImage(t, linuxns.CheckpointImages(ck))
	orig, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if len(orig) < 512 || string(orig[257:263]) != "ustar " {
		t.Fatalf("/tmp's archive is not a plain GNU tar (0004): % x", orig[:min(len(orig), 300)])
	}
	// A host directory the restore must not write in. The restore runs
	// as the sandbox's root, a host uid with no rights: were host 0700
	// root's (t.TempDir's), a restore that followed the archive's symlink
	// out would be refused by the permissions, not by the extraction, and
	// this test could not see it. So host is writable by all, its parents
	// searchable (as tarTrace's).
	host := t.TempDir()
	for p := host; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(host, 0o777); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(host, "victim")
	if err := os.WriteFile(victim, []byte("host's\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(victim, 0o666); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel("/", host)
	if err != nil {
		t.Fatal(err)
	}
	dotdot := strings.Repeat("../", 40) + rel + "/pwned"
	for i, tc := range []struct {
		name    string
		entries []tarEntry
		// failWith, when set, is what the failed restore's error says:
		// the in-process extraction refused the entry (openat2's ELOOP,
		// RESOLVE_NO_SYMLINKS: not any failure to open the parent).
		failWith string
	}{
		{"symlink, then a file through it", []tarEntry{{name: "./", typ: tar.TypeDir}, {name: "./esc", link: host, typ: tar.TypeSymlink}, {name: "./esc/pwned", typ: tar.TypeReg, body: "pwned\n"}}, "beneath the mount: Too many levels of symbolic links"},
		{"symlink, then a directory through it", []tarEntry{{name: "./esc", link: host, typ: tar.TypeSymlink}, {name: "./esc/pwned/", typ: tar.TypeDir}}, "beneath the mount: Too many levels of symbolic links"},
		{"symlink, then a hard link through it", []tarEntry{{name: "./esc", link: host, typ: tar.TypeSymlink}, {name: "./t", typ: tar.TypeReg}, {name: "./esc/pwned", link: "./t", typ: tar.TypeLink}}, "beneath the mount: Too many levels of symbolic links"},
		{"hard link to a host file through a symlink", []tarEntry{{name: "./esc", link: host, typ: tar.TypeSymlink}, {name: "./pwned", link: "./esc/victim", typ: tar.TypeLink}}, "beneath the mount: Too many levels of symbolic links"},
		{"dot-dot", []tarEntry{{name: dotdot, typ: tar.TypeReg, body: "pwned\n"}}, ""},
		{"absolute", []tarEntry{{name: filepath.Join(host, "pwned"), typ: tar.TypeReg, body: "pwned\n"}}, ""},
		{"hard link with dot-dot", []tarEntry{{name: "./pwned", link: strings.Repeat("../", 40) + rel + "/victim", typ: tar.TypeLink}}, ""},
	} {
		writeTar(t, img, tc.entries)
		f, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-tmpfs-evil-" + string(rune('a'+i))})
		if err == nil {
			_ = f.Destroy(ctx)
		}
		if tc.failWith != "" && inProcess && (err == nil || !strings.Contains(err.Error(), tc.failWith)) {
			t.Errorf("%s: restore: %v, want a failure saying %q", tc.name, err, tc.failWith)
		}
		if _, err := os.Lstat(filepath.Join(host, "pwned")); err == nil {
			t.Errorf("%s: the restore wrote %s on the host", tc.name, filepath.Join(host, "pwned"))
			_ = os.RemoveAll(filepath.Join(host, "pwned")) // the next case's own
		}
		var st syscall.Stat_t
		if err := syscall.Stat(victim, &st); err != nil || st.Nlink != 1 {
			t.Errorf("%s: the host's %s: %v, %d links", tc.name, victim, err, st.Nlink)
		}
		if b, _ := os.ReadFile(victim); string(b) != "host's\n" {
			t.Errorf("%s: the host's %s now holds %q", tc.name, victim, b)
		}
	}
	if err := os.WriteFile(img, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-tmpfs-evil-ok"})
	if err != nil {
		t.Fatalf("restore from the archive as it was: %v", err)
	}
	defer f.Destroy(ctx)
	if out := mustRun(t, f, "cat /tmp/"+tmpfsMarker); out != "x\n" {
		t.Errorf("the fork's /tmp/%s: %q", tmpfsMarker, out)
	}
}

// TestLinuxForkTmpfsLeftToTar: a tmpfs whose archive holds what the
// in-process extraction does not take (a sparse file, GNU tar's 'S'; a
// FIFO) is restored by tar, as before 0007, and only that one: the fork's
// /tmp is the source's, and the other tmpfs mounts are unpacked without
// tar.
func TestLinuxForkTmpfsLeftToTar(t *testing.T) {
	d, inProcess, tars := tmpfsDriver(t, true)
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-tmpfs-tar"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	mustRun(t, src, `cd /tmp && truncate -s 8M sparse && echo end >> sparse && mkfifo -m 0620 fifo && mkdir d && echo f > d/f &&
find /tmp -mindepth 1 -exec touch -h -d '2001-02-03 04:05:06' {} +`)
	list := `find /tmp -exec stat -c '%n %f %u %g %s %b %Y %h %N' {} + | sort; md5sum /tmp/sparse /tmp/d/f`
	want := mustRun(t, src, list)
	f := forkAll(ctx, t, src, "sbx-tmpfs-tar-a")[0]
	if got := mustRun(t, f, list); got != want {
		t.Errorf("the fork's /tmp differs from the source's:\n%s", lineDiff(want, got))
	}
	runs, err := os.ReadFile(tars)
	if err != nil {
		t.Fatal(err)
	}
	extracted := strings.Count(string(runs), "--extract")
	t.Logf("tar runs: %d --create, %d --extract (in-process restore: %v)", strings.Count(string(runs), "--create"), extracted, inProcess)
	if inProcess && extracted != 1 {
		t.Errorf("tar --extract ran %d times, want once (/tmp's archive only):\n%s", extracted, runs)
	}
}
