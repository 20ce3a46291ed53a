//go:build linux

package linuxns

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCriuMarksCached: a driver reads a criu binary's marks once per
// binary (criuMarksOf), not at each checkpoint and restore (some 6 MB
// each time): a binary rewritten in place with its size, inode and mtime
// kept is not read again; one whose mtime, size or inode changed is, as
// is each path of its own; a missing one has no marks and is read again
// once there.
func TestCriuMarksCached(t *testing.T) {
	dir := t.TempDir()
	criu := filepath.Join(dir, "criu")
	all := "\x7fELF.." + criuPatchMark + ".." + criuLoUpMark + ".." + criuLazyMark + ".."
	none := "\x7fELF.." + string(make([]byte, len(all)-6))
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	write := func(body string, at time.Time) {
		t.Helper()
		f, err := os.OpenFile(criu, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755) // in place: same inode
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(body); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(criu, at, at); err != nil {
			t.Fatal(err)
		}
	}
	d := &Driver{}
	if m := d.criuMarksOf(criu); m != (criuMarks{}) {
		t.Errorf("missing binary: %+v", m)
	}
	write(all, mtime)
	want := criuMarks{patched: true, loUp: true, lazy: true}
	if m := d.criuMarksOf(criu); m != want {
		t.Errorf("patched binary: %+v, want %+v", m, want)
	}
	// Same path, size, inode and mtime: the cached answer (the file is
	// not read: it no longer holds the marks).
	write(none, mtime)
	if m := d.criuMarksOf(criu); m != want {
		t.Errorf("binary of the same identity read again: %+v", m)
	}
	// Another mtime: read again.
	write(none, mtime.Add(time.Second))
	if m := d.criuMarksOf(criu); m != (criuMarks{}) {
		t.Errorf("binary with a new mtime: %+v, want none", m)
	}
	// Another size, same mtime: read again.
	write(all+"x", mtime.Add(time.Second))
	if m := d.criuMarksOf(criu); m != want {
		t.Errorf("binary with a new size: %+v, want %+v", m, want)
	}
	// Another inode (a new file renamed over it), same size and mtime.
	tmp := criu + ".new"
	if err := os.WriteFile(tmp, []byte(none+"x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, mtime.Add(time.Second), mtime.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, criu); err != nil {
		t.Fatal(err)
	}
	if m := d.criuMarksOf(criu); m != (criuMarks{}) {
		t.Errorf("binary with a new inode: %+v, want none", m)
	}
	// Each driver has its own cache, each path its own entry.
	other := filepath.Join(dir, "criu2")
	if err := os.WriteFile(other, []byte(all), 0o755); err != nil {
		t.Fatal(err)
	}
	if m := d.criuMarksOf(other); m != want {
		t.Errorf("second path: %+v", m)
	}
	if m := (&Driver{}).criuMarksOf(criu); m != (criuMarks{}) {
		t.Errorf("a new driver: %+v", m)
	}
	// A checkpoint asks its driver (a fork's restores, a pause's resume).
	c := &checkpoint{d: d}
	if !c.criuLoUp(other) || c.criuLazy(other) != fileExists("/dev/userfaultfd") {
		t.Errorf("checkpoint: loUp %v lazy %v", c.criuLoUp(other), c.criuLazy(other))
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
