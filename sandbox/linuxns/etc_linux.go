//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
)

// etcCheckEvery is how often, at most, a create checks that the host
// files the /etc template (or the /etc dir, etcDirs) copied are unchanged:
// a change on the host shows in the sandboxes created from then on within
// this long (the default root's /etc is a snapshot of the host's at its
// create either way; the template's directories are bound, so changes
// inside them show at once; the /etc dir copies them).
const etcCheckEvery = time.Second

// etcTemplate is the default root's /etc, built once by the gateway
// (initd.BuildEtcTemplate: the host's small files copied, its directories
// bound, its secrets masked, the sandbox's passwd and group) on a tmpfs
// that no mount namespace holds: a detached, read-only mount tree. Each
// create clones it (one open_tree) for the init to attach, which adds the
// files that name the sandbox: ~0.2 ms where building /etc took the init
// 3-5 ms of syscalls (a session CA's bundle is bound over it too). Not for
// images (their root has its own /etc), nor checkpointable sandboxes (CRIU
// would dump one shared tmpfs per sandbox).
type etcTemplate struct {
	log   *slog.Logger
	every time.Duration // etcCheckEvery; shorter in tests

	mu      sync.Mutex
	fd      int // the detached mount; -1: none (not built, or stale)
	read    map[string]etcStamp
	checked time.Time
	failed  error // why it could not be built (then the inits build /etc)
	// failedAt is when; a build is tried again etcRetry later.
	failedAt time.Time
}

// etcRetry is how long after a failed build of the template the next is
// tried: meanwhile each init builds its /etc, as on a kernel that cannot
// clone a detached mount.
const etcRetry = time.Minute

// etcStamp is what changes when a host file or directory does.
type etcStamp struct {
	ino, size    uint64
	mtime, ctime unix.Timespec
	mode         uint32
	present      bool
}

func stampOf(p string) etcStamp {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return etcStamp{}
	}
	return etcStamp{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim, ctime: st.Ctim, mode: st.Mode, present: true}
}

func newEtcTemplate(log *slog.Logger) *etcTemplate {
	return &etcTemplate{log: log, every: etcCheckEvery, fd: -1}
}

// prepare builds the template, so that the first create finds it.
func (t *etcTemplate) prepare() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buildLocked()
}

// buildLocked builds the template when there is none, and it has not
// failed before. Callers hold t.mu.
func (t *etcTemplate) buildLocked() {
	if t.fd >= 0 || t.failed != nil && time.Since(t.failedAt) < etcRetry {
		return
	}
	fd, read, err := buildEtcTemplate()
	if err != nil {
		if t.failed == nil || t.failed.Error() != err.Error() {
			t.log.Warn("sandbox /etc: no template; each sandbox's init builds its own, slower", "err", err.Error(), "retry_in", etcRetry)
		}
		t.failed, t.failedAt = err, time.Now()
		return
	}
	t.failed = nil
	t.fd, t.read, t.checked = fd, read, time.Now()
}

// clone returns a new detached copy of the template for the sandbox whose
// init is pid, or -1 when there is none (the init then builds its /etc).
// The template is built on first use, and again once a host file it copied
// has changed.
//
// The copy's top mount is idmapped to the init's user namespace: the
// template's files are host root's, which the sandbox would see as
// nobody's; through the copy they are the sandbox root's, as when the
// init wrote them. (The host directories bound in it are not idmapped:
// nobody's, as they always were.)
func (t *etcTemplate) clone(pid int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fd >= 0 && time.Since(t.checked) >= t.every {
		if !t.freshLocked() {
			unix.Close(t.fd)
			t.fd = -1
		}
		t.checked = time.Now()
	}
	t.buildLocked()
	if t.fd < 0 {
		return -1
	}
	c, err := unix.OpenTree(t.fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		// A kernel that cannot clone a detached tree (before 6.15?): no
		// template, until a build is tried again.
		t.failed, t.failedAt = fmt.Errorf("clone the /etc template: %w", err), time.Now()
		t.log.Warn("sandbox /etc: no template; each sandbox's init builds its own, slower", "err", t.failed.Error(), "retry_in", etcRetry)
		unix.Close(t.fd)
		t.fd = -1
		return -1
	}
	if err := idmapTo(c, pid); err != nil {
		unix.Close(c)
		if errors.Is(err, errNoUserNS) {
			return -1 // this init is gone: its create fails anyway
		}
		t.failed, t.failedAt = err, time.Now()
		t.log.Warn("sandbox /etc: no template; each sandbox's init builds its own, slower", "err", err.Error(), "retry_in", etcRetry)
		unix.Close(t.fd)
		t.fd = -1
		return -1
	}
	return c
}

// errNoUserNS is idmapTo's error when the init's user namespace is not
// there to open (the init ended).
var errNoUserNS = errors.New("no user namespace")

// idmapTo idmaps the top mount of the detached tree at fd to the user
// namespace of pid (the host's root, 0, is then the namespace's 0).
func idmapTo(fd, pid int) error {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("idmap the /etc template: %w: %w", errNoUserNS, err)
	}
	defer unix.Close(ns)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("idmap the /etc template: %w", err)
	}
	return nil
}

// freshLocked reports whether every host path the template read is as
// it was then. Callers hold t.mu.
func (t *etcTemplate) freshLocked() bool {
	for p, was := range t.read {
		if stampOf(p) != was {
			return false
		}
	}
	return true
}

// close lets the template go.
func (t *etcTemplate) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fd >= 0 {
		unix.Close(t.fd)
		t.fd = -1
	}
}

// buildEtcTemplate builds the template on a new tmpfs that no mount
// namespace holds (fsmount), made read-only throughout, and returns it
// with the stamps of the host paths it read.
func buildEtcTemplate() (int, map[string]etcStamp, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, nil, fmt.Errorf("/etc template: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"mode": "0755", "size": "4m"} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, nil, fmt.Errorf("/etc template: %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, nil, fmt.Errorf("/etc template: %w", err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, nil, fmt.Errorf("/etc template: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	read, err := initd.BuildEtcTemplate(fd)
	if err != nil {
		return -1, nil, fmt.Errorf("/etc template: %w", err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return -1, nil, fmt.Errorf("/etc template: %w", err)
	}
	// The tmpfs itself read-only too, not only each mount of it: it is
	// every tenant's, and a mount flag is the mount holder's to change (a
	// sandbox's init is the owner of its mount namespace, and its clone
	// of the template is not locked as the mounts a namespace copies
	// are). Only host root can make the tmpfs writable again.
	if err := readOnlySuper(fd); err != nil {
		return -1, nil, fmt.Errorf("/etc template: %w", err)
	}
	// Stamped after the copy: a host change in the few milliseconds of
	// the build is not noticed until the next one.
	stamps := make(map[string]etcStamp, len(read))
	for _, p := range read {
		stamps[p] = stampOf(p)
	}
	ok = true
	return fd, stamps, nil
}

// readOnlySuper makes the filesystem of the mount at fd read-only (its
// superblock: every mount of it).
func readOnlySuper(fd int) error {
	fs, err := unix.Fspick(fd, "", unix.FSPICK_EMPTY_PATH|unix.FSPICK_CLOEXEC)
	if err != nil {
		return fmt.Errorf("make read-only: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetFlag(fs, "ro"); err != nil {
		return fmt.Errorf("make read-only: %w", err)
	}
	if err := unix.FsconfigReconfigure(fs); err != nil {
		return fmt.Errorf("make read-only: %w", err)
	}
	return nil
}
