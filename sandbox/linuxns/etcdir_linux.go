//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
)

// etcDirsDir, in the driver's dir, holds the /etc dirs of checkpointable
// default roots (etcDirs).
const etcDirsDir = ".etc"

// etcDirs is the /etc of checkpointable default roots: a directory of the
// host under the driver's dir (initd.BuildEtcDir: the host's /etc copied,
// its secrets masked, the sandbox's passwd and group), bound read-only at
// every such sandbox's /etc, whose init binds its own hostname, hosts,
// machine-id and resolv.conf over it. The template of the other sandboxes
// (etcTemplate) is a tmpfs that no mount namespace holds, which CRIU
// cannot dump; their former /etc, a tmpfs of each sandbox's own with a
// bind per host directory, made some 80 mounts that each dump and each
// restore of a fork went through (some 20 ms of a fork ×4's 240).
//
// A dir is built on first use, and again once a host path it read has
// changed (checked at most every etcCheckEvery); sandboxes keep the one
// they were built with (sandboxState.EtcDir), a fork or a resume too.
// Those no sandbox on disk names are removed when the driver starts, and
// after each new build once etcDirGrace has passed since they stopped
// being the current one (removeUnused).
type etcDirs struct {
	root   string // <driver dir>/.etc
	driver string // the driver's dir, whose sandboxes' states name dirs
	log    *slog.Logger
	every  time.Duration

	mu  sync.Mutex
	cur string // the name of the dir new sandboxes get; "": none yet
	// retired are the dirs that were current in this run, and since when
	// they are not.
	retired map[string]time.Time
	read    map[string]etcStamp
	checked time.Time
	failed  error
	// failedAt is when; a build is tried again etcRetry later (meanwhile
	// each init builds its /etc as before).
	failedAt time.Time
}

// etcDirGrace is how long a dir that stopped being the current one is
// kept whatever the states on disk say: a create that took it saves its
// state within milliseconds, a fork's restore names its source's.
const etcDirGrace = 5 * time.Minute

func newEtcDirs(driverRoot string, log *slog.Logger) *etcDirs {
	return &etcDirs{root: filepath.Join(driverRoot, etcDirsDir), driver: driverRoot, log: log, every: etcCheckEvery, retired: map[string]time.Time{}}
}

// dir returns the name of the /etc dir for a new sandbox (path makes it
// a path), building it when there is none or the host's /etc changed; ""
// when it cannot be built (then the init builds its /etc).
func (e *etcDirs) dir() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur != "" && time.Since(e.checked) >= e.every {
		if !e.freshLocked() {
			e.retired[e.cur] = time.Now()
			e.cur = ""
		}
		e.checked = time.Now()
	}
	if e.cur != "" || e.failed != nil && time.Since(e.failedAt) < etcRetry {
		return e.cur
	}
	dir, read, err := e.build()
	if err != nil {
		if e.failed == nil || e.failed.Error() != err.Error() {
			e.log.Warn("sandbox /etc: no shared /etc dir for checkpointable sandboxes; each init builds its own, slower to create, dump and restore", "err", err.Error(), "retry_in", etcRetry)
		}
		e.failed, e.failedAt = err, time.Now()
		return ""
	}
	e.failed = nil
	e.cur, e.checked = filepath.Base(dir), time.Now()
	e.read = make(map[string]etcStamp, len(read))
	for _, p := range read {
		e.read[p] = stampOf(p)
	}
	if len(e.retired) > 0 {
		go e.removeUnused(time.Now())
	}
	return e.cur
}

// path is the dir named name (a sandbox state's EtcDir); an error for a
// name that is not one of e's.
func (e *etcDirs) path(name string) (string, error) {
	if name != filepath.Base(name) || !strings.HasPrefix(name, "g-") {
		return "", fmt.Errorf("/etc dir %q: not one of the gateway's", name)
	}
	return filepath.Join(e.root, name), nil
}

// drop retires the dir named name, which a create could not use (gone
// from the disk): the next create builds a new one.
func (e *etcDirs) drop(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur == name {
		e.retired[e.cur] = time.Now()
		e.cur = ""
	}
}

// freshLocked reports whether every host path the current dir read is as
// it was then. Callers hold e.mu.
func (e *etcDirs) freshLocked() bool {
	for p, was := range e.read {
		if stampOf(p) != was {
			return false
		}
	}
	return true
}

// build makes a new dir, 0755 (a restore's mount namespace reaches it
// through the stage's bind), under e.root (0700).
func (e *etcDirs) build() (string, []string, error) {
	if err := os.Mkdir(e.root, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", nil, fmt.Errorf("/etc dir: %w", err)
	}
	dir, err := os.MkdirTemp(e.root, "g-")
	if err != nil {
		return "", nil, fmt.Errorf("/etc dir: %w", err)
	}
	read, err := initd.BuildEtcDir(dir)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		return "", nil, errors.Join(fmt.Errorf("/etc dir: %w", err), os.RemoveAll(dir))
	}
	return dir, read, nil
}

// open returns a detached read-only bind of the dir named name, for an
// init to attach at its /etc. The bind is private: a clone of a shared
// mount (a systemd host's /) would be a peer of it, and the binds the
// init makes over it would show on the host and in every other sandbox.
func (e *etcDirs) open(name string) (int, error) {
	dir, err := e.path(name)
	if err != nil {
		return -1, err
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("/etc dir: %w", err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("/etc dir: %w", err)
	}
	return fd, nil
}

// removeUnused removes the dirs that no sandbox of the driver names (its
// state's EtcDir), those half built by a crash included, but for the
// current one and those retired less than etcDirGrace before now.
func (e *etcDirs) removeUnused(now time.Time) {
	entries, err := os.ReadDir(e.root)
	if err != nil {
		return
	}
	used := map[string]bool{}
	e.mu.Lock()
	used[e.cur] = true
	for name, at := range e.retired {
		if now.Sub(at) < etcDirGrace {
			used[name] = true
		}
	}
	e.mu.Unlock()
	sbs, _ := os.ReadDir(e.driver)
	for _, s := range sbs {
		if st, err := loadState(filepath.Join(e.driver, s.Name())); err == nil && st.EtcDir != "" {
			used[st.EtcDir] = true
		}
	}
	for _, en := range entries {
		if used[en.Name()] {
			continue
		}
		p := filepath.Join(e.root, en.Name())
		if err := os.RemoveAll(p); err != nil {
			e.log.Warn("sandbox /etc: could not remove an unused /etc dir", "dir", p, "err", err.Error())
			continue
		}
		e.mu.Lock()
		delete(e.retired, en.Name())
		e.mu.Unlock()
	}
}
