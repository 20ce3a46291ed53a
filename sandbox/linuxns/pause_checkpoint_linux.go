//go:build linux

package linuxns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// A pause by checkpoint: where the sandbox can be checkpointed (the
// conditions of Checkpoint: serve --checkpoint, the default root, an ext4
// workspace), Pause has CRIU dump its whole process tree into the
// sandbox's own dir and end the processes (no --leave-running): their
// memory and CPU are free. The workspace stays mounted where it is (no
// copy: nothing runs to change it), and so do the uid range and the
// cgroups with their limits. Unpause restores the processes in place:
// same sandbox, same pids inside, same workspace mount and cgroups, new
// pid, mount, net, ipc and uts namespaces as a fork's restore makes them
// (the network namespace restored empty, its loopback up; the gateway
// opens the egress proxy in it again), then deletes the images.
//
// While the gateway that paused the sandbox runs, it keeps the init's
// Unix sockets open (held): its control socket, and the connections of
// the gateway's commands, kept processes, shells and kernels. The
// restored init gets those very sockets back, so each connection goes on
// as it was, with what was written to it meanwhile. After a gateway
// restart there are none: the restored init gets a new control socket,
// and a closed peer for each connection (its commands end, kept ones
// wait for a Reattach), as a fork's does.
//
// The state file says Paused, with the images' dir, before the processes
// end: a gateway that dies half-way adopts a sandbox whose init still
// runs (the dump failed or never ended it) as running, and the gateway
// pauses it again; one whose init is gone restores from the images if
// the dump finished (pauseMetaFile is written last), and is lost if not.

// MaxPauseDumps bounds the pauses by checkpoint under way at once on a
// gateway (each a CRIU dump of a session's memory to the data dir): one
// more is a freeze, whose answer says so, rather than wait.
const MaxPauseDumps = 2

// pauseImagesDir, in the sandbox's dir, holds a pause's images (0700,
// each file 0600 root).
const pauseImagesDir = "pause"

// pauseMetaFile, among the images, is what a restore needs besides them
// (pauseMeta); it is written once the dump is complete.
const pauseMetaFile = "pause.json"

// pauseMetaPending is pauseMetaFile before the dump is complete;
// criuDumped marks a complete dump (CRIU writes it last, once the dump
// succeeded).
const (
	pauseMetaPending = "pause.json.pending"
	criuDumped       = "stats-dump"
)

// checkpointNotKept is what a pause by checkpoint does not keep.
var checkpointNotKept = []string{
	"connections from outside the sandbox (SSH channels, REST streams, forwarded ports, egress connections) are closed by the gateway at pause",
	"TCP connections of the sandbox's processes (on its loopback too) are closed at resume; listening sockets are kept",
}

// pauseMeta is the part of a checkpoint (checkpoint's fields) that a
// restore after a gateway restart needs.
type pauseMeta struct {
	Mounts      []string    `json:"mounts"`
	Root        []pauseRoot `json:"root"`
	Listener    uint64      `json:"listener"`
	Conns       []uint64    `json:"conns,omitempty"`
	Controllers []string    `json:"controllers,omitempty"`
}

type pauseRoot struct {
	Name string `json:"name"`
	Link string `json:"link,omitempty"`
	Dir  bool   `json:"dir,omitempty"`
}

// errSandboxLost says the sandbox's init ended during a pause that could
// not save it: it cannot be paused or resumed, only removed.
var errSandboxLost = errors.New("the sandbox's processes ended during a failed checkpoint")

// pauseCheckpoint pauses running sandbox s by checkpoint (s.life held),
// filling rep. An error wrapping sandbox.ErrNoCheckpoint says the sandbox
// cannot be; any other but errSandboxLost leaves it running as it was.
func (s *linuxSandbox) pauseCheckpoint(ctx context.Context, rep *sandbox.PauseReport) (err error) {
	d := s.d
	s.mu.Lock()
	st := *s.st
	st.Cgroups = slices.Clone(s.st.Cgroups)
	s.mu.Unlock()
	if err := d.checkpointable(&st); err != nil {
		return err
	}
	if err := s.waitLazy(ctx); err != nil {
		return err
	}
	criu, err := d.criuPath()
	if err != nil {
		return err
	}
	select {
	case d.pauseDumps <- struct{}{}:
		defer func() { <-d.pauseDumps }()
	default:
		return fmt.Errorf("%w: the gateway dumps %d sessions already, as many as it may at once", sandbox.ErrNoCheckpoint, MaxPauseDumps)
	}
	ph := newPhases()
	c, err := d.prepareCheckpoint(st)
	if err != nil {
		return err
	}
	socks, err := initUnixSockets(st.Pid, true)
	if err != nil {
		return err
	}
	if open := openConns(socks); open > 0 {
		closeSocks(socks)
		// Their stdio are pipes (or a terminal) to the gateway, which a
		// restore would give the processes new, with no gateway at the
		// other end.
		return fmt.Errorf("%w: the gateway holds %d open connection(s) to its processes after %s (a command under way, a shell command or kernel call under way, a process the pause's SIGHUP did not end, or a process on a terminal), which a restore cannot hand back",
			sandbox.ErrNoCheckpoint, open, PauseConnWait)
	}
	held := map[uint64]*os.File{}
	// The init's connections as of now, the held ones, are those the
	// dump takes as external (prepareCheckpoint's list is older: one
	// accepted since would be "not found" by criu).
	c.conns = c.conns[:0]
	for _, sk := range socks {
		held[sk.ino] = sk.dup
		if sk.ino != c.listener && !slices.Contains(c.conns, sk.ino) {
			c.conns = append(c.conns, sk.ino)
		}
	}
	keepHeld := false
	defer func() {
		if !keepHeld {
			closeSocks(socks)
		}
	}()
	if held[c.listener] == nil {
		return fmt.Errorf("checkpoint: the init's control socket %d is not among its descriptors", c.listener)
	}
	sdir := d.dir(st.ID)
	c.dir = filepath.Join(sdir, pauseImagesDir)
	s.waitImagesGone() // the last resumed pause's, deleted in the background
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	// The record first: the dump ends the processes.
	s.mu.Lock()
	s.st.Paused, s.st.PauseImages, s.st.PauseMounts, s.stopping = true, c.dir, c.mountTable, true
	s.mu.Unlock()
	undo := func() error {
		s.mu.Lock()
		s.st.Paused, s.st.PauseImages, s.st.PauseMounts, s.stopping = false, "", nil, false
		s.mu.Unlock()
		return errors.Join(s.st.save(sdir), os.RemoveAll(c.dir))
	}
	if err := s.st.save(sdir); err != nil {
		return errors.Join(fmt.Errorf("checkpoint: %w", err), undo())
	}
	args := []string{"dump", "-t", strconv.Itoa(st.Pid), "-D", c.dir, "-o", "dump.log", "-v2",
		"--tcp-close", "--network-lock", "skip", "--empty-ns", "net",
		"--external", fmt.Sprintf("unix[%d]", c.listener)}
	for _, ino := range c.conns {
		args = append(args, "--external", fmt.Sprintf("unix[%d]", ino))
	}
	for _, ctl := range c.controllers {
		args = append(args, "--cgroup-dump-controller", ctl)
	}
	for _, mp := range c.mounts {
		args = append(args, "--external", "mnt["+mp+"]:"+mountKey(mp))
	}
	// What a restore needs besides the images, there before the dump:
	// a gateway that dies once criu has dumped (stats-dump) but before
	// it renamed it pause.json finds it (adoptPausedCheckpoint).
	meta := pauseMeta{Mounts: c.mounts, Listener: c.listener, Conns: c.conns, Controllers: c.controllers}
	for _, e := range c.root {
		meta.Root = append(meta.Root, pauseRoot{Name: e.name, Link: e.link, Dir: e.dir})
	}
	b, err := json.Marshal(meta)
	if err == nil {
		err = os.WriteFile(filepath.Join(c.dir, pauseMetaPending), b, 0o600)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("checkpoint: %w", err), undo())
	}
	// criu holds the dump's lock until it ends, the gateway's death
	// notwithstanding: the next gateway's Adopt waits for it
	// (waitDump) rather than judge the sandbox, and delete its images,
	// under a criu that still dumps it.
	lock, err := lockDump(c.dir)
	if err != nil {
		return errors.Join(err, undo())
	}
	ph.mark("prepare")
	// As Checkpoint's: a caller that goes away does not kill criu.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dumpTimeout)
	defer cancel()
	derr := c.run(dctx, criu, args, filepath.Join(c.dir, "dump.log"), []*os.File{lock}, ph)
	lock.Close()
	_, done := s.current()
	if derr != nil {
		// A failed dump lets the processes run on.
		select {
		case <-done:
			s.markEnded()
			return errors.Join(fmt.Errorf("%w: %w", errSandboxLost, derr), undo())
		default:
		}
		return errors.Join(d.redumpFailed(&st, fmt.Errorf("checkpoint of %s: %w", st.ID, derr)), undo())
	}
	ph.mark("criu")
	// CRIU kills the dumped processes: the init ends with them.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.signalInit(unix.SIGKILL)
		<-done
	}
	s.mu.Lock()
	if s.pidfd != nil {
		s.pidfd.Close()
	}
	s.cmd, s.pidfd = nil, nil
	s.st.Pid, s.st.StartTime = 0, 0
	s.mu.Unlock()
	err = os.Rename(filepath.Join(c.dir, pauseMetaPending), filepath.Join(c.dir, pauseMetaFile))
	if err == nil {
		err = chmodImages(c.dir)
	}
	if err == nil {
		err = s.st.save(sdir)
	}
	if err != nil {
		// The processes are gone and the images not whole: the sandbox
		// is lost, and ends (its session fails) rather than stay, with
		// no init, running as far as the gateway knows.
		s.markEnded()
		return fmt.Errorf("%w: %w", errSandboxLost, err)
	}
	keepHeld = true
	s.mu.Lock()
	s.held = held
	s.mu.Unlock()
	ph.mark("images")
	reclaim(st.Cgroups)
	rep.Method = "checkpoint"
	settle := time.Now()
	var residentFirst int64
	rep.ResidentBytes, residentFirst = residentSettled(st.Cgroups)
	rep.NotKept = slices.Clone(checkpointNotKept)
	d.log.Info("sandbox_paused", append([]any{"sandbox", st.ID, "method", rep.Method, "resident_bytes", rep.ResidentBytes,
		"resident_first_bytes", residentFirst, "resident_settle_ms", time.Since(settle).Milliseconds(),
		"images_bytes", dirBytes(c.dir)}, ph.attrs()...)...)
	return nil
}

// loadPauseCheckpoint is the checkpoint of sandbox st, paused by
// checkpoint, as its images dir holds it.
func (d *Driver) loadPauseCheckpoint(st sandboxState) (*checkpoint, error) {
	b, err := os.ReadFile(filepath.Join(st.PauseImages, pauseMetaFile))
	if err != nil {
		return nil, fmt.Errorf("the pause's checkpoint: %w", err)
	}
	var meta pauseMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("the pause's checkpoint: %w", err)
	}
	c := &checkpoint{d: d, dir: st.PauseImages, src: st, mounts: meta.Mounts, listener: meta.Listener,
		conns: meta.Conns, controllers: meta.Controllers, shared: st.PauseImages, mountTable: st.PauseMounts}
	for _, e := range meta.Root {
		c.root = append(c.root, rootEntry{name: e.Name, link: e.Link, dir: e.Dir})
	}
	return c, nil
}

// pausedCheckpoint is Checkpoint of sandbox st, paused by checkpoint
// (s.life held): a fork's checkpoint made of its images (hard links, in
// a checkpoint dir of its own, so that an Unpause meanwhile may delete
// them) and a copy of its workspace image, which nothing changes while
// its processes are gone. The sandbox stays paused.
func (d *Driver) pausedCheckpoint(st sandboxState) (_ sandbox.Checkpoint, err error) {
	c, err := d.loadPauseCheckpoint(st)
	if err != nil {
		return nil, err
	}
	c.src.Cgroups = slices.Clone(st.Cgroups)
	if c.dir, err = d.newCheckpointDir(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(c.dir)
		}
	}()
	entries, err := os.ReadDir(st.PauseImages)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() && filepath.Ext(e.Name()) == ".img" {
			if err := os.Link(filepath.Join(st.PauseImages, e.Name()), filepath.Join(c.dir, e.Name())); err != nil {
				return nil, fmt.Errorf("checkpoint: %w", err)
			}
		}
	}
	script := postDumpScript(st.Workspace, st.Image, c.workspaceImage())
	cp := exec.Command("sh", "-c", script)
	cp.Env = append(os.Environ(), "CRTOOLS_SCRIPT_ACTION=post-dump")
	if out, err := cp.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("checkpoint: copy the workspace: %w: %s", err, out)
	}
	if err := chmodImages(c.dir); err != nil {
		return nil, err
	}
	d.log.Info("sandbox_checkpointed", "sandbox", st.ID, "from", "pause")
	return c, nil
}

// unpauseCheckpoint restores sandbox s, paused by checkpoint, in place
// (s.life held). A restore that fails leaves it paused, its images
// there for the next try.
func (s *linuxSandbox) unpauseCheckpoint(ctx context.Context) (err error) {
	d := s.d
	s.mu.Lock()
	st := *s.st
	st.Cgroups = slices.Clone(s.st.Cgroups)
	held := s.held
	s.mu.Unlock()
	sdir := d.dir(st.ID)
	c, err := d.loadPauseCheckpoint(st)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	criu, err := d.criuPath()
	if err != nil {
		return err
	}
	go c.criuLoUp(criu) // read while the restore is prepared
	ctx, cancel := withInitTimeout(ctx)
	defer cancel()
	ph := newPhases()
	if err := checkMounted(st.Workspace); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	// Whatever a failed restore left in the cgroups.
	cgroup.KillProcs(st.Cgroups)
	if held == nil {
		// A new control socket (criuRestore) where the old one was.
		if err := removeSocket(st.Socket); err != nil {
			return err
		}
	}
	_ = os.RemoveAll(filepath.Join(c.dir, "r-"+st.ID)) // a failed try's
	imgs, err := c.restoreImages(&st)
	if err != nil {
		return err
	}
	defer os.RemoveAll(imgs)
	stage, err := c.stage(&st)
	if err != nil {
		return err
	}
	defer stage.remove()
	ph.mark("stage")
	fail := func(err error) error {
		s.killCurrent()
		cgroup.KillProcs(st.Cgroups)
		s.mu.Lock()
		s.cmd, s.pidfd = nil, nil
		s.st.Pid, s.st.StartTime = 0, 0
		s.mu.Unlock()
		return errors.Join(err, s.st.save(sdir))
	}
	if err := c.criuRestore(ctx, criu, &st, imgs, stage, held, nil, ph); err != nil {
		return fail(err)
	}
	ph.mark("criu")
	pidfd, err := openInit(&st, unix.O_NONBLOCK)
	if err != nil {
		return fail(fmt.Errorf("restored init: %w", err))
	}
	s.setInit(nil, os.NewFile(uintptr(pidfd), "init"))
	s.mu.Lock()
	s.st.Pid, s.st.StartTime, s.st.Restored = st.Pid, st.StartTime, true
	s.mu.Unlock()
	// The new init answers on its control socket (Adopt's check).
	conn, err := s.dial(ctx)
	if err != nil {
		return fail(fmt.Errorf("restored init: %w", err))
	}
	conn.Close()
	ph.mark("handshake")
	s.mu.Lock()
	s.st.Paused, s.st.PauseImages, s.stopping = false, "", false
	s.held = nil
	s.mu.Unlock()
	for _, f := range held { // the restored init has its own now
		f.Close()
	}
	if err := s.st.save(sdir); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	s.removeImagesLater(c.dir)
	ph.mark("cleanup")
	d.log.Info("sandbox_unpaused", append([]any{"sandbox", st.ID, "method", "checkpoint"}, ph.attrs()...)...)
	return nil
}

// removeImagesLater deletes dir, the images of s's pause just resumed
// (s.life held), after the resume's answer rather than before: a 100 MiB
// session's take ~10 ms to delete. The next pause of s waits for it
// (waitImagesGone) before it dumps into the same dir; a gateway that dies
// meanwhile leaves the dir to that pause, or to the sandbox's removal.
func (s *linuxSandbox) removeImagesLater(dir string) {
	gone := make(chan struct{})
	s.mu.Lock()
	s.imagesGone = gone
	id := s.st.ID
	s.mu.Unlock()
	go func() {
		defer close(gone)
		if err := os.RemoveAll(dir); err != nil {
			s.d.log.Error("pause_images_remove_failed", "sandbox", id, "err", err)
		}
	}()
}

// waitImagesGone waits until the images of s's last pause by checkpoint,
// resumed, are deleted (s.life held).
func (s *linuxSandbox) waitImagesGone() {
	s.mu.Lock()
	gone := s.imagesGone
	s.mu.Unlock()
	if gone != nil {
		<-gone
	}
}

// dropPause forgets a pause by checkpoint of s (s.life held; the caller
// saves the state): its held sockets close and its images go (Stop).
func (s *linuxSandbox) dropPause() error {
	s.mu.Lock()
	dir, held := s.st.PauseImages, s.held
	s.st.PauseImages, s.held = "", nil
	s.mu.Unlock()
	for _, f := range held {
		f.Close()
	}
	if dir == "" {
		return nil
	}
	return os.RemoveAll(dir)
}

// adoptPausedCheckpoint adopts sandbox st, paused by checkpoint by an
// earlier gateway. ok is false when st's init still runs (a dump that
// failed, or never ended: Adopt goes on with a running sandbox, whose
// state no longer says paused, and the gateway pauses it again).
func (d *Driver) adoptPausedCheckpoint(st *sandboxState) (_ sandbox.Sandbox, ok bool, err error) {
	dir := d.dir(st.ID)
	waited, err := waitDump(st.PauseImages, dumpTimeout)
	if err != nil {
		return nil, true, fmt.Errorf("adopt %s: %w", st.ID, err)
	}
	if fd, err := openInit(st, 0); err == nil {
		if waited {
			// A dump that ended after all kills the processes: the
			// init may still be on its way out.
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			_, _ = unix.Poll(p, int((5 * time.Second).Milliseconds()))
		}
		unix.Close(fd)
	}
	if fd, err := openInit(st, 0); err == nil {
		unix.Close(fd)
		d.log.Warn("pause_checkpoint_dropped", "sandbox", st.ID, "reason", "its init still runs: the pause's dump did not end it")
		images := st.PauseImages
		st.Paused, st.PauseImages = false, ""
		return nil, false, errors.Join(st.save(dir), os.RemoveAll(images))
	}
	meta, pending := filepath.Join(st.PauseImages, pauseMetaFile), filepath.Join(st.PauseImages, pauseMetaPending)
	if _, err := os.Stat(meta); errors.Is(err, os.ErrNotExist) {
		// Its gateway died after the dump, before it said so: criu's
		// own mark says whether the images are whole.
		if _, derr := os.Stat(filepath.Join(st.PauseImages, criuDumped)); derr == nil {
			if err := errors.Join(os.Rename(pending, meta), chmodImages(st.PauseImages)); err != nil {
				return nil, true, fmt.Errorf("adopt %s: %w", st.ID, err)
			}
			d.log.Warn("pause_checkpoint_recovered", "sandbox", st.ID, "reason", "its gateway ended after the dump, before it completed the pause")
		}
	}
	if _, err := os.Stat(meta); err != nil {
		return nil, true, fmt.Errorf("adopt %s: %w: its processes ended in a pause whose checkpoint is not whole: %w", st.ID, os.ErrNotExist, err)
	}
	d.mu.Lock()
	if owner, used := d.slots[st.Slot]; used && owner != st.ID || st.Slot <= 0 || st.Slot >= maxSlots {
		d.mu.Unlock()
		return nil, true, fmt.Errorf("adopt %s: uid range %d is taken", st.ID, st.Slot)
	}
	d.slots[st.Slot] = st.ID
	d.mu.Unlock()
	st.Pid, st.StartTime = 0, 0
	sb := newLinuxSandbox(d, st)
	sb.stopping = true // no init until Unpause
	d.noteUnfiltered(st)
	return sb, true, nil
}

// CanCheckpointPause implements sandbox.CheckpointPauser.
func (s *linuxSandbox) CanCheckpointPause() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.d.cfg.Checkpoint && !s.d.cfg.PauseFreeze && !s.closed && !s.st.Paused && s.d.checkpointable(s.st) == nil
}

// Release implements sandbox.Releaser for a kept process: its streams and
// control connection close here, without the EOF or kill a Close or Kill
// would send; the init keeps it for a Reattach.
func (p *initProcess) Release() {
	if !p.kept {
		return
	}
	p.shrinkPipes()
	if ks, ok := p.stdin.(*keptStdin); ok {
		ks.once.Do(func() {}) // no EOF
		ks.File.Close()
	} else if p.stdin != nil {
		p.stdin.Close()
	}
	for _, r := range []io.Closer{p.stdout, p.stderr} {
		if r != nil {
			r.Close()
		}
	}
	p.conn.Close()
	if p.untrack != nil {
		p.untrack()
	}
}

// PauseConnWait bounds how long a pause by checkpoint waits for the
// gateway's connections to the sandbox's processes to close: those of
// commands whose channel the pause ended (an SSH shell or exec, which
// gets SIGHUP as when its connection drops, and ends), and of commands
// that just ended. One still open then makes the pause a freeze. An SSH
// shell on a terminal took over 1 s to end after its SIGHUP once, under
// CI's load (the pause then a freeze, TestPauseCheckpointKeepsProcesses):
// the bound only delays a pause that becomes a freeze anyway.
const PauseConnWait = 3 * time.Second

// openConns counts the control connections among socks (the init's, with
// their copies) whose gateway end is open, waiting up to PauseConnWait
// for them to close.
func openConns(socks []initSock) int {
	deadline := time.Now().Add(PauseConnWait)
	for {
		n := 0
		for _, sk := range socks {
			if sk.listening || sk.dup == nil {
				continue
			}
			p := []unix.PollFd{{Fd: int32(sk.dup.Fd()), Events: unix.POLLRDHUP}}
			if k, err := unix.Poll(p, 0); err == nil && k == 1 && p[0].Revents&(unix.POLLHUP|unix.POLLRDHUP) != 0 {
				continue // the gateway's end is closed
			}
			n++
		}
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dirBytes is the size of the files in dir (for the log).
func dirBytes(dir string) int64 {
	entries, _ := os.ReadDir(dir)
	var n int64
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// dumpLockFile, among a pause's images, is locked (flock) by the gateway
// and the criu that dumps the sandbox, for as long as either runs.
const dumpLockFile = "dump.lock"

// lockDump creates and locks the dump's lock file in images dir dir; the
// caller gives it to criu and closes its own.
func lockDump(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, dumpLockFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint: lock the dump: %w", err)
	}
	return f, nil
}

// waitDump waits, up to timeout, for the criu that dumps into images dir
// dir to end (a dump that an earlier gateway began, and that outlived
// it). waited says there was one.
func waitDump(dir string, timeout time.Duration) (waited bool, err error) {
	f, err := os.Open(filepath.Join(dir, dumpLockFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("the pause's dump: %w", err)
	}
	defer f.Close()
	deadline := time.Now().Add(timeout)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return waited, unix.Flock(int(f.Fd()), unix.LOCK_UN)
		case !errors.Is(err, unix.EWOULDBLOCK):
			return waited, fmt.Errorf("the pause's dump: %w", err)
		case time.Now().After(deadline):
			return waited, fmt.Errorf("the pause's dump still runs after %v", timeout)
		}
		waited = true
		time.Sleep(50 * time.Millisecond)
	}
}
