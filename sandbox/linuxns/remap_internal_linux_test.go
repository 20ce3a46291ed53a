//go:build linux

package linuxns

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// usernsImage is a CRIU userns image of one UsernsEntry whose uid and gid
// maps are the one extent (first, lower, count).
func usernsImage(first, lower, count uint64) []byte {
	var ext []byte
	ext = protowire.AppendTag(ext, 1, protowire.VarintType)
	ext = protowire.AppendVarint(ext, first)
	ext = protowire.AppendTag(ext, 2, protowire.VarintType)
	ext = protowire.AppendVarint(ext, lower)
	ext = protowire.AppendTag(ext, 3, protowire.VarintType)
	ext = protowire.AppendVarint(ext, count)
	var entry []byte
	for _, num := range []protowire.Number{1, 2} {
		entry = protowire.AppendTag(entry, num, protowire.BytesType)
		entry = protowire.AppendBytes(entry, ext)
	}
	b := make([]byte, 8) // the two magic words
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	return append(b, entry...)
}

// A restore maps the image's user namespace onto the sandbox's uid range
// (remapUserns): an image whose extent starts in the range but runs past
// its end (a tampered one) would map host ids of other sandboxes, or
// beyond, into the restored sandbox. It is refused; the extent a fresh
// sandbox has is remapped.
func TestRemapUsernsRefusesOverrun(t *testing.T) {
	const from, to = 200 * idRange, 300 * idRange
	out, err := remapUserns(usernsImage(0, from, idRange), from, to)
	if err != nil {
		t.Fatalf("a fresh sandbox's map: %v", err)
	}
	if want := usernsImage(0, to, idRange); string(out) != string(want) {
		t.Fatalf("remapped to %x, want %x", out, want)
	}
	for _, tc := range []struct {
		name               string
		first, lower, size uint64
	}{
		{"count past the range", 0, from, 2 * idRange},
		{"tail past the range", 0, from + idRange - 1, 2},
		{"ids inside past the range", idRange - 1, from, 2},
		{"the whole host", 0, from, 1 << 32},
	} {
		if _, err := remapUserns(usernsImage(tc.first, tc.lower, tc.size), from, to); err == nil {
			t.Errorf("%s: remapped, want refused", tc.name)
		}
	}
}

// A fork of a session paused by checkpoint is restored from hard links of
// the pause's images (pausedCheckpoint), while the session itself may be
// resumed from them: one restore ending must not make the images 0600
// under the other's criu, and once both end every image is 0600 again.
func TestSharedImagesReadable(t *testing.T) {
	d := &Driver{}
	pauseDir, forkDir := t.TempDir(), t.TempDir()
	for _, name := range []string{"pages-1.img", "core-1.img"} {
		if err := os.WriteFile(filepath.Join(pauseDir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(pauseDir, name), filepath.Join(forkDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(forkDir, "workspace.img"), []byte("w"), 0o600); err != nil {
		t.Fatal(err)
	}
	mode := func(dir, name string) os.FileMode {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	pause := &checkpoint{d: d, dir: pauseDir, shared: pauseDir}
	fork := &checkpoint{d: d, dir: forkDir, shared: pauseDir}
	if err := fork.readable(true); err != nil {
		t.Fatal(err)
	}
	if err := pause.readable(true); err != nil {
		t.Fatal(err)
	}
	if err := pause.readable(false); err != nil { // the resume ends first
		t.Fatal(err)
	}
	if m := mode(forkDir, "pages-1.img"); m != 0o644 {
		t.Errorf("the fork's image under its restore: %v, want 0644", m)
	}
	if err := fork.readable(false); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{pauseDir, "pages-1.img"}, {pauseDir, "core-1.img"}, {forkDir, "workspace.img"}} {
		if m := mode(p[0], p[1]); m != 0o600 {
			t.Errorf("%s after both restores: %v, want 0600", p[1], m)
		}
	}
	if len(d.shared) != 0 {
		t.Errorf("shared readers left: %v", d.shared)
	}
}
