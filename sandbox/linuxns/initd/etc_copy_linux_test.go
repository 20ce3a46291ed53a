//go:build linux

package initd

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The gateway copies the host's /etc into the template as host root: a
// file that others may not read is masked, judged on the file it opened,
// not on an earlier look (here: mode 0644 seen, a 0600 file renamed over
// it since), or host root's secret would be in every sandbox.
func TestCopyEtcFileAsOtherChecksOpenedFile(t *testing.T) {
	dir := t.TempDir()
	h, d := filepath.Join(dir, "host"), filepath.Join(dir, "copy")
	if err := os.WriteFile(h, []byte("host root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := copyEtcFile(h, d, 0o644, true, false); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(d)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 0 || fi.Mode().Perm() != 0 {
		t.Errorf("a 0600 host file copied as other: size %d mode %v, want an empty entry of mode 0", fi.Size(), fi.Mode())
	}
	// A readable one is copied, with its mode as opened.
	if err := os.WriteFile(h+"2", []byte("all\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(h+"2", 0o604); err != nil {
		t.Fatal(err)
	}
	if err := copyEtcFile(h+"2", d+"2", 0o644, true, false); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(d + "2"); err != nil || string(b) != "all\n" {
		t.Errorf("a readable host file copied: %q, %v", b, err)
	}
	if fi, err := os.Stat(d + "2"); err != nil || fi.Mode().Perm() != 0o604 {
		t.Errorf("copied with mode %v (%v), want the opened file's, 0604", fi.Mode(), err)
	}
}

// A directory holding secrets that others may not list (here /etc/ssh of
// mode 0700) is masked in the template, not copied with the names of its
// entries: the init, no owner of the host's files, could not list it.
func TestCopyEtcDirAsOtherMasksUnlistable(t *testing.T) {
	host, dst := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(host, "ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "ssh", "ssh_config"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := copyEtcDirNoting(host, dst, "", &etcCopy{bind: treeBind, asOther: true}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "ssh"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0 {
		t.Errorf("a host directory of mode 0700 in the template: mode %v, want a masked one, 0", fi.Mode())
	}
	if _, err := os.Lstat(filepath.Join(dst, "ssh", "ssh_config")); err == nil {
		t.Error("the template lists an entry of a host directory that others may not list")
	}
}

// treeBind, which binds as host root into the /etc template, does not
// follow a symlink: a host entry replaced by one (to a directory others
// may not enter) after the look binds nothing of what it names.
func TestTreeBindNoFollow(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	host, dst := t.TempDir(), t.TempDir()
	secret := filepath.Join(host, "private")
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "key"), []byte("k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(host, "conf.d")); err != nil {
		t.Fatal(err)
	}
	err := treeBind(filepath.Join(host, "conf.d"), dst)
	if err == nil {
		defer unix.Unmount(dst, unix.MNT_DETACH)
	}
	t.Logf("treeBind of a symlink: %v", err)
	if _, serr := os.Stat(filepath.Join(dst, "key")); serr == nil {
		t.Errorf("treeBind of a symlink bound what it names (err %v)", err)
	}
}

// A directory of the host's /etc that the copy descends into (one holding
// secrets) is not followed when it has become a symlink since it was
// looked at: nothing of what it names is listed or copied.
func TestCopyEtcDirNoFollow(t *testing.T) {
	host, dst := t.TempDir(), t.TempDir()
	elsewhere := filepath.Join(host, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(elsewhere, "notes"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(host, "ssl")); err != nil {
		t.Fatal(err)
	}
	err := copyEtcDirNoting(filepath.Join(host, "ssl"), dst, "ssl", &etcCopy{bind: treeBind, asOther: true})
	if err == nil {
		t.Error("copied a directory that is a symlink")
	}
	if _, serr := os.Lstat(filepath.Join(dst, "notes")); serr == nil {
		t.Error("copied what a symlinked directory names")
	}
}

// The gateway's copy of all of the host's /etc (BuildEtcDir) goes into
// every host directory, some of which other accounts may write: it opens
// no path with a symlink in it (a directory swapped for a symlink to one
// that only root may list), lists no directory that others may not, does
// not block on a FIFO swapped in for a file, gives no copy group or
// others' write permission, and stops at its budget.
func TestCopyEtcStrict(t *testing.T) {
	dir := t.TempDir()
	hidden := filepath.Join(dir, "hidden")
	if err := os.Mkdir(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hidden, "f"), []byte("behind a link\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(hidden, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readDirStrict(link); err == nil {
		t.Error("readDirStrict listed a directory through a symlink")
	}
	if err := os.Chmod(hidden, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := readDirStrict(hidden); err == nil {
		t.Error("readDirStrict listed a directory others may not list")
	}
	if err := os.Chmod(hidden, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	masked := func(p string) {
		t.Helper()
		if fi, err := os.Lstat(p); err != nil || fi.Size() != 0 || fi.Mode() != 0 {
			t.Errorf("%s: %v %v, want an empty file of mode 0", p, fi, err)
		}
	}
	if err := copyEtcFile(filepath.Join(link, "f"), filepath.Join(out, "via-link"), 0o644, true, true); err != nil {
		t.Fatal(err)
	}
	masked(filepath.Join(out, "via-link"))
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := copyEtcFile(fifo, filepath.Join(out, "fifo"), 0o644, true, true); err != nil {
		t.Fatal(err)
	}
	masked(filepath.Join(out, "fifo"))
	w := filepath.Join(dir, "writable")
	if err := os.WriteFile(w, []byte("x\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(w, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := copyEtcFile(w, filepath.Join(out, "writable"), 0o666, true, true); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(out, "writable")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("a 0666 host file copied strictly: %v %v, want mode 0644", fi, err)
	}
	c := &etcCopy{copyDirs: true, left: etcBudget{entries: 2, bytes: 10}}
	if err := c.take(4); err != nil {
		t.Fatal(err)
	}
	if err := c.take(7); err == nil {
		t.Error("the copy went past its budget of bytes")
	}
	c = &etcCopy{copyDirs: true, left: etcBudget{entries: 1, bytes: 10}}
	if err := c.take(0); err != nil {
		t.Fatal(err)
	}
	if err := c.take(0); err == nil {
		t.Error("the copy went past its budget of entries")
	}
}
