package linuxns

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// TestSpreadSubdirs: on a real ext4 without a journal (the data dir's
// filesystem on this project's hosts), a dir that mkdirSpread made holds
// FS_TOPDIR_FL, and its new subdirectories land in block groups spread
// over the filesystem, where those of a plain dir all stay in one; the
// driver marks its sandboxes dir so. On a tmpfs, which has no such flag,
// mkdirSpread makes the dir all the same.
func TestSpreadSubdirs(t *testing.T) {
	requireRoot(t, "it mounts an ext4 image and a tmpfs")
	mkfs, err := findMkfs()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI installs e2fsprogs: %v", err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(64 << 20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// 16 groups of 4 MiB, each its own (no flex_bg, whose groups Orlov
	// counts 16 at a time).
	const groups, perGroup = 16, 1024
	if out, err := exec.Command(mkfs, "-q", "-F", "-b", "4096", "-g", strconv.Itoa(perGroup), "-N", strconv.Itoa(groups*256),
		"-O", "^has_journal,^flex_bg,^resize_inode", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if err := mountImage(img, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt, &sfs); err != nil {
		t.Fatal(err)
	}
	inodesPerGroup := uint64(sfs.Files) / groups

	topDir := func(p string) bool {
		t.Helper()
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		flags, err := unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
		if err != nil {
			t.Fatal(err)
		}
		return flags&fsTopDirFlag != 0
	}
	// groupsOf makes 8 subdirs of parent and says in how many block
	// groups they are.
	groupsOf := func(parent string) int {
		t.Helper()
		seen := map[uint64]bool{}
		for i := range 8 {
			sub, err := os.MkdirTemp(parent, "s-"+strconv.Itoa(i)+"-")
			if err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(sub, &st); err != nil {
				t.Fatal(err)
			}
			seen[(st.Ino-1)/inodesPerGroup] = true
		}
		return len(seen)
	}

	plain, spread := filepath.Join(mnt, "plain"), filepath.Join(mnt, "spread")
	if err := os.Mkdir(plain, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := mkdirSpread(spread, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := mkdirSpread(spread, 0o700); err != nil { // there already
		t.Errorf("mkdirSpread of a dir that is there: %v", err)
	}
	if topDir(plain) || !topDir(spread) {
		t.Fatalf("FS_TOPDIR_FL: plain dir %v, spread dir %v; want false, true", topDir(plain), topDir(spread))
	}
	np, ns := groupsOf(plain), groupsOf(spread)
	t.Logf("8 new subdirs: in %d block groups under the spread dir, %d under the plain one", ns, np)
	if ns < 4 || ns <= np {
		t.Errorf("8 new subdirs: in %d block groups under the spread dir, %d under the plain one; want them spread (≥ 4, and more)", ns, np)
	}

	d, err := newDriver(sandbox.Config{DataDir: filepath.Join(mnt, "data")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !topDir(d.root) {
		t.Errorf("the driver's sandboxes dir %s has no FS_TOPDIR_FL", d.root)
	}

	// A dir someone else made first, or could write to, or a symlink in
	// its place, is refused (the restore stages' dir is in the host's
	// temporary dir).
	theirs, open, link := filepath.Join(dir, "theirs"), filepath.Join(dir, "open"), filepath.Join(dir, "link")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(spread, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{theirs, open, link} {
		if err := mkdirSpread(p, 0o711); err == nil {
			t.Errorf("mkdirSpread(%s): no error", filepath.Base(p))
		}
	}

	// A filesystem without the flag: the dir is made, and that is all.
	tmp := filepath.Join(dir, "tmpfs")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", tmp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(tmp, unix.MNT_DETACH) })
	if err := mkdirSpread(filepath.Join(tmp, "x"), 0o700); err != nil {
		t.Errorf("mkdirSpread on a tmpfs: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "x")); err != nil {
		t.Error(err)
	}
	if err := mkdirSpread(filepath.Join(tmp, "no", "x"), 0o700); err == nil {
		t.Error("mkdirSpread under a dir that is not there: no error")
	}
}
