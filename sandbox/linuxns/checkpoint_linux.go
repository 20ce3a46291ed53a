//go:build linux

package linuxns

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/internal/mountinfo"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// checkpointsDir, under the driver's dir, holds the CRIU images of the
// checkpoints under way: the gateway's own files (root, 0700), which no
// sandbox reaches.
const checkpointsDir = ".checkpoints"

// dumpTimeout bounds one CRIU dump, which the caller's context does not
// cut short (Checkpoint).
const dumpTimeout = 5 * time.Minute

// checkpoint is a checkpointable sandbox's CRIU image, and its workspace
// (sandbox.Checkpoint).
type checkpoint struct {
	d *Driver
	// dir holds the images (0711, so that the restored processes, in
	// their user namespace, find that an image they may look for is
	// missing; every file 0600 root).
	dir string
	src sandboxState
	// mounts are the mountpoints of the sandbox's binds of host files
	// (the host's /usr, /etc's entries, /dev's devices, the workspace,
	// the init's binary): CRIU leaves them out of the image, and a
	// restore binds them again.
	mounts []string
	// mountTable is the sandbox's whole mount table at the dump, which a
	// restore's must match (checkMounts).
	mountTable []mountRec
	// root is the top of the sandbox's root tmpfs (CRIU keeps no root
	// mount's files): a restore makes it again.
	root []rootEntry
	// listener is the inode of the init's control socket, which CRIU
	// leaves out (--external unix) and a restore replaces by the new
	// sandbox's (--inherit-fd).
	listener uint64
	// conns are the init's control connections open at the dump (the
	// gateway's commands in flight, followed kept processes): a restore
	// gives each a socket whose peer is closed, so that the new init sees
	// its gateway gone: it ends those commands, and keeps kept ones for
	// a Reattach.
	conns []uint64
	// controllers are the cgroup controllers the sandbox's cgroups use.
	controllers []string

	mu      sync.Mutex
	closed  bool
	readers int // restores under way: the images are 0644 while there are some
	// restoring counts the Restores under way; daemons are the pids of
	// the lazy-pages daemons running, behind those held back at lazyNice
	// (holdBack) until none is, or behindTimer lets them go.
	restoring   int
	daemons     map[*lazyPages]int
	behind      map[*lazyPages]struct{}
	behindTimer *time.Timer
	// shared, when set, names the images whose files (inodes) this
	// checkpoint shares with others: a pause's and the forks' made of it
	// (pausedCheckpoint's hard links). Their restores count together
	// (Driver.sharedReaders), so that one ending does not make the
	// images 0600 under another's criu.
	shared string
	// loUp, once loUpOnce has run, says whether the criu brings the
	// loopback of the restored network namespace up itself (criuLoUp).
	loUpOnce sync.Once
	loUp     bool
	// lazy, once lazyOnce has run, says whether a fork's restore copies
	// memory on demand (criuLazy); lazyRuns counts the lazy-pages
	// daemons still serving restores of the images, or whose end
	// finishLazy is dealing with, which Close waits for.
	lazyOnce sync.Once
	lazy     bool
	lazyRuns sync.WaitGroup
}

// sharedReaders counts the restores under way of images that checkpoints
// share (checkpoint.shared), and the dirs they read them from.
type sharedReaders struct {
	n    int
	dirs map[string]int
}

type rootEntry struct {
	name, link string
	dir        bool
}

// criuPath is the criu binary (sandbox.Config.CRIU).
func (d *Driver) criuPath() (string, error) {
	name := d.cfg.CRIU
	if name == "" {
		name = "criu"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: criu: %w", sandbox.ErrNoCheckpoint, err)
	}
	return p, nil
}

// checkCRIU checks, for Config.Checkpoint, that the criu binary is 4.x
// or newer (Debian bookworm's 3.17 cannot start on newer kernels), and
// that nsenter and ip, which a restore runs, are there.
func (d *Driver) checkCRIU() error {
	criu, err := d.criuPath()
	if err != nil {
		return fmt.Errorf("--checkpoint: %w", err)
	}
	out, err := exec.Command(criu, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("--checkpoint: %s --version: %w", criu, err)
	}
	v, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(string(out)), "Version: "), "\n")
	major, _, _ := strings.Cut(v, ".")
	if n, err := strconv.Atoi(major); err != nil || n < 4 {
		return fmt.Errorf("--checkpoint needs CRIU 4.x or newer: %s is %q", criu, v)
	}
	for _, tool := range []string{"nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("--checkpoint: %w (util-linux's nsenter and iproute2's ip)", err)
		}
	}
	if !d.criuMarksOf(criu).patched {
		// Said once at start, not first at a failed dump: the operator
		// learns what this criu cannot do before a user asks for it.
		d.log.Warn("criu_unpatched", "criu", criu, "version", v,
			"effect", "a fork of a fork and a pause after a resume by checkpoint fall back (fork_unsupported, a freeze): build criu with .ci/build-criu (docs/fork.md)")
	}
	return nil
}

// Checkpoint implements sandbox.Checkpointer: CRIU dumps the sandbox's
// whole process tree, which keeps running (--leave-running), and, while
// CRIU holds it stopped, a post-dump script copies the workspace's image.
func (s *linuxSandbox) Checkpoint(ctx context.Context) (_ sandbox.Checkpoint, err error) {
	d := s.d
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	st := *s.st
	closed := s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return nil, sandbox.ErrClosed
	case st.Paused && st.PauseImages != "":
		return d.pausedCheckpoint(st) // its processes are in its images already
	case st.Paused:
		return nil, sandbox.ErrPaused
	}
	if err := d.checkpointable(&st); err != nil {
		return nil, err
	}
	if err := s.waitLazy(ctx); err != nil {
		return nil, err
	}
	criu, err := d.criuPath()
	if err != nil {
		return nil, err
	}
	ph := newPhases()
	c, err := d.prepareCheckpoint(st)
	if err != nil {
		return nil, err
	}
	if c.dir, err = d.newCheckpointDir(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(c.dir)
		}
	}()
	script := filepath.Join(c.dir, "post-dump.sh")
	if err := os.WriteFile(script, []byte(postDumpScript(st.Workspace, st.Image, c.workspaceImage())), 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	args := []string{"dump", "-t", strconv.Itoa(st.Pid), "-D", c.dir, "-o", "dump.log", "-v2",
		"--leave-running", "--tcp-close", "--network-lock", "skip", "--empty-ns", "net", "--action-script", script,
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
	ph.mark("prepare")
	// Read while criu dumps (it runs on one core), for the restores.
	go c.criuLoUp(criu)
	// The caller going away (a client that hangs up) must not kill criu
	// in the middle of a dump: the source's processes are seized then,
	// its parasite code in them. Only a dump that hangs is killed.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dumpTimeout)
	defer cancel()
	if err := c.run(dctx, criu, args, filepath.Join(c.dir, "dump.log"), nil, ph); err != nil {
		return nil, d.redumpFailed(&st, fmt.Errorf("checkpoint of %s: %w", st.ID, err))
	}
	ph.mark("criu")
	if _, err := os.Stat(c.workspaceImage()); err != nil {
		return nil, fmt.Errorf("checkpoint of %s: the workspace was not copied: %w", st.ID, err)
	}
	if err := chmodImages(c.dir); err != nil {
		return nil, err
	}
	ph.mark("chmod")
	d.log.Info("sandbox_checkpointed", append([]any{"sandbox", st.ID}, ph.attrs()...)...)
	return c, nil
}

// checkpointable says why sandbox st cannot be checkpointed (nil: it
// can): Checkpoint's and a pause's conditions.
func (d *Driver) checkpointable(st *sandboxState) error {
	switch {
	case st.Stopped:
		return fmt.Errorf("%w: it is stopped", sandbox.ErrNoCheckpoint)
	case !st.Checkpoint:
		return fmt.Errorf("%w: its init was not built for it (serve --checkpoint)", sandbox.ErrNoCheckpoint)
	case st.Boot == nil || st.Boot.Image != nil:
		return fmt.Errorf("%w: a sandbox on an image is not checkpointed yet", sandbox.ErrNoCheckpoint)
	case st.Image == "":
		return fmt.Errorf("%w: its workspace is a tmpfs (no ext4 image on this host)", sandbox.ErrNoCheckpoint)
	case st.Restored && d.noRedump.Load():
		return errNoRedump
	}
	return nil
}

// criuNoRedump are what a CRIU 4.2 without .ci/criu-patches says when it
// cannot dump a tree it restored (docs/pause.md, "CRIU on this kernel"):
// it opens the init's namespaces from inside the sandbox's user
// namespace, which the kernel's ptrace check refuses for a non-dumpable
// task whose memory map belongs to the host's user namespace (CRIU made
// it by fork from itself); and it cannot dump the init's control socket,
// which the restore handed it from the gateway's network namespace.
var criuNoRedump = []*regexp.Regexp{
	regexp.MustCompile(`doesn't belong to the target user namespace`),
	regexp.MustCompile(`unix: Unix socket \d+ not found`),
}

var errNoRedump = fmt.Errorf("%w: its processes were restored from a checkpoint (a fork, or a resume from a pause by checkpoint), which this criu cannot dump again (a fork of a fork: it needs the patches .ci/build-criu applies); a stop and a start make it checkpointable again", sandbox.ErrNoCheckpoint)

// criuPatchMark is a string patch 0002 of .ci/criu-patches adds to criu
// (a line of its log): a criu binary that holds it was built with the
// patches, and dumps a tree it restored.
const criuPatchMark = "of a foreign netns at %d as external"

// criuMarks says which of the strings patches of .ci/criu-patches add a
// criu binary holds.
type criuMarks struct {
	patched bool // criuPatchMark (0002)
	loUp    bool // criuLoUpMark (0005)
	lazy    bool // criuLazyMark (0006)
}

// readCRIUMarks reads the criu binary at path (some 6 MB) for its marks:
// none where it cannot be read.
func readCRIUMarks(path string) criuMarks {
	b, err := os.ReadFile(path)
	if err != nil {
		return criuMarks{}
	}
	return criuMarks{
		patched: bytes.Contains(b, []byte(criuPatchMark)),
		loUp:    bytes.Contains(b, []byte(criuLoUpMark)),
		lazy:    bytes.Contains(b, []byte(criuLazyMark)),
	}
}

// criuMarkCache holds a driver's criuMarks by binary: a path's are read
// again only when the file it names is another (its device, inode, size
// or mtime changed), and not kept when it changed while read.
type criuMarkCache struct {
	mu sync.Mutex
	m  map[string]criuMarkEntry
}

type criuMarkEntry struct {
	id    criuFileID
	marks criuMarks
}

// criuFileID is what tells two versions of a file apart.
type criuFileID struct {
	dev, ino uint64
	size     int64
	mtime    int64 // ns
}

func statCRIU(path string) (criuFileID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return criuFileID{}, false
	}
	return criuFileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}, true
}

// criuMarksOf is readCRIUMarks(path), read once per binary (criuMarkCache)
// by a driver; a nil driver (a test's bare checkpoint) reads each time.
func (d *Driver) criuMarksOf(path string) criuMarks {
	if d == nil {
		return readCRIUMarks(path)
	}
	c := &d.criuMarks
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := statCRIU(path)
	if !ok {
		return criuMarks{}
	}
	if e, hit := c.m[path]; hit && e.id == id {
		return e.marks
	}
	marks := readCRIUMarks(path)
	if after, ok := statCRIU(path); ok && after == id {
		if c.m == nil {
			c.m = make(map[string]criuMarkEntry)
		}
		c.m[path] = criuMarkEntry{id: id, marks: marks}
	}
	return marks
}

// redumpFailed is the error of a dump of sandbox st that failed with err:
// where CRIU restored st's tree and says it cannot dump it (criuNoRedump),
// and the criu is one without .ci/criu-patches, the driver stops trying for
// every restored sandbox, logs CRIU's lines, and says why
// (sandbox.ErrNoCheckpoint) without them (host paths, pids). The lines
// alone do not decide it: a sandbox's own processes can make CRIU print
// them (a file's name, which CRIU's log quotes, such as that of a deleted
// file too big to dump; a unix socket of a network namespace not the
// sandbox's, where its processes could make one), and one sandbox's
// failure must not turn the dumps of every other restored one off.
func (d *Driver) redumpFailed(st *sandboxState, err error) error {
	if !st.Restored || !slices.ContainsFunc(criuNoRedump, func(re *regexp.Regexp) bool { return re.MatchString(err.Error()) }) {
		return err
	}
	if criu, cerr := d.criuPath(); cerr == nil && d.criuMarksOf(criu).patched {
		return err
	}
	if !d.noRedump.Swap(true) {
		d.log.Warn("criu_cannot_redump", "sandbox", st.ID, "err", err)
	}
	return errNoRedump
}

// prepareCheckpoint reads what a dump of running sandbox st leaves out
// and a restore puts back: its binds of host files, its root's top, its
// init's control sockets, its cgroup controllers.
func (d *Driver) prepareCheckpoint(st sandboxState) (*checkpoint, error) {
	c := &checkpoint{d: d, src: st}
	c.src.Cgroups = slices.Clone(st.Cgroups)
	var err error
	if c.mounts, err = hostMounts(st.Pid); err != nil {
		return nil, err
	}
	etcDir := ""
	if st.EtcDir != "" {
		if etcDir, err = d.etcDirs.path(st.EtcDir); err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
	}
	if err := checkHostBinds(st.Pid, c.mounts, etcDir); err != nil {
		return nil, err
	}
	if c.mountTable, err = readMounts(st.Pid); err != nil {
		return nil, err
	}
	if c.root, err = rootEntries(st.Pid); err != nil {
		return nil, err
	}
	if c.listener, c.conns, err = initSockets(st.Pid); err != nil {
		return nil, err
	}
	c.controllers = controllersOf(st.Cgroups)
	return c, nil
}

// newCheckpointDir makes a checkpoint's images dir under the driver's
// checkpoints dir, 0711 (see checkpoint.dir).
func (d *Driver) newCheckpointDir() (string, error) {
	parent := filepath.Join(d.root, checkpointsDir)
	if err := mkdirSpread(parent, 0o700); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "ck-")
	if err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", errors.Join(fmt.Errorf("checkpoint: %w", err), os.RemoveAll(dir))
	}
	return dir, nil
}

// criuLibsDir, in the driver's dir, is the empty dir criu looks for its
// plugins in (runCRIU).
const criuLibsDir = ".criu-libs"

// workspaceImage is the copy of the workspace's image the dump made.
func (c *checkpoint) workspaceImage() string { return filepath.Join(c.dir, "workspace.img") }

// postDumpScript is CRIU's action script for a dump: once the processes
// are dumped, and before CRIU lets them run again, it copies the
// workspace's image (its filesystem synced first): the copy is the
// workspace exactly as the dumped processes saw it.
func postDumpScript(mnt, image, dst string) string {
	return "#!/bin/sh\n" +
		"[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n" +
		"sync -f " + shellQuote(mnt) + " && cp --sparse=always --reflink=auto " + shellQuote(image) + " " + shellQuote(dst) + "\n"
}

// restoreScript is CRIU's action script for a restore by a criu without
// patch 0005 of .ci/criu-patches (criuLoUp): the network namespace is
// restored empty (--empty-ns net: CRIU saves and restores no addresses,
// routes or firewall rules, each an external command), so it brings the
// loopback up before the sockets are restored; the gateway sets the rest
// up as for a new sandbox (its egress, TransparentNet).
const restoreScript = "#!/bin/sh\n" +
	"[ \"$CRTOOLS_SCRIPT_ACTION\" = setup-namespaces ] || exit 0\n" +
	"exec nsenter -t \"$CRTOOLS_INIT_PID\" -n ip link set lo up\n"

// criuLoUpMark is the line patch 0005 of .ci/criu-patches adds to criu's
// log: a criu that holds it brings the loopback of a network namespace it
// restores empty up itself, as restoreScript does, and a restore runs no
// action script (CRIU ran it at each of its 7 steps, a /bin/sh each, and
// nsenter and ip once).
const criuLoUpMark = "empty netns: lo up"

// criuLoUp says whether the criu binary at path holds criuLoUpMark,
// asked once per checkpoint, and read once per binary by the driver
// (criuMarksOf).
func (c *checkpoint) criuLoUp(path string) bool {
	c.loUpOnce.Do(func() { c.loUp = c.d.criuMarksOf(path).loUp })
	return c.loUp
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// mountKey names a bind of a host file in the image (--external mnt).
func mountKey(mp string) string { return "m" + mp }

// run runs criu with args, and on failure returns its log's errors.
// ph, if not nil, gets the CPU time criu and its children took.
func (c *checkpoint) run(ctx context.Context, criu string, args []string, log string, extra []*os.File, ph *phases) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with the goroutine
		// (runCRIU takes it back to the gateway's mounts first, for the
		// main thread, which is parked instead).
		runtime.LockOSThread()
		errc <- c.d.runCRIU(ctx, criu, args, log, extra, ph, criuHooks{})
	}()
	return <-errc
}

// kdatFile is CRIU's cache of what it probed of the kernel (its
// kerndat), which it keeps only on a tmpfs; kdatMax bounds what the
// driver keeps of it.
const (
	kdatFile = "/run/criu.kdat"
	kdatMax  = 1 << 20
)

// criuWaitDelay bounds how long a criu run waits, once criu has ended
// or its deadline has passed, for what it forked to let go of its output.
const criuWaitDelay = 5 * time.Second

// runCRIU runs criu on the calling thread, which must be locked and
// discarded after, in a mount namespace of its own (private): CRIU mounts
// its cgroup yard and its mount namespace's workings there, never where
// the host, or a gateway detecting cgroups, sees them. Its /run there is
// a tmpfs of its own holding the driver's copy of CRIU's kerndat cache:
// CRIU probes the kernel (some 25 ms) only when it has none, and keeps it
// only on a tmpfs, which the host's /run need not be; a criu that writes
// a new one (the first; one of a new criu binary) gives the driver its
// copy. Where the host's /run is a tmpfs (CRIU keeps its cache there
// itself), or holds a path criu needs (ownRun), criu sees the host's.
func (d *Driver) runCRIU(ctx context.Context, criu string, args []string, log string, extra []*os.File, ph *phases, hooks criuHooks) (err error) {
	home, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("criu: the gateway's mounts: %w", err)
	}
	defer unix.Close(home)
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("criu: unshare mounts: %w", err)
	}
	defer func() {
		if herr := unix.Setns(home, unix.CLONE_NEWNS); herr != nil {
			err = errors.Join(err, fmt.Errorf("criu: back to the gateway's mounts: %w", herr))
		}
	}()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("criu: private mounts: %w", err)
	}
	cache := d.ownRun(criu) && unix.Mount("tmpfs", filepath.Dir(kdatFile), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=4m") == nil
	d.kdatMu.Lock()
	kdat := d.kdat
	d.kdatMu.Unlock()
	if cache && kdat != nil {
		if err := os.WriteFile(kdatFile, kdat, 0o600); err != nil {
			return fmt.Errorf("criu: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, criu, args...)
	cmd.ExtraFiles = extra
	// criu loads no plugin (CRIU_LIBS_DIR: an empty dir of the driver's),
	// whatever a criu package put in /usr/lib/criu: the driver uses none,
	// and a static criu, as .ci/build-criu builds, cannot load them.
	libs := filepath.Join(d.root, criuLibsDir)
	if err := os.Mkdir(libs, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("criu: %w", err)
	}
	cmd.Env = append(os.Environ(), "CRIU_LIBS_DIR="+libs)
	if args[0] == "dump" && slices.Contains(args, "--action-script") {
		// A dump's script (postDumpScript) acts at post-dump only: a criu
		// with .ci/criu-patches 0010 runs it then alone, not at each of
		// the dump's four actions (a shell each); any other criu ignores
		// the variable.
		cmd.Env = append(cmd.Env, "CRIU_SCRIPT_ACTIONS=post-dump")
	}
	// criu forks helpers (its cgroup and user namespace daemons, the
	// tasks it restores) that share its output pipe: a criu killed at the
	// deadline left them holding it, and Wait waiting for them forever. Its
	// whole process group goes, and Wait gives up on the pipe criuWaitDelay
	// after criu ended.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = criuWaitDelay
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Start()
	if err == nil {
		if hooks.started != nil {
			hooks.started(cmd.Process.Pid)
		}
		if hooks.exited != nil {
			waitExit(cmd.Process.Pid)
			hooks.exited()
		}
		err = cmd.Wait()
	}
	if ph != nil && cmd.ProcessState != nil {
		ph.add("criu_cpu", cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
	}
	if err != nil {
		return fmt.Errorf("criu %s: %w: %s", args[0], err, criuErrors(log, out.String()))
	}
	if cache {
		if b, err := os.ReadFile(kdatFile); err == nil && len(b) > 0 && len(b) <= kdatMax && !bytes.Equal(b, kdat) {
			d.kdatMu.Lock()
			d.kdat = b
			d.kdatMu.Unlock()
		}
	}
	return nil
}

// criuHooks are what runCRIU calls in a criu's life: started once it
// runs, with its pid; exited once it has ended, before it is reaped, so
// that its pid names no other process until exited returns.
type criuHooks struct {
	started func(pid int)
	exited  func()
}

// waitExit waits until the child pid has ended, without reaping it
// (WNOWAIT): its pid stays its own until the caller's Wait.
func waitExit(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// ownRun says whether criu gets a /run of its own (runCRIU): not where
// the host's is a tmpfs already, nor where it would hide what criu
// needs there: the criu binary (NixOS keeps binaries under /run), the
// images (the data dir), the restores' stages (the temporary dir).
func (d *Driver) ownRun(criu string) bool {
	run := filepath.Dir(kdatFile)
	var fs unix.Statfs_t
	if err := unix.Statfs(run, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		return false
	}
	for _, p := range []string{criu, d.root, d.stagesDir()} {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if p == run || strings.HasPrefix(p, run+"/") {
			return false
		}
	}
	return true
}

// criuErrors is the error lines of CRIU's log (at most 10), for an error
// message. A dump's whole log stays in the checkpoint's dir until Close; a
// restore's goes with its image set, its end kept in the gateway's log
// (criuRestore).
func criuErrors(log, out string) string {
	b, _ := os.ReadFile(log)
	var lines []string
	for l := range strings.SplitSeq(string(b)+"\n"+out, "\n") {
		if strings.Contains(l, "Error") && !strings.Contains(l, "RLIMIT_NOFILE") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "; ")
}

// criuLogTail bounds what the gateway's log keeps of a failed restore's
// CRIU log: its last lines.
const criuLogTail = 8 << 10

// logTail is the end of the file at path, at most limit bytes of it, from
// the start of a line; "" when it cannot be read.
func logTail(path string, limit int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-limit, 0)
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	b = b[:n]
	if off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(bytes.TrimRight(b, "\n"))
}

// chmodImages makes every file of the images root's, 0600.
func chmodImages(dir string) error { return ownImages(dir, 0, 0o600) }

// ownImages gives every file of the images to uid, with mode.
func ownImages(dir string, uid int, mode os.FileMode) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("checkpoint images: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Chown(p, uid, uid); err != nil {
			return fmt.Errorf("checkpoint images: %w", err)
		}
		if err := os.Chmod(p, mode); err != nil {
			return fmt.Errorf("checkpoint images: %w", err)
		}
	}
	return nil
}

// hostMounts lists the mountpoints, in process pid's mount namespace, of
// what is not the sandbox's own (tmpfs, proc, devpts): binds of the
// host's files.
func hostMounts(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var mps []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		m, ok := mountinfo.Parse(line)
		if !ok {
			return nil, fmt.Errorf("checkpoint: mountinfo line %q", line)
		}
		switch m.FSType {
		case "tmpfs", "proc", "devpts", "mqueue":
			continue
		}
		if m.Point == "/" {
			return nil, fmt.Errorf("%w: its root is a %s mount", sandbox.ErrNoCheckpoint, m.FSType)
		}
		mps = append(mps, m.Point)
	}
	return mps, nil
}

// checkHostBinds checks that each bind of a host file in process pid's
// mount namespace (hostMounts; but for the workspace and the init's
// binary, which a restore binds from its own) shows the host's file at
// the same path, or at /etc, with etcDir, the gateway's /etc dir
// (etcDirs): a restore binds the host's path named by the mountpoint
// (--external mnt), so no mount of the sandbox's state may choose what of
// the host a fork sees.
func checkHostBinds(pid int, mps []string, etcDir string) error {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer unix.Close(root)
	for _, mp := range mps {
		if mp == "/workspace" || mp == selfMount {
			continue
		}
		var in, host unix.Stat_t
		fd, err := unix.Openat2(root, strings.TrimPrefix(mp, "/"), &unix.OpenHow{
			Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
		if err == nil {
			err = unix.Fstat(fd, &in)
			unix.Close(fd)
		}
		hostPath := mp
		if mp == "/etc" && etcDir != "" {
			hostPath = etcDir
		}
		if err == nil {
			err = unix.Stat(hostPath, &host)
		}
		if err != nil || in.Dev != host.Dev || in.Ino != host.Ino {
			return fmt.Errorf("%w: its mount at %s is not the host's %s (%v)", sandbox.ErrNoCheckpoint, mp, hostPath, err)
		}
	}
	return nil
}

// rootEntries lists the top of process pid's root.
func rootEntries(pid int) ([]rootEntry, error) {
	root := fmt.Sprintf("/proc/%d/root", pid)
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var out []rootEntry
	for _, e := range entries {
		r := rootEntry{name: e.Name(), dir: e.IsDir()}
		if e.Type()&fs.ModeSymlink != 0 {
			if r.link, err = os.Readlink(filepath.Join(root, e.Name())); err != nil {
				return nil, fmt.Errorf("checkpoint: %w", err)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// initSockets finds the inode of the init's control socket (the one
// listening Unix socket among its descriptors) and those of its other Unix
// sockets: control connections, whose peer is the gateway.
func initSockets(pid int) (listener uint64, conns []uint64, err error) {
	socks, err := initUnixSockets(pid, false)
	if err != nil {
		return 0, nil, err
	}
	for _, sk := range socks {
		switch {
		case sk.listening && listener == 0:
			listener = sk.ino
		case !slices.Contains(conns, sk.ino):
			conns = append(conns, sk.ino)
		}
	}
	if listener == 0 {
		return 0, nil, errors.New("checkpoint: the init has no listening control socket")
	}
	return listener, conns, nil
}

// initSock is one Unix socket among the init's descriptors.
type initSock struct {
	fd        int    // the init's descriptor
	ino       uint64 // the socket's inode
	listening bool
	// dup is the gateway's own descriptor of it (initUnixSockets' keep),
	// or nil.
	dup *os.File
}

// initUnixSockets lists the Unix sockets among process pid's descriptors.
// Each is asked itself, through a copy of the descriptor (pidfd_getfd),
// whether it is a Unix socket and whether it listens: wherever the
// socket was made (the sandbox's network namespace, the host's for a
// restored init's control socket, which the gateway made, or a namespace
// gone since), so that a restored sandbox can be checkpointed again.
// With keep, each socket's copy is kept (dup); the caller closes them.
func initUnixSockets(pid int, keep bool) (_ []initSock, err error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer unix.Close(pidfd)
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var out []initSock
	defer func() {
		if err != nil {
			closeSocks(out)
		}
	}()
	for _, e := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		ino, err1 := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64)
		fd, err2 := strconv.Atoi(e.Name())
		if err1 != nil || err2 != nil {
			continue
		}
		dup, err := unix.PidfdGetfd(pidfd, fd, 0)
		if errors.Is(err, unix.EBADF) {
			continue // closed since it was listed (a command that ended)
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint: the init's descriptor %d: %w", fd, err)
		}
		// The socket the descriptor holds now, which may not be the one
		// listed (its number taken again since).
		var fst unix.Stat_t
		if err := unix.Fstat(dup, &fst); err != nil {
			unix.Close(dup)
			return nil, fmt.Errorf("checkpoint: the init's descriptor %d: %w", fd, err)
		}
		ino = fst.Ino
		domain, derr := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_DOMAIN)
		acc, aerr := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		if derr != nil || aerr != nil || domain != unix.AF_UNIX {
			unix.Close(dup)
			continue
		}
		sk := initSock{fd: fd, ino: ino, listening: acc != 0}
		if keep {
			sk.dup = os.NewFile(uintptr(dup), "socket:["+strconv.FormatUint(ino, 10)+"]")
		} else {
			unix.Close(dup)
		}
		out = append(out, sk)
	}
	return out, nil
}

// closeSocks closes the gateway's copies of socks.
func closeSocks(socks []initSock) {
	for _, sk := range socks {
		if sk.dup != nil {
			sk.dup.Close()
		}
	}
}

// controllersOf names the cgroup v1 controllers of the sandbox's cgroup
// directories (/sys/fs/cgroup/<controllers>/sandgate/<id>...).
func controllersOf(dirs []string) []string {
	var out []string
	for _, dir := range dirs {
		i := strings.Index(dir, "/sandgate/")
		if i < 0 {
			continue
		}
		for c := range strings.SplitSeq(filepath.Base(dir[:i]), ",") {
			if c != "" && c != "unified" && !strings.HasPrefix(c, "cgroup") && !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// Close implements sandbox.Checkpoint: the images are deleted, once no
// lazy-pages daemon reads them.
func (c *checkpoint) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.lazyRuns.Wait()
	return os.RemoveAll(c.dir)
}

// Restore implements sandbox.Checkpoint. The new sandbox gets a uid range,
// cgroups (with spec's limits), control socket and workspace of its own
// (a copy of the checkpoint's, owned by its range); CRIU restores the
// processes in new namespaces, with the new user namespace's map, then the
// driver adopts the new init as it would after a restart.
func (c *checkpoint) Restore(ctx context.Context, spec sandbox.Spec) (_ sandbox.Sandbox, err error) {
	d := c.d
	if !sandbox.ValidID(spec.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", spec.ID)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, sandbox.ErrClosed
	}
	criu, err := d.criuPath()
	if err != nil {
		return nil, err
	}
	c.restoreBegins()
	defer c.restoreDone()
	ctx, cancel := withInitTimeout(ctx)
	defer cancel()
	slot, dir, err := d.newSandboxDir(spec.ID)
	if err != nil {
		return nil, err
	}
	st := &sandboxState{
		ID: spec.ID, Slot: slot, UIDBase: hostIDBase + slot*idRange,
		Workspace: filepath.Join(dir, "workspace"), Image: filepath.Join(dir, "workspace.img"),
		Socket:  filepath.Join(dir, "control.sock"),
		Cgroups: d.cg.DirsFor(spec.ID), Created: time.Now().UTC(), Protocol: c.src.Protocol,
		Seccomp: c.src.Seccomp, KeepJobs: c.src.KeepJobs, KeepPTY: c.src.KeepPTY, KeepLater: c.src.KeepLater, Checkpoint: true, Restored: true,
	}
	lim := spec.Limits.Or(d.limits)
	lim.WorkspaceBytes = c.src.Boot.Limits.WorkspaceBytes // the copy's size
	st.Boot = &bootSpec{Limits: lim, TrustPEM: c.src.Boot.TrustPEM}
	st.EtcDir = c.src.EtcDir // bound again (stage)
	sb := newLinuxSandbox(d, st)
	adopted := false
	defer func() {
		if !adopted {
			// A criu that failed, or was killed (ctx), after it made some
			// of the processes (restore -d runs them detached) leaves them
			// in the new cgroups, where no pid of st's names them.
			cgroup.KillProcs(st.Cgroups)
			err = errors.Join(err, sb.teardown())
		}
	}()
	if err := st.save(dir); err != nil {
		return nil, err
	}
	ph := newPhases()
	if err := c.copyWorkspace(st); err != nil {
		return nil, err
	}
	ph.mark("workspace")
	if _, err := d.cg.Create(st.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUs: lim.CPUs}); err != nil {
		return nil, err
	}
	ph.mark("cgroups")
	imgs, err := c.restoreImages(st)
	if err != nil {
		return nil, err
	}
	var lp, lazy *lazyPages
	defer func() {
		if lazy == nil {
			if lp != nil {
				lp.stop()
			}
			os.RemoveAll(imgs)
			if lp != nil {
				c.lazyRuns.Done()
			}
		}
	}()
	if c.criuLazy(criu) {
		// Its start overlaps the stage's making.
		if err := markLazy(dir); err != nil {
			return nil, err
		}
		if lp, err = c.startLazyPages(criu, imgs); err != nil {
			return nil, err
		}
	}
	stage, err := c.stage(st)
	if err != nil {
		return nil, err
	}
	defer stage.remove()
	ph.mark("stage")
	if lp != nil {
		if err := lp.listening(ctx); err != nil {
			return nil, err
		}
		ph.mark("lazy_pages")
		// Behind the other restores, if any, from here: it starts
		// copying once criu restore says the processes are made, while
		// criu and the checks below still run (lazyNice).
		c.holdBack(lp)
	}
	if err := c.criuRestore(ctx, criu, st, imgs, stage, nil, lp, ph); err != nil {
		return nil, err
	}
	if lp != nil {
		// The daemon owns imgs from here: it copies the rest of the
		// memory in, then they go. Held back now if the other restores
		// began after it listened.
		lazy = lp
		go c.finishLazy(lp, st, imgs)
		c.holdBack(lp)
	}
	if err := st.save(dir); err != nil {
		return nil, err
	}
	ph.mark("criu")
	out, err := d.adopt(ctx, st.ID, true)
	if err != nil {
		_ = d.Remove(context.WithoutCancel(ctx), st.ID)
		adopted = true // Remove did the teardown
		return nil, err
	}
	adopted = true
	if ls, ok := out.(*linuxSandbox); ok && lazy != nil {
		ls.lazy = lazy
	}
	_ = d.cg.Started(st.ID)
	ph.mark("adopt")
	d.log.Info("sandbox_restored", append([]any{"sandbox", st.ID, "from", c.src.ID}, ph.attrs()...)...)
	return out, nil
}

// criuRestore restores the checkpoint's processes into sandbox st with
// criu, from the image set imgs and the stage, and records the new init
// in st (Pid, StartTime). held, when not nil, gives the sockets the init
// had at the dump, by inode, kept open by the gateway (a pause's): the
// restored init gets them back, its gateway's connections as they were.
// Without, the init gets a new control socket at st.Socket, and each of
// its control connections a socket whose peer is closed.
func (c *checkpoint) criuRestore(ctx context.Context, criu string, st *sandboxState, imgs string, stage *restoreStage, held map[uint64]*os.File, lazy *lazyPages, ph *phases) error {
	lnf := held[c.listener]
	if lnf == nil {
		ln, err := listenUnix(st.Socket)
		if err != nil {
			return err
		}
		lnf = os.NewFile(uintptr(ln), "control.sock")
		defer lnf.Close()
	}
	pidFile := filepath.Join(c.d.dir(st.ID), "restore.pid")
	// --leave-stopped: CRIU stops every restored task (SIGSTOP, sent while
	// it still holds them at the end of their restore, before they run an
	// instruction of the image's) and so leaves them, for the check below
	// to look at a tree that cannot have acted yet.
	args := []string{"restore", "-D", imgs, "-o", "restore.log", "-v2", "-d", "--leave-stopped", "--pidfile", pidFile,
		"--root", stage.root, "--manage-cgroups=soft", "--cgroup-root", "/sandgate/" + st.ID, "--tcp-close", "--network-lock", "skip",
		"--empty-ns", "net", "--inherit-fd", fmt.Sprintf("fd[3]:socket:[%d]", c.listener)}
	if !c.criuLoUp(criu) {
		args = append(args, "--action-script", filepath.Join(imgs, "restore.sh"))
	}
	if lazy != nil {
		args = append(args, "--lazy-pages")
	}
	// The connections whose peer was gone at the dump: CRIU restores them
	// itself (peerlessConns).
	files, err := os.ReadFile(filepath.Join(imgs, "files.img"))
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	peerless, err := peerlessConns(files)
	if err != nil {
		return fmt.Errorf("restore: files image: %w", err)
	}
	extra := []*os.File{lnf}
	for _, ino := range c.conns {
		if peerless[ino] {
			continue
		}
		f := held[ino]
		if f == nil {
			// One end of a new pair, the other closed at once: the new init
			// reads the end of a gateway that is gone.
			pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("restore: %w", err)
			}
			unix.Close(pair[1])
			f = os.NewFile(uintptr(pair[0]), "gone")
			defer f.Close()
		}
		args = append(args, "--inherit-fd", fmt.Sprintf("fd[%d]:socket:[%d]", 3+len(extra), ino))
		extra = append(extra, f)
	}
	for _, mp := range c.mounts {
		host := mp
		switch mp {
		case "/workspace":
			host = stage.ws
		case selfMount:
			host = stage.init
		case "/etc":
			if stage.etc != "" {
				host = stage.etc
			}
		}
		args = append(args, "--external", "mnt["+mountKey(mp)+"]:"+host)
	}
	if err := c.readable(true); err != nil {
		return err
	}
	// The cgroups' CPU so far: an in-place restore's (a resume from a
	// pause) hold what the session took before its pause.
	cpu0 := cgroup.ReadUsage(st.Cgroups).CPUSeconds
	ph.mark("prepare")
	log := filepath.Join(imgs, "restore.log")
	err = c.run(ctx, criu, args, log, extra, ph)
	if err != nil {
		// CRIU's log goes with imgs (the caller removes them): its end
		// stays in the gateway's, for a restore that failed or hung
		// until killed, whose error says little.
		c.d.log.Warn("criu_restore_failed", "sandbox", st.ID, "from", c.src.ID, "err", err, "criu_log", logTail(log, criuLogTail))
	}
	if oerr := c.readable(false); oerr != nil {
		return errors.Join(err, oerr)
	}
	if err != nil {
		return fmt.Errorf("restore of %s as %s: %w", c.src.ID, st.ID, err)
	}
	ph.mark("criu_restore")
	// The CPU the restored tasks took in the sandbox's cgroups during
	// criu's run: none of the image's code has run (they are stopped), so
	// it is the restore's own work in them, mostly reading their memory
	// back.
	if u := cgroup.ReadUsage(st.Cgroups); u.CPUSeconds != nil && cpu0 != nil {
		ph.add("restored_cpu", time.Duration((*u.CPUSeconds-*cpu0)*float64(time.Second)))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	_ = os.Remove(pidFile)
	if st.Pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return fmt.Errorf("restore: pid file: %w", err)
	}
	if _, st.StartTime, err = procStat(st.Pid); err != nil {
		return fmt.Errorf("restored init: %w", err)
	}
	// What the images made, whatever they say (a tampered image), still
	// stopped: a refusal kills processes that never ran.
	pids, err := checkConfined(st)
	if err == nil {
		err = checkMounts(st, pids, c.mountTable)
	}
	var stopped map[int]bool
	if err == nil {
		stopped, err = stoppedAtDump(imgs)
	}
	if err != nil {
		killTree(pids)
		return fmt.Errorf("restore of %s as %s refused: %w", c.src.ID, st.ID, err)
	}
	ph.mark("confined")
	if err := continueTree(pids, stopped); err != nil {
		killTree(pids)
		return fmt.Errorf("restore of %s as %s: %w", c.src.ID, st.ID, err)
	}
	ph.mark("continue")
	return nil
}

// taskStopped is CRIU's task_state of a task stopped at the dump
// (COMPEL_TASK_STOPPED).
const taskStopped = 3

// stoppedAtDump reads, from the core images in imgs (core-<pid>.img, a
// task's CoreEntry), the pids (in the sandbox's pid namespace, which CRIU
// restores unchanged) of the tasks that were stopped at the dump (kill
// -STOP, a shell's job stopped with ^Z): with --leave-stopped CRIU stops
// them as it stops every task, and only a continue of the others leaves
// them as they were. Its answer only chooses which of the checked tasks
// stay stopped.
func stoppedAtDump(imgs string) (map[int]bool, error) {
	names, err := filepath.Glob(filepath.Join(imgs, "core-*.img"))
	if err != nil {
		return nil, fmt.Errorf("core images: %w", err)
	}
	stopped := map[int]bool{}
	for _, name := range names {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "core-"), ".img"))
		if err != nil {
			continue
		}
		b, err := readCoreImage(name)
		if err != nil {
			return nil, fmt.Errorf("core images: %w", err)
		}
		state, err := coreTaskState(b)
		if err != nil {
			return nil, fmt.Errorf("core image of %d: %w", pid, err)
		}
		if state == taskStopped {
			stopped[pid] = true
		}
	}
	return stopped, nil
}

// maxCoreEntry bounds the CoreEntry stoppedAtDump reads from a core image
// (a few KiB: registers, the FPU's state, the task's few fields), so that
// an image tampered with cannot make the gateway read gigabytes.
const maxCoreEntry = 1 << 20

// readCoreImage reads the core image at name up to the end of its
// CoreEntry (two magic words, its size, it), at most maxCoreEntry of it.
func readCoreImage(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 12)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("%s: short: %w", filepath.Base(name), err)
	}
	size := binary.LittleEndian.Uint32(b[8:12])
	if size > maxCoreEntry {
		return nil, fmt.Errorf("%s: core entry of %d bytes, more than %d", filepath.Base(name), size, maxCoreEntry)
	}
	b = append(b, make([]byte, size)...)
	if _, err := io.ReadFull(f, b[12:]); err != nil {
		return nil, fmt.Errorf("%s: short entry: %w", filepath.Base(name), err)
	}
	return b, nil
}

// coreTaskState reads a CRIU core image (two magic words, then one
// CoreEntry: a size and its protobuf) for its task's state (tc, field 3,
// a TaskCoreEntry whose task_state is field 1); 0 for a thread's image,
// which has no tc.
func coreTaskState(b []byte) (uint64, error) {
	if len(b) < 12 {
		return 0, errors.New("short")
	}
	size := binary.LittleEndian.Uint32(b[8:12])
	if uint64(len(b)) < 12+uint64(size) {
		return 0, errors.New("short entry")
	}
	var tc []byte
	if err := eachField(b[12:12+size], func(num protowire.Number, typ protowire.Type, v []byte) {
		if num == 3 && typ == protowire.BytesType {
			tc = v
		}
	}); err != nil {
		return 0, err
	}
	var state uint64
	for len(tc) > 0 {
		num, typ, n := protowire.ConsumeTag(tc)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		tc = tc[n:]
		if num == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(tc)
			if m < 0 {
				return 0, protowire.ParseError(m)
			}
			state, n = v, m
		} else if n = protowire.ConsumeFieldValue(num, typ, tc); n < 0 {
			return 0, protowire.ParseError(n)
		}
		tc = tc[n:]
	}
	return state, nil
}

// selfMount is where a checkpointable sandbox's root binds the init's
// binary (initd's selfPath).
const selfMount = "/.sandgate-init"

// copyWorkspace gives st a copy of the checkpoint's workspace, mounted,
// its files moved from the source's uid range to st's.
func (c *checkpoint) copyWorkspace(st *sandboxState) error {
	in, err := unix.Open(c.workspaceImage(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("workspace copy: %w", err)
	}
	err = copySparse(in, st.Image)
	unix.Close(in)
	if err != nil {
		return fmt.Errorf("workspace copy: %w", err)
	}
	if err := os.Mkdir(st.Workspace, 0o700); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := mountImage(st.Image, st.Workspace); err != nil {
		return err
	}
	return shiftOwners(st.Workspace, c.src.UIDBase, st.UIDBase)
}

// shiftOwners moves the owners of every file under dir from the uid range
// at from to the one at to (same offsets).
func shiftOwners(dir string, from, to int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		uid, gid := int(st.Uid), int(st.Gid)
		if uid >= from && uid < from+idRange {
			uid += to - from
		}
		if gid >= from && gid < from+idRange {
			gid += to - from
		}
		if uid == int(st.Uid) && gid == int(st.Gid) {
			return nil
		}
		if err := unix.Lchown(p, uid, gid); err != nil {
			return fmt.Errorf("workspace copy: %w", err)
		}
		// chown clears set-id bits: put them back.
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return unix.Chmod(p, st.Mode&07777)
		}
		return nil
	})
}

// restoreImages makes the image set of one restore: a directory of the
// checkpoint's holding hard links to its images (so that restores run at
// once), but for the user namespace's, rewritten so that the restored one
// maps the sandbox's ids onto st's uid range (CRIU keeps every other id as
// the sandbox sees it).
func (c *checkpoint) restoreImages(st *sandboxState) (string, error) {
	dir := filepath.Join(c.dir, "r-"+st.ID)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	userns := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, ".img") || name == "workspace.img" {
			continue
		}
		src, dst := filepath.Join(c.dir, name), filepath.Join(dir, name)
		if name == "files.img" && st.ID == c.src.ID {
			// In place (a resume from a pause): the workspace is the
			// very mount the processes had, which a call may have
			// written to since; CRIU would refuse a file held open
			// whose size changed ("bad size"), and the session could
			// never resume. The processes see the file as it is now,
			// as after a freeze.
			b, err := os.ReadFile(src)
			if err != nil {
				return "", fmt.Errorf("restore: %w", err)
			}
			out, err := dropSizesUnder(b, ctl.WorkspaceDir+"/")
			if err != nil {
				return "", fmt.Errorf("restore: files image: %w", err)
			}
			if err := os.WriteFile(dst, out, 0o644); err != nil {
				return "", fmt.Errorf("restore: %w", err)
			}
			continue
		}
		if !strings.HasPrefix(name, "userns-") {
			if err := os.Link(src, dst); err != nil {
				return "", fmt.Errorf("restore: %w", err)
			}
			continue
		}
		userns++
		b, err := os.ReadFile(src)
		if err != nil {
			return "", fmt.Errorf("restore: %w", err)
		}
		out, err := remapUserns(b, uint64(c.src.UIDBase), uint64(st.UIDBase))
		if err != nil {
			return "", fmt.Errorf("restore: user namespace image: %w", err)
		}
		if err := os.WriteFile(dst, out, 0o644); err != nil {
			return "", fmt.Errorf("restore: %w", err)
		}
	}
	if userns != 1 {
		return "", fmt.Errorf("restore: %d user namespace images", userns)
	}
	if err := os.WriteFile(filepath.Join(dir, "restore.sh"), []byte(restoreScript), 0o700); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	return dir, nil
}

// readable makes the images readable by all while restores are under
// way (on), 0600 again once none is (off): CRIU reads some from inside the
// new user namespace, some before its ids are mapped (as the overflow
// uid). Only root reaches the directory's path (the data dir is 0700).
func (c *checkpoint) readable(on bool) error {
	if c.shared != "" {
		return c.readableShared(on)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if on {
		c.readers++
		if c.readers > 1 {
			return nil
		}
		if err := ownImages(c.dir, 0, 0o644); err != nil {
			// The restore fails and calls no readable(false).
			c.readers--
			return errors.Join(err, ownImages(c.dir, 0, 0o600))
		}
		return nil
	}
	c.readers--
	if c.readers > 0 {
		return nil
	}
	return ownImages(c.dir, 0, 0o600)
}

// readableShared is readable for images shared with other checkpoints
// (c.shared): 0644 while a restore of any of them is under way, 0600 in
// every dir once none is.
func (c *checkpoint) readableShared(on bool) error {
	d := c.d
	d.sharedMu.Lock()
	defer d.sharedMu.Unlock()
	if d.shared == nil {
		d.shared = map[string]*sharedReaders{}
	}
	r := d.shared[c.shared]
	if r == nil {
		r = &sharedReaders{dirs: map[string]int{}}
		d.shared[c.shared] = r
	}
	if on {
		if err := ownImages(c.dir, 0, 0o644); err != nil {
			if r.n == 0 {
				delete(d.shared, c.shared)
			}
			return errors.Join(err, ownImages(c.dir, 0, 0o600))
		}
		r.n++
		r.dirs[c.dir]++
		return nil
	}
	r.n--
	if r.dirs[c.dir]--; r.dirs[c.dir] <= 0 {
		delete(r.dirs, c.dir)
	}
	if r.n > 0 {
		return nil
	}
	delete(d.shared, c.shared)
	err := ownImages(c.dir, 0, 0o600)
	for dir := range r.dirs {
		if oerr := ownImages(dir, 0, 0o600); oerr != nil && !errors.Is(oerr, fs.ErrNotExist) {
			err = errors.Join(err, oerr)
		}
	}
	return err
}

// remapUserns rewrites a CRIU userns image (two magic words, then one
// UsernsEntry: a size and its protobuf) so that each extent of its uid and
// gid maps at from+n maps at to+n instead.
func remapUserns(b []byte, from, to uint64) ([]byte, error) {
	if len(b) < 12 {
		return nil, errors.New("short")
	}
	size := binary.LittleEndian.Uint32(b[8:12])
	if uint64(len(b)) < 12+uint64(size) {
		return nil, errors.New("short entry")
	}
	msg, rest := b[12:12+size], b[12+size:]
	var entry []byte
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		msg = msg[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			ext, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			msg = msg[n:]
			out, err := remapExtent(ext, from, to)
			if err != nil {
				return nil, err
			}
			entry = protowire.AppendTag(entry, num, typ)
			entry = protowire.AppendBytes(entry, out)
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		entry = protowire.AppendTag(entry, num, typ)
		entry = append(entry, msg[:n]...)
		msg = msg[n:]
	}
	out := slices.Clone(b[:8])
	out = binary.LittleEndian.AppendUint32(out, uint32(len(entry)))
	out = append(out, entry...)
	return append(out, rest...), nil
}

// dropSizesUnder rewrites a CRIU files image (two magic words, then
// FileEntry records, each a size and its protobuf) so that the regular
// files whose path starts with prefix carry no size (RegFileEntry field
// 8), which CRIU would otherwise check against the file's size at the
// restore.
func dropSizesUnder(b []byte, prefix string) ([]byte, error) {
	if len(b) < 8 {
		return nil, errors.New("short")
	}
	out := slices.Clone(b[:8])
	for rest := b[8:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, errors.New("short record")
		}
		size := binary.LittleEndian.Uint32(rest[:4])
		if uint64(len(rest)) < 4+uint64(size) {
			return nil, errors.New("short entry")
		}
		entry, err := rewriteField(rest[4:4+size], 3, func(reg []byte) ([]byte, error) {
			name := ""
			if err := eachField(reg, func(num protowire.Number, typ protowire.Type, v []byte) {
				if num == 6 && typ == protowire.BytesType {
					name = string(v)
				}
			}); err != nil {
				return nil, err
			}
			if !strings.HasPrefix(name, prefix) {
				return reg, nil
			}
			return rewriteField(reg, 8, func([]byte) ([]byte, error) { return nil, nil })
		})
		if err != nil {
			return nil, err
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(entry)))
		out = append(out, entry...)
		rest = rest[4+size:]
	}
	return out, nil
}

// tcpEstablished is a socket's TCP_ESTABLISHED state, in a CRIU image.
const tcpEstablished = 1

// peerlessConns reads a CRIU files image (as dropSizesUnder) for the Unix
// stream connections it holds with no peer (UnixSkEntry, FileEntry field
// 16: state, field 4, established; peer, field 8, 0), by inode (field 2):
// a control connection whose gateway end had closed before the init
// closed its own (a command that just ended), which CRIU dumps as a
// semi-closed connection. CRIU restores such a socket itself (a
// socketpair whose other end it closes), and it must not be handed back
// with --inherit-fd: CRIU 4.2 also makes up a peer to refill its queue
// (add_fake_unix_queuers), which only its own opening of the socket
// serves, and the task holding it (the init) waited for that until the
// restore's timeout killed criu.
func peerlessConns(b []byte) (map[uint64]bool, error) {
	if len(b) < 8 {
		return nil, errors.New("short")
	}
	out := map[uint64]bool{}
	for rest := b[8:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, errors.New("short record")
		}
		size := binary.LittleEndian.Uint32(rest[:4])
		if uint64(len(rest)) < 4+uint64(size) {
			return nil, errors.New("short entry")
		}
		var usk []byte
		if err := eachField(rest[4:4+size], func(num protowire.Number, typ protowire.Type, v []byte) {
			if num == 16 && typ == protowire.BytesType {
				usk = v
			}
		}); err != nil {
			return nil, err
		}
		rest = rest[4+size:]
		if usk == nil {
			continue
		}
		ino, state, peer, err := uskFields(usk)
		if err != nil {
			return nil, err
		}
		if state == tcpEstablished && peer == 0 {
			out[ino] = true
		}
	}
	return out, nil
}

// uskFields reads a UnixSkEntry's inode (field 2), state (4) and peer (8).
func uskFields(msg []byte) (ino, state, peer uint64, err error) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, 0, 0, protowire.ParseError(n)
		}
		msg = msg[n:]
		if typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(msg)
			if m < 0 {
				return 0, 0, 0, protowire.ParseError(m)
			}
			switch num {
			case 2:
				ino = v
			case 4:
				state = v
			case 8:
				peer = v
			}
			n = m
		} else if n = protowire.ConsumeFieldValue(num, typ, msg); n < 0 {
			return 0, 0, 0, protowire.ParseError(n)
		}
		msg = msg[n:]
	}
	return ino, state, peer, nil
}

// eachField calls fn with each field of protobuf msg: its number, type
// and, for a length-delimited one, its bytes.
func eachField(msg []byte, fn func(num protowire.Number, typ protowire.Type, v []byte)) error {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return protowire.ParseError(n)
		}
		msg = msg[n:]
		var v []byte
		if typ == protowire.BytesType {
			b, m := protowire.ConsumeBytes(msg)
			if m < 0 {
				return protowire.ParseError(m)
			}
			v, n = b, m
		} else if n = protowire.ConsumeFieldValue(num, typ, msg); n < 0 {
			return protowire.ParseError(n)
		}
		fn(num, typ, v)
		msg = msg[n:]
	}
	return nil
}

// rewriteField rewrites protobuf msg with fn applied to each occurrence of
// field num: to its bytes if length-delimited, to nil otherwise; fn's nil
// answer drops the field.
func rewriteField(msg []byte, num protowire.Number, fn func([]byte) ([]byte, error)) ([]byte, error) {
	var out []byte
	for len(msg) > 0 {
		fnum, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		tag := msg[:n]
		msg = msg[n:]
		m := protowire.ConsumeFieldValue(fnum, typ, msg)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		val := msg[:m]
		msg = msg[m:]
		if fnum != num {
			out = append(append(out, tag...), val...)
			continue
		}
		var in []byte
		if typ == protowire.BytesType {
			in, _ = protowire.ConsumeBytes(val)
		}
		v, err := fn(in)
		switch {
		case err != nil:
			return nil, err
		case v == nil:
			continue // dropped
		case typ == protowire.BytesType:
			out = protowire.AppendBytes(append(out, tag...), v)
		default:
			out = append(append(out, tag...), val...)
		}
	}
	return out, nil
}

// remapExtent rewrites one UidGidExtent (first, lower_first, count). The
// extent must lie within the sandbox's range, [from, from+idRange), and
// its ids inside within [0, idRange), as a fresh sandbox maps them: an
// image that maps more (a tampered one) is refused, never restored into
// host ids outside the sandbox's own (another sandbox's, or root).
func remapExtent(ext []byte, from, to uint64) ([]byte, error) {
	var out []byte
	var first, lower, count uint64
	seen := 0
	for len(ext) > 0 {
		num, typ, n := protowire.ConsumeTag(ext)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		ext = ext[n:]
		if typ != protowire.VarintType {
			return nil, fmt.Errorf("extent field %d of type %d", num, typ)
		}
		v, n := protowire.ConsumeVarint(ext)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		ext = ext[n:]
		switch num {
		case 1:
			first = v
		case 2:
			lower = v
			if v < from || v >= from+idRange {
				return nil, fmt.Errorf("extent at %d is not the sandbox's range at %d", v, from)
			}
			v = v - from + to
		case 3:
			count = v
		default:
			return nil, fmt.Errorf("extent field %d", num)
		}
		seen |= 1 << num
		out = protowire.AppendTag(out, num, typ)
		out = protowire.AppendVarint(out, v)
	}
	if seen&(1<<2|1<<3) != 1<<2|1<<3 {
		return nil, errors.New("extent without its host ids or count")
	}
	if count > idRange || lower+count > from+idRange || first+count > idRange {
		return nil, fmt.Errorf("extent of %d ids at %d (inside at %d) overruns the sandbox's range of %d at %d", count, lower, first, idRange, from)
	}
	return out, nil
}

// restoreStage is what a restore binds where the restored processes, in
// their new user namespace, can reach it: CRIU mounts the image's
// external mounts from there, as the new namespace's root. Its dir is
// owned by that namespace's root (st.UIDBase), 0700.
type restoreStage struct {
	dir, root, ws, init string
	// etc is the bind of the sandbox's /etc dir (sandboxState.EtcDir);
	// "": its /etc is a tmpfs of its own, or it has an image's.
	etc     string
	mounted []string
}

func (c *checkpoint) stage(st *sandboxState) (_ *restoreStage, err error) {
	parent := c.d.stagesDir()
	if err := mkdirSpread(parent, 0o711); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "s-")
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	s := &restoreStage{dir: dir, root: filepath.Join(dir, "root"), ws: filepath.Join(dir, "ws"), init: filepath.Join(dir, "init")}
	defer func() {
		if err != nil {
			s.remove()
		}
	}()
	if err := os.Chown(dir, st.UIDBase, st.UIDBase); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	for _, p := range []string{s.root, s.ws} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	if err := os.WriteFile(s.init, nil, 0o755); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	bind := func(src, dst string) error {
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("restore: bind %s: %w", src, err)
		}
		s.mounted = append(s.mounted, dst)
		return nil
	}
	if err := bind(st.Workspace, s.ws); err != nil {
		return nil, err
	}
	if err := bind(c.d.initPath, s.init); err != nil {
		return nil, err
	}
	if st.EtcDir != "" {
		etcDir, err := c.d.etcDirs.path(st.EtcDir)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		s.etc = filepath.Join(dir, "etc")
		if err := os.Mkdir(s.etc, 0o755); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if err := bind(etcDir, s.etc); err != nil {
			return nil, err
		}
	}
	// The root tmpfs as the sandbox's init made it (hostRootAt).
	data := fmt.Sprintf("mode=0755,size=1m,uid=%d,gid=%d", st.UIDBase, st.UIDBase)
	if err := unix.Mount("tmpfs", s.root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return nil, fmt.Errorf("restore: root: %w", err)
	}
	s.mounted = append(s.mounted, s.root)
	for _, e := range c.root {
		p := filepath.Join(s.root, e.name)
		switch {
		case e.link != "":
			err = os.Symlink(e.link, p)
		case e.dir:
			err = os.Mkdir(p, 0o755)
		default:
			err = os.WriteFile(p, nil, 0o755)
		}
		if err == nil {
			err = os.Lchown(p, st.UIDBase, st.UIDBase)
		}
		if err != nil {
			return nil, fmt.Errorf("restore: root: %w", err)
		}
	}
	// The new namespace's root reaches the stage; nobody else does.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return s, nil
}

// stagesDir holds the driver's restore stages: a dir of the host's
// temporary dir (which the restored namespace's root must traverse: the
// driver's is 0700), named after the driver's dir, so that a driver
// starting again finds the stages a crash left (removeStages) and no
// other gateway's.
func (d *Driver) stagesDir() string {
	h := fnv.New64a()
	h.Write([]byte(d.root))
	return filepath.Join(os.TempDir(), fmt.Sprintf("sandgate-restore-%x", h.Sum64()))
}

// removeStages removes the restore stages a crashed gateway left: their
// mounts (a fork's workspace, the root tmpfs, the init's binary, the
// /etc dir) in the
// host's namespace, then their dirs. A dir still mounted stays.
func (d *Driver) removeStages() {
	parent := d.stagesDir()
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(parent, e.Name())
		s := &restoreStage{dir: dir, root: filepath.Join(dir, "root"), ws: filepath.Join(dir, "ws"), init: filepath.Join(dir, "init"), etc: filepath.Join(dir, "etc")}
		s.mounted = []string{s.ws, s.init, s.etc, s.root}
		s.remove()
		d.log.Warn("restore_stage_removed", "dir", dir)
	}
	_ = os.Remove(parent)
}

// remove unmounts the stage (the restored namespace keeps its own
// mounts) and deletes it.
func (s *restoreStage) remove() {
	for _, m := range slices.Backward(s.mounted) {
		if err := unix.Unmount(m, unix.UMOUNT_NOFOLLOW); err != nil {
			_ = unix.Unmount(m, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
	}
	for _, p := range []string{s.root, s.ws, s.init, s.etc, s.dir} {
		if p != "" {
			_ = os.Remove(p)
		}
	}
}

// phases times the steps of a checkpoint or a restore, for its log line
// (docs/fork.md's breakdown, bench row 15d).
type phases struct {
	start, last time.Time
	steps       []any
}

func newPhases() *phases {
	now := time.Now()
	return &phases{start: now, last: now}
}

// mark ends step name now.
func (p *phases) mark(name string) {
	now := time.Now()
	p.add(name, now.Sub(p.last))
	p.last = now
}

// add records a duration measured elsewhere.
func (p *phases) add(name string, d time.Duration) {
	p.steps = append(p.steps, name+"_ms", float64(d.Microseconds())/1e3)
}

// attrs are the steps' durations, then the total, as log attributes.
func (p *phases) attrs() []any {
	return append(p.steps, "ms", float64(time.Since(p.start).Microseconds())/1e3)
}
