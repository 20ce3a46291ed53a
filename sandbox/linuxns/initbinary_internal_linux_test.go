//go:build linux

package linuxns

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteInitBinaryKeepsSameFile: a gateway that starts again with the
// same init binary keeps the file its sandboxes bind (the same inode),
// so that a sandbox it adopts can still be checkpointed and restored; a
// different binary replaces it.
func TestWriteInitBinaryKeepsSameFile(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "init")
	if err := os.WriteFile(exe, []byte("the init, version 1"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Driver{root: dir, exe: exe}
	ino := func() uint64 {
		t.Helper()
		st, err := os.Stat(filepath.Join(dir, ".sandgate-init"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o755 {
			t.Fatalf("init binary mode %v", st.Mode())
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}
	if err := d.writeInitBinary(); err != nil {
		t.Fatal(err)
	}
	first := ino()
	if err := d.writeInitBinary(); err != nil {
		t.Fatal(err)
	}
	if ino() != first {
		t.Fatal("the same binary replaced the file that sandboxes bind")
	}
	if err := os.WriteFile(exe, []byte("the init, version 2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := d.writeInitBinary(); err != nil {
		t.Fatal(err)
	}
	if ino() == first {
		t.Fatal("a new binary did not replace the file")
	}
	b, err := os.ReadFile(filepath.Join(dir, ".sandgate-init"))
	if err != nil || string(b) != "the init, version 2" {
		t.Fatalf("init binary after an upgrade: %q %v", b, err)
	}
}
