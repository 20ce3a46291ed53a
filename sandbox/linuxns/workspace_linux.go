//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// workspaces makes each sandbox's /workspace: a filesystem of its own, so
// that its size is a real limit (ENOSPC, fallocate included), not an
// rlimit. The preferred backend is an ext4 image on a loop device, copied
// (sparse) from a template that Open formats once, so no mkfs runs on the
// create path; the image lives under the data dir and stays mounted on the
// host at <dir>/workspace, so a gateway restart finds its files again.
// Where that fails (no mkfs.ext4, no loop devices), a size-limited tmpfs
// stands in, whose pages count against the sandbox's memory limit.
//
// A session may ask for another size than the default: the first create
// of a size formats a template for it (as Open does for the default,
// ~10 ms), later ones copy it. At most maxSizedTemplates such templates
// are kept, the least recently used go first, so that a stream of
// distinct sizes cannot fill the data dir.
type workspaces struct {
	root     string
	size     int64  // the default
	template string // of the default size; empty: tmpfs
	reason   string // why not ext4, when tmpfs

	mu    sync.Mutex
	sized map[int64]*sizedTemplate
	tick  uint64
}

// maxSizedTemplates bounds the templates kept for sizes other than the
// default. Each is a sparse file of a fresh filesystem's metadata (a few
// hundred KiB to a few MiB).
const maxSizedTemplates = 8

// sizedTemplate is the template of one non-default size.
type sizedTemplate struct {
	path string
	made chan struct{} // closed once made, or failed
	fd   int           // the template, open while cached (-1 until made)
	err  error
	refs int    // creates using it (the one making it included)
	used uint64 // when last asked for, in w.tick
}

func prepareWorkspaces(root string, size int64) *workspaces {
	w := &workspaces{root: root, size: size, sized: map[int64]*sizedTemplate{}}
	tpl := w.templatePath(size)
	if err := makeTemplate(tpl, size); err != nil {
		w.reason = err.Error()
		return w
	}
	w.template = tpl
	return w
}

// templatePath is where the template of size lives; the driver removes
// every .workspace-* of an earlier run when it starts.
func (w *workspaces) templatePath(size int64) string {
	return filepath.Join(w.root, ".workspace-"+strconv.FormatInt(size, 10)+".img")
}

// openTemplate returns an open descriptor of the template of size bytes,
// made on first use, and a release that the caller calls once done with
// it. Concurrent calls for one new size make its template once.
func (w *workspaces) openTemplate(size int64) (int, func(), error) {
	if size == w.size {
		fd, err := unix.Open(w.template, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, nil, err
		}
		return fd, func() { unix.Close(fd) }, nil
	}
	w.mu.Lock()
	t := w.sized[size]
	mine := t == nil
	if mine {
		t = &sizedTemplate{path: w.templatePath(size), made: make(chan struct{}), fd: -1}
		w.sized[size] = t
	}
	w.tick++
	t.used = w.tick
	t.refs++
	w.mu.Unlock()
	release := func() {
		w.mu.Lock()
		t.refs--
		w.evictLocked()
		w.mu.Unlock()
	}
	if mine {
		err := makeTemplate(t.path, size)
		fd := -1
		if err == nil {
			if fd, err = unix.Open(t.path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
				_ = os.Remove(t.path)
			}
		}
		w.mu.Lock()
		t.fd, t.err = fd, err
		if err != nil && w.sized[size] == t {
			delete(w.sized, size) // the next create tries again
		}
		close(t.made)
		w.mu.Unlock()
	} else {
		<-t.made
	}
	if t.err != nil {
		release()
		return -1, nil, t.err
	}
	return t.fd, release, nil
}

// evictLocked removes the least recently used templates no create is
// using until at most maxSizedTemplates are left. Callers hold w.mu.
func (w *workspaces) evictLocked() {
	for len(w.sized) > maxSizedTemplates {
		var old *sizedTemplate
		var oldSize int64
		for s, t := range w.sized {
			if t.refs == 0 && (old == nil || t.used < old.used) {
				old, oldSize = t, s
			}
		}
		if old == nil {
			return // all in use: the last release evicts
		}
		delete(w.sized, oldSize)
		unix.Close(old.fd)
		_ = os.Remove(old.path)
	}
}

// templates is how many non-default templates are kept (for tests).
func (w *workspaces) templates() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.sized)
}

func (w *workspaces) via() string {
	if w.template != "" {
		return "ext4 image on a loop device"
	}
	return "tmpfs (shares the memory limit)"
}

func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found")
}

// makeTemplate formats an empty ext4 image of size bytes at tpl and checks
// that this host can mount it.
func makeTemplate(tpl string, size int64) error {
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}
	tmp := tpl + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("workspace template: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("workspace template: %w", err)
	}
	// No resize inode: its reserved group descriptor blocks (4 MiB of a
	// 16 GiB image's 4.3) are data that every create copies, for an online
	// growth no workspace gets; the image is 264 KiB of data without them.
	// A journal of 1/32 of the size, 1 to 16 MiB, not zeroed here
	// (lazy_journal_init: the template stays 272 KiB of data, and a
	// workspace's image holds only the journal blocks its commits wrote).
	// Without a journal, ext4 passes over every inode freed in the last
	// minute or more at each new inode, looking each one up: 3000 files
	// made in a dir where 3000 were removed a second before took 1.0 s,
	// then 2.0 and 2.2 s at each round, against 0.06 s with one
	// (bench/results/s58-workspace-journal.md). Below 16 MiB, the journal
	// fills and is written back under a chown of 10,000 files (a fork's
	// shiftOwners): 126 ms with 4 MiB, 65 with 16, 59 with none.
	block, journal := "4096", int64(16) // MiB
	if size < 512<<20 {
		block, journal = "1024", max(1, size>>20/32) // 1024 blocks at least
	}
	out, err := exec.Command(mkfs, "-q", "-F", "-b", block, "-O", "^resize_inode", "-J", "size="+strconv.FormatInt(journal, 10), "-m", "0",
		"-E", "root_owner=0:0,lazy_journal_init=1", "-L", "workspace", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	// Mount it once: to know this host can, and to leave the root empty.
	mnt := tmp + ".mnt"
	if err := os.Mkdir(mnt, 0o700); err != nil {
		os.Remove(tmp)
		return err
	}
	defer os.Remove(mnt)
	if err := mountImage(tmp, mnt); err != nil {
		os.Remove(tmp)
		return err
	}
	err = errors.Join(os.Remove(filepath.Join(mnt, "lost+found")), os.Chmod(mnt, 0o755))
	if uerr := unix.Unmount(mnt, 0); uerr != nil {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		err = errors.Join(err, uerr)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("workspace template: %w", err)
	}
	return os.Rename(tmp, tpl)
}

// create makes the workspace of one sandbox, of size bytes (zero: the
// default): image (ext4 only) and the host mount at mnt, owned by the
// sandbox user (host uid:gid). On failure it leaves none of them.
func (w *workspaces) create(mnt, image string, size int64, uid, gid int, tr *sandbox.Trace) (err error) {
	if size <= 0 {
		size = w.size
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, removeWorkspace(mnt, image), os.Remove(mnt))
		}
	}()
	if w.template == "" {
		data := fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", size, uid, gid)
		if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
			return fmt.Errorf("mount workspace tmpfs: %w", err)
		}
		return nil
	}
	t0 := time.Now()
	tpl, release, err := w.openTemplate(size)
	if err != nil {
		return fmt.Errorf("workspace template of %d bytes: %w", size, err)
	}
	err = copySparse(tpl, image)
	release()
	if err != nil {
		return fmt.Errorf("workspace image: %w", err)
	}
	t1 := time.Now()
	tr.Add("workspace.copy_bg", t1.Sub(t0))
	if err := mountImage(image, mnt); err != nil {
		return err
	}
	t2 := time.Now()
	tr.Add("workspace.mount_bg", t2.Sub(t1))
	if err := os.Chown(mnt, uid, gid); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	tr.Add("workspace.chown_bg", time.Since(t2))
	return nil
}

// removeWorkspace unmounts the workspace at mnt (the loop device goes with
// its last mount) and deletes its image.
func removeWorkspace(mnt, image string) error {
	var errs []error
	if err := unix.Unmount(mnt, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount workspace: %w", err))
		}
	}
	if image != "" {
		if err := os.Remove(image); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountImage attaches image to a free loop device (cleared automatically
// when its last mount goes) and mounts it at mnt, with discard: the blocks
// a removal frees go back to the host (the loop device punches holes in
// the image), so that a workspace's image holds about what its files do.
// Without it, blocks the journal had just freed are not reused at once,
// and an image whose 512 MiB file was written and removed 4 times held
// 2 GiB (1 GiB with no journal, 1 MiB with discard; on a host without
// hole punching, ext4 mounts without discard and says so in the kernel's
// log).
func mountImage(image, mnt string) error {
	dev, lfd, err := attachLoop(image)
	if err != nil {
		return err
	}
	defer unix.Close(lfd)
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "discard"); err != nil {
		return fmt.Errorf("mount workspace image: %w", err)
	}
	return nil
}

func attachLoop(image string) (string, int, error) {
	img, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open workspace image: %w", err)
	}
	defer unix.Close(img)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("loop devices: %w", err)
	}
	defer unix.Close(ctl)
	for range 32 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", -1, fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img)}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		direct := cfg
		if bs := dioBlockSize(img); bs > 0 {
			direct.Size = bs // the loop_config's block_size
			direct.Info.Flags |= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(lfd, &direct)
		}
		if direct.Info.Flags&unix.LO_FLAGS_DIRECT_IO == 0 || errors.Is(err, unix.EINVAL) {
			// No direct I/O on this backing file (or this kernel refuses
			// it): through the page cache as before.
			err = unix.IoctlLoopConfigure(lfd, &cfg)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			err = loopSetFD(lfd, img, &cfg.Info) // kernels before 5.8
			if err == nil {
				loopDirectIO(lfd, img)
			}
		}
		if err == nil {
			return dev, lfd, nil
		}
		unix.Close(lfd)
		if !errors.Is(err, unix.EBUSY) {
			return "", -1, fmt.Errorf("attach %s: %w", dev, err)
		}
		// Another attach took this device between GET_FREE and ours.
	}
	return "", -1, errors.New("attach loop device: every free device was taken")
}

// Direct I/O on the loop device: the workspace's ext4 reads and writes
// go straight to the image file, not through the page cache a second
// time. Without it every dirty page of the workspace is cached twice (the
// ext4 inside, the image file outside) and written back twice, and
// sustained writes slow down as the second copy's writeback falls behind.
// It needs a backing filesystem with O_DIRECT and a loop block size that
// is a multiple of that filesystem's direct I/O alignment.

// dioBlockSize is the loop block size for direct I/O on the image open at
// img: its filesystem's direct I/O offset alignment (512 on most disks),
// 0 when that filesystem has no direct I/O. It never exceeds 1024, the
// smallest ext4 block, so that every image still mounts.
func dioBlockSize(img int) uint32 {
	var st unix.Statx_t
	if err := unix.Statx(img, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil {
		return 0
	}
	a := st.Dio_offset_align
	if st.Mask&unix.STATX_DIOALIGN == 0 || a == 0 || a > 1024 || a&(a-1) != 0 {
		return 0
	}
	return max(a, 512)
}

// loopDirectIO turns direct I/O on for a device attached by LOOP_SET_FD
// (kernels before 5.8), best effort.
func loopDirectIO(lfd, img int) {
	if bs := dioBlockSize(img); bs > 0 {
		if unix.IoctlSetInt(lfd, unix.LOOP_SET_BLOCK_SIZE, int(bs)) == nil {
			_ = unix.IoctlSetInt(lfd, unix.LOOP_SET_DIRECT_IO, 1)
		}
	}
}

func loopSetFD(lfd, img int, info *unix.LoopInfo64) error {
	if err := unix.IoctlSetInt(lfd, unix.LOOP_SET_FD, img); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(lfd, info); err != nil {
		_ = unix.IoctlSetInt(lfd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// copySparse copies the file open at in to a new file dst, keeping holes:
// only the few hundred KiB of a fresh filesystem's metadata are written.
// It reads in at explicit offsets (SEEK_DATA and SEEK_HOLE answer from
// the offset given, whatever the shared file position), so that copies
// from one descriptor may run at once.
func copySparse(in int, dst string) error {
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	if unix.IoctlFileClone(out, in) == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return err
	}
	if err := unix.Ftruncate(out, st.Size); err != nil {
		return err
	}
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for rd, wr := data, data; rd < hole; {
			n, err := unix.CopyFileRange(in, &rd, out, &wr, int(hole-rd), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("copy to %s: short copy at %d", dst, rd)
			}
		}
		off = hole
	}
	return nil
}

// SizesWorkspaces says that each sandbox's workspace has the size its
// Spec.Limits.WorkspaceBytes asks (zero: the driver's), ext4 or tmpfs.
func (d *Driver) SizesWorkspaces() bool { return true }
