//go:build linux

package linuxns

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWorkspaceTemplateIsSmall: the workspace template, which every
// create copies (and, on a data dir with direct I/O, writes back before
// its loop device is configured), holds a fresh filesystem's metadata and
// little else: no resize inode, whose reserved group descriptor blocks
// were 4 MiB of a 16 GiB image's 4.3 (issue 41: workspace_image_bg
// 7-11 ms of a cold create, copy 1.8 ms and loop attach 2.7 ms of it).
// It has a journal (hasJournal), not zeroed at mkfs, so still small.
func TestWorkspaceTemplateIsSmall(t *testing.T) {
	requireRoot(t, "loop devices, mounts")
	w := prepareWorkspaces(t.TempDir(), 16<<30)
	if w.template == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no ext4 workspace template: %s", w.reason)
		}
		t.Skip(w.reason)
	}
	var st unix.Stat_t
	if err := unix.Stat(w.template, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 1<<20 {
		t.Errorf("the 16 GiB workspace template holds %d KiB of data, want at most 1 MiB", used>>10)
	}
	if !hasJournal(t, w.template) {
		t.Error("the workspace template has no journal")
	}
	// It still mounts, with the whole size free.
	if free := mountedFree(t, w.template); free < 15<<30 {
		t.Errorf("the 16 GiB template mounts with %d MiB free", free>>20)
	}
}

// hasJournal says whether the ext4 image at path has a journal: the
// superblock (at 1024) holds the compat features at 0x5C, has_journal
// 0x4.
func hasJournal(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.ReadAt(b[:], 1024+0x5C); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(b[:])&0x4 != 0
}

// TestWorkspaceSmallTemplate: the smallest workspace a session may ask for
// (gateway.MinDiskMiB, 16 MiB) has a journal too, of 1 MiB (1024 blocks of
// 1 KiB), and leaves the rest free: ext4 without one slows every create
// of a file where many were removed in the last minute
// (makeTemplate's comment).
func TestWorkspaceSmallTemplate(t *testing.T) {
	requireRoot(t, "loop devices, mounts")
	if _, err := findMkfs(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI installs e2fsprogs: %v", err)
		}
		t.Skip(err)
	}
	tpl := t.TempDir() + "/small.img"
	if err := makeTemplate(tpl, 16<<20); err != nil {
		t.Fatal(err)
	}
	if !hasJournal(t, tpl) {
		t.Error("the 16 MiB workspace template has no journal")
	}
	if free := mountedFree(t, tpl); free < 13<<20 {
		t.Errorf("the 16 MiB template mounts with %d KiB free, want at least 13 MiB", free>>10)
	}
}

// mountedFree mounts the ext4 image at img and says how many bytes it has
// free.
func mountedFree(t *testing.T, img string) int64 {
	t.Helper()
	mnt := t.TempDir()
	if err := mountImage(img, mnt); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Error(err)
		}
	}()
	var fs unix.Statfs_t
	if err := unix.Statfs(mnt, &fs); err != nil {
		t.Fatal(err)
	}
	return int64(fs.Bavail) * fs.Bsize
}

// TestWorkspaceGivesBlocksBack: a file written to a workspace and removed
// leaves the image's blocks on the host no more than a moment (mountImage
// mounts with discard: the loop device punches holes), where the journal
// alone had each new write take fresh blocks and the image grow by as
// much every time.
func TestWorkspaceGivesBlocksBack(t *testing.T) {
	requireRoot(t, "loop devices, mounts")
	w := prepareWorkspaces(t.TempDir(), 1<<30)
	if w.template == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no ext4 workspace template: %s", w.reason)
		}
		t.Skip(w.reason)
	}
	img := filepath.Join(t.TempDir(), "ws.img")
	// A host filesystem that cannot punch holes gives the loop device no
	// discard, and ext4 mounts without it.
	probe, err := os.Create(img + ".probe")
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(probe.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096)
	probe.Close()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the test dir's filesystem cannot punch holes: %v", err)
		}
		t.Skipf("the test dir's filesystem cannot punch holes: %v", err)
	}
	in, err := unix.Open(w.template, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = copySparse(in, img)
	unix.Close(in)
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := mountImage(img, mnt); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Error(err)
		}
	}()
	used := func() int64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(img, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	base := used()
	for round := range 3 {
		if err := os.WriteFile(filepath.Join(mnt, "big"), make([]byte, 32<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		syncFS(t, mnt)
		if u := used(); u < base+30<<20 {
			t.Fatalf("round %d: the image holds %d KiB after a 32 MiB file was written, from %d", round, u>>10, base>>10)
		}
		if err := os.Remove(filepath.Join(mnt, "big")); err != nil {
			t.Fatal(err)
		}
		syncFS(t, mnt)
		deadline := time.Now().Add(5 * time.Second)
		for used() >= base+4<<20 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if used() >= base+4<<20 {
			t.Fatalf("round %d: the image still holds %d KiB after the file's removal (%d before it was written)", round, used()>>10, base>>10)
		}
	}
}

// syncFS commits the filesystem mounted at dir (its journal included).
func syncFS(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
}
