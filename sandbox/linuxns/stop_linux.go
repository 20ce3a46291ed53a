//go:build linux

package linuxns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// A stopped sandbox (sandbox.Stopper) is its files only: the workspace
// image stays mounted on the host at <dir>/workspace (an image sandbox's
// writable layer lives on it), the state file says Stopped, and the uid
// range stays the sandbox's. Its init, and with it its pid, mount, net,
// ipc and uts namespaces and every process, is gone; so are its cgroups.
// Resume boots a new init on that workspace as Create does.

// Stopped implements sandbox.Stopper.
func (s *linuxSandbox) Stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Stopped
}

// Stop implements sandbox.Stopper: it kills the init, which takes every
// process of the sandbox with it, and removes the cgroups. The state file
// says Stopped before the init dies, so that a gateway that crashes
// half-way adopts the sandbox as stopped (and finishes the job).
func (s *linuxSandbox) Stop(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sandbox.ErrClosed
	}
	if s.st.Stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopping = true
	s.st.Stopped = true
	paused := s.st.Paused
	s.st.Paused = false // the kill thaws it
	s.mu.Unlock()
	dir := s.d.dir(s.st.ID)
	if err := s.st.save(dir); err != nil {
		s.mu.Lock()
		s.stopping, s.st.Stopped, s.st.Paused = false, false, paused
		s.mu.Unlock()
		return fmt.Errorf("stop sandbox: %w", err)
	}
	err := errors.Join(s.killInit(), s.dropPause())
	if err == nil {
		// No process is left that a lazy-pages daemon still serves: a
		// restart after a resume must not take the new ones for them,
		// nor a dump wait for (or refuse after) the daemon's end.
		err = dropLazyMarker(dir)
		s.lazy = nil // under s.life, as waitLazy's callers
	}
	s.mu.Lock()
	s.st.Pid, s.st.StartTime = 0, 0
	s.mu.Unlock()
	if serr := s.st.save(dir); serr != nil {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("stop sandbox: %w", err)
	}
	s.d.log.Info("sandbox_stopped", "sandbox", s.st.ID)
	return nil
}

// killInit kills the current init, waits until it (and so every process
// of its pid namespace) is gone, and removes the cgroups and the image
// root's mount points. The caller has set stopping.
func (s *linuxSandbox) killInit() error {
	errs := []error{s.killCurrent()}
	s.mu.Lock()
	if s.pidfd != nil { // closed by killCurrent
		s.cmd, s.pidfd = nil, nil
	}
	s.mu.Unlock()
	// Whatever escaped the init's end (nothing should) dies with the
	// cgroups.
	cgroup.KillProcs(s.st.Cgroups)
	errs = append(errs, cgroup.Remove(s.st.Cgroups), removeImageDirs(s.d.dir(s.st.ID)), removeSocket(s.st.Socket))
	return errors.Join(errs...)
}

// Resume implements sandbox.Stopper: a new init, in new namespaces and
// cgroups, on the same workspace mount and uid range; an image sandbox's
// root is a new overlay on the same writable layer.
func (s *linuxSandbox) Resume(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	closed, stopped := s.closed, s.st.Stopped
	s.mu.Unlock()
	if closed {
		return sandbox.ErrClosed
	}
	if !stopped {
		return nil
	}
	boot := s.st.Boot
	if boot == nil {
		return errors.New("resume sandbox: it was made by a gateway that could not stop sandboxes")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, initTimeout)
		defer cancel()
	}
	if err := checkMounted(s.st.Workspace); err != nil {
		return fmt.Errorf("resume sandbox: %w", err)
	}
	// Left by a crash half-way through an earlier Stop or Resume.
	if err := errors.Join(cgroup.Remove(s.st.Cgroups), removeImageDirs(s.d.dir(s.st.ID)), removeSocket(s.st.Socket)); err != nil {
		return fmt.Errorf("resume sandbox: %w", err)
	}
	s.trustPEM = boot.TrustPEM
	s.mu.Lock() // Halt reads them without life
	s.st.Cgroups = s.d.cg.DirsFor(s.st.ID)
	s.mu.Unlock()
	wsDone := make(chan error, 1)
	wsDone <- nil // the workspace is mounted already
	start := time.Now()
	// stopping stays set until the new init is up: one that dies while
	// it boots fails the Resume, not the sandbox.
	if err := s.d.bootInit(ctx, s, boot.Image, boot.Limits, wsDone); err != nil {
		kerr := s.killInit()
		s.mu.Lock()
		s.st.Pid, s.st.StartTime = 0, 0
		s.mu.Unlock()
		return errors.Join(fmt.Errorf("resume sandbox: %w", err), kerr, s.st.save(s.d.dir(s.st.ID)))
	}
	s.mu.Lock()
	s.st.Stopped, s.stopping, s.st.Restored = false, false, false
	s.mu.Unlock()
	if err := s.st.save(s.d.dir(s.st.ID)); err != nil {
		return fmt.Errorf("resume sandbox: %w", err)
	}
	s.d.log.Info("sandbox_resumed", "sandbox", s.st.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// adoptStopped re-attaches the stopped sandbox st of a previous run: it
// finishes a Stop that a crash interrupted (an init still running, its
// cgroups) and keeps the files.
func (d *Driver) adoptStopped(st *sandboxState) (sandbox.Sandbox, error) {
	d.mu.Lock()
	if owner, used := d.slots[st.Slot]; used && owner != st.ID || st.Slot <= 0 || st.Slot >= maxSlots {
		d.mu.Unlock()
		return nil, fmt.Errorf("adopt %s: uid range %d is taken", st.ID, st.Slot)
	}
	d.slots[st.Slot] = st.ID
	d.mu.Unlock()
	cgs := d.cgroupsOf(st)
	errs := []error{d.killLeft(st, cgs, "adopted stopped")}
	errs = append(errs, cgroup.Remove(cgs), removeImageDirs(d.dir(st.ID)), removeSocket(st.Socket), checkMounted(st.Workspace))
	if err := errors.Join(errs...); err != nil {
		d.freeSlot(st.Slot, st.ID)
		return nil, fmt.Errorf("adopt stopped %s: %w", st.ID, err)
	}
	if st.Pid != 0 {
		st.Pid, st.StartTime = 0, 0
		if err := st.save(d.dir(st.ID)); err != nil {
			d.freeSlot(st.Slot, st.ID)
			return nil, fmt.Errorf("adopt stopped %s: %w", st.ID, err)
		}
	}
	sb := newLinuxSandbox(d, st)
	sb.stopping = true
	return sb, nil
}

// removeImageDirs removes the mount points an image root was built on
// (<dir>/rootfs and <dir>/l/<n>), which imageRoot makes anew. They are
// empty once the init is gone (the host-side mounts are detached at
// boot); a mount still there makes this fail rather than delete what it
// shows.
func removeImageDirs(dir string) error {
	var errs []error
	ldir := filepath.Join(dir, "l")
	entries, err := os.ReadDir(ldir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		errs = append(errs, removeEmpty(filepath.Join(ldir, e.Name())))
	}
	errs = append(errs, removeEmpty(ldir), removeEmpty(filepath.Join(dir, "rootfs")))
	return errors.Join(errs...)
}

// removeEmpty removes the empty directory (or nothing) at p, after
// detaching a mount left on it.
func removeEmpty(p string) error {
	err := unix.Rmdir(p)
	if errors.Is(err, unix.EBUSY) {
		_ = unix.Unmount(p, unix.MNT_DETACH)
		err = unix.Rmdir(p)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// checkMounted reports an error unless a filesystem is mounted at p (the
// workspace of a stopped sandbox, which holds its files).
func checkMounted(p string) error {
	var st, parent unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := unix.Stat(filepath.Dir(p), &parent); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if st.Dev == parent.Dev {
		return fmt.Errorf("workspace %s is not mounted", p)
	}
	return nil
}

// removeSocket removes the control socket of a dead init, so that the
// next one can bind it.
func removeSocket(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control socket: %w", err)
	}
	return nil
}
