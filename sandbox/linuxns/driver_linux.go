//go:build linux

package linuxns

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/internal/mountinfo"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
	"github.com/sandgate/sandgate/sandbox/linuxns/initexe"
	"github.com/sandgate/sandgate/sandbox/linuxns/seccompprog"
)

// Host uids and gids of sandboxes: sandbox n maps its ids 0..65535 to
// hostIDBase + n*idRange onwards, so its user (1000 inside) is a host uid
// far above any account's and no two sandboxes share one. Slot 0 is the
// start-up probe's.
const (
	hostIDBase = 1 << 30
	idRange    = 1 << 16
	maxSlots   = (1<<31 - hostIDBase) / idRange
)

const (
	initFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
		syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS
	// initTimeout bounds building a sandbox when the caller's context has
	// no deadline.
	initTimeout = 30 * time.Second
)

// socketCheck is how often an init checks that its control socket is still
// on the host.
const socketCheck = 10 * time.Second

// Driver is the linux driver (docs/architecture.md, "The linuxns driver").
// Each sandbox is a per-session init, `sandgate sandbox-init`: one clone of the gateway's own binary in
// new user, mount, pid, net, ipc and uts namespaces (and a cgroup namespace
// for what it starts), which builds a root of read-only host directories, a
// fresh /proc, a minimal /dev, a private /tmp and the workspace, then serves
// a unix control socket at <DataDir>/sandboxes/<id>/control.sock.
//
// Every command of the session (exec, shell, sftp-server) is started by
// that init, so all of them share one sandbox: the gateway connects to the
// control socket, passes the command's stdio pipes (SCM_RIGHTS), and the
// init forks it as the sandbox user; with a PTY the init opens the terminal
// in the sandbox's devpts and hands the master back. Output never passes
// through the init.
//
// Sandboxes outlive the gateway process: an init has its own session and
// no parent-death signal, and its state is kept in <DataDir>/sandboxes/<id>.
// At New the driver reaps every sandbox a previous run left (kills its
// init, removes its cgroups, mounts and files), unless Config.KeepOrphans
// keeps them for List, Adopt and Remove (sandbox.Reattacher). An init whose
// control socket is deleted from the host ends itself.
type Driver struct {
	cfg    sandbox.Config
	limits sandbox.Limits
	root   string // <DataDir>/sandboxes
	exe    string
	// initFile is the small embedded init (package initexe) that exe
	// names through /proc/self/fd, or nil when the init is the gateway's
	// own binary.
	initFile *os.File
	log      *slog.Logger
	cg       *cgroup.Plan
	ws       *workspaces
	etc      *etcTemplate
	etcDirs  *etcDirs // checkpointable sandboxes' /etc
	report   map[string]any
	// sockCheck is socketCheck, shortened by tests.
	sockCheck time.Duration
	// seccomp is the filter every sandbox gets, seccompProg its program
	// (assembled once, sent in every spec); noSeccomp turns it off (tests
	// only, to measure its cost).
	seccomp     seccompprog.Description
	seccompProg []byte
	noSeccomp   bool
	// spawner starts the inits (spawner_linux.go); nil: the gateway forks
	// them itself (no small init, or it failed to start).
	spawner *spawnServer
	// beforeAttach, when set (tests), runs with a new init's pid just
	// before the gateway sends its workspace (and its CPU cgroup, which
	// it then moves into).
	beforeAttach func(pid int)
	// beforeLaunch, when set (tests), runs with a new sandbox's id just
	// before its init is forked, in the cgroups made for it.
	beforeLaunch func(id string)
	// beforeKill, when set (tests), runs with a sandbox's id just before
	// its teardown (or a reap) kills its init.
	beforeKill func(id string)

	mu    sync.Mutex
	slots map[int]string // slot -> sandbox id
	// unfiltered holds the running sandboxes adopted without the seccomp
	// filter (their init predates it): Seccomp reports them.
	unfiltered map[string]bool
	// initPath is the init's binary for checkpointable sandboxes
	// (writeInitBinary).
	initPath string

	// kdat is CRIU's kerndat cache, as the first criu run wrote it
	// (runCRIU).
	kdatMu sync.Mutex
	kdat   []byte
	// criuMarks is what the driver read of criu binaries (criuMarksOf).
	criuMarks criuMarkCache
	// pauseDumps bounds the pauses by checkpoint dumping at once
	// (MaxPauseDumps); one more pauses by a freeze.
	pauseDumps chan struct{}
	// shared counts the restores of images that checkpoints share
	// (checkpoint.shared), by images.
	sharedMu sync.Mutex
	shared   map[string]*sharedReaders
	// noRedump is set once criu failed to dump a tree it had restored
	// (redumpFailed): restored sandboxes are not dumped again.
	noRedump atomic.Bool
}

// New returns the linux driver after checking that this host can run
// it (a probe sandbox is built and torn down).
func New(cfg sandbox.Config) (*Driver, error) { return newDriver(cfg, initexe.Bytes()) }

// newDriver is New with smallInit as the embedded small init (nil: none).
func newDriver(cfg sandbox.Config, smallInit []byte) (*Driver, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the linux driver needs root (it maps sandbox users, mounts workspaces and makes cgroups)")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("the linux driver needs a data dir")
	}
	cfg.Nofile = cfg.Nofile.WithDefaults()
	root, err := filepath.Abs(filepath.Join(cfg.DataDir, "sandboxes"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("sandboxes dir: %w", err)
	}
	if err := spreadSubdirs(root); err != nil {
		return nil, fmt.Errorf("sandboxes dir: %w", err)
	}
	exe := cfg.SelfExe
	if exe == "" {
		exe = "/proc/self/exe"
	}
	d := &Driver{
		cfg: cfg, limits: cfg.Limits.WithDefaults(), root: root, exe: exe, log: cfg.Log,
		slots: map[int]string{0: ""}, unfiltered: map[string]bool{}, sockCheck: socketCheck,
		pauseDumps: make(chan struct{}, MaxPauseDumps),
	}
	if d.seccomp, err = seccompprog.Describe(cfg.AllowUserNS); err != nil {
		return nil, err
	}
	if d.seccompProg, err = seccompprog.Program(cfg.AllowUserNS); err != nil {
		return nil, err
	}
	d.useSmallInit(smallInit)
	if err := d.probe(); err != nil {
		if d.initFile == nil {
			return nil, err
		}
		// A host that refuses to exec a memfd (vm.memfd_noexec=2) still
		// runs sandboxes, on the gateway's own binary.
		d.log.Warn("sandbox init: the embedded small init failed the probe; sandboxes run the gateway's own binary, which starts slower and holds more memory per sandbox", "err", err.Error())
		d.initFile.Close()
		d.initFile, d.exe = nil, "/proc/self/exe"
		if err := d.probe(); err != nil {
			return nil, err
		}
	}
	if cfg.Checkpoint {
		if err := d.checkCRIU(); err != nil {
			return nil, err
		}
		if err := d.writeInitBinary(); err != nil {
			return nil, err
		}
	}
	d.cg = cgroup.Detect()
	d.removeTemplates()
	// A fork's images never outlive its call: those a crash left (they
	// hold a sandbox's memory) go.
	_ = os.RemoveAll(filepath.Join(root, checkpointsDir))
	d.removeStages()
	if cfg.KeepOrphans {
		d.reserveExisting()
	} else {
		d.reapAll()
	}
	d.ws = prepareWorkspaces(root, d.limits.WorkspaceBytes)
	d.etc = newEtcTemplate(d.log)
	d.etcDirs = newEtcDirs(root, d.log)
	d.etcDirs.removeUnused(time.Now())
	if !cfg.Checkpoint {
		d.etc.prepare()
	}
	d.report = d.buildReport()
	// Last, once nothing here can fail: a Driver New does not return
	// would leave its server running, with no one to use or end it.
	if d.initFile != nil {
		if d.spawner, err = startSpawnServer(d.initFile, spawnerLog(root), d.log); err != nil {
			d.log.Warn("sandbox spawner: not started; the gateway forks every init itself, which costs more per sandbox the larger the gateway", "err", err.Error())
		} else {
			// A Driver no one holds any more ends its server.
			runtime.AddCleanup(d, func(s *spawnServer) { s.close() }, d.spawner)
		}
	}
	return d, nil
}

// useSmallInit makes sandboxes start the small init make build embeds
// (package initexe) instead of the gateway's own binary, when the gateway
// runs its own binary (no Config.SelfExe) and has it: the probe checks it.
// A binary built without it (go install) keeps running itself as the init,
// about 20 ms slower to start and several MiB heavier per sandbox.
func (d *Driver) useSmallInit(b []byte) {
	if d.cfg.SelfExe != "" {
		return
	}
	f, err := initexe.OpenBytes(b)
	switch {
	case err != nil:
		d.log.Warn("sandbox init: the embedded small init cannot be used; sandboxes run the gateway's own binary, which starts slower and holds more memory per sandbox", "err", err.Error())
	case f == nil:
		d.log.Info("sandbox init: this sandgate was built without the small init (make build embeds it); sandboxes run the gateway's own binary, which starts slower and holds more memory per sandbox")
	default:
		d.initFile, d.exe = f, "/proc/self/fd/"+strconv.Itoa(int(f.Fd()))
	}
}

// writeInitBinary copies the init's binary to a file under the driver's
// dir, which checkpointable sandboxes bind at /.sandgate-init
// (ctl.Spec.InitPath). A file there with the same bytes is kept, not
// replaced: the sandboxes a restarted gateway adopts bind its inode, and
// one replaced would leave them an unlinked file, which CRIU will not
// dump (a ghost file past its size limit) and a restore could not bind
// again.
func (d *Driver) writeInitBinary() error {
	src, err := os.Open(d.exe)
	if err != nil {
		return fmt.Errorf("init binary: %w", err)
	}
	defer src.Close()
	d.initPath = filepath.Join(d.root, ".sandgate-init")
	if same, err := sameContent(src, d.initPath); err != nil {
		return fmt.Errorf("init binary: %w", err)
	} else if same {
		return nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("init binary: %w", err)
	}
	tmp, err := os.CreateTemp(d.root, ".sandgate-init-")
	if err != nil {
		return fmt.Errorf("init binary: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), d.initPath)
	}
	if err != nil {
		return fmt.Errorf("init binary: %w", err)
	}
	return nil
}

// sameContent reports whether the file at path, a regular file of mode
// 0755, holds exactly what src holds (read from its start).
func sameContent(src *os.File, path string) (bool, error) {
	dst, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer dst.Close()
	a, err1 := src.Stat()
	b, err2 := dst.Stat()
	if err1 != nil || err2 != nil {
		return false, errors.Join(err1, err2)
	}
	if !b.Mode().IsRegular() || b.Mode().Perm() != 0o755 || a.Size() != b.Size() {
		return false, nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	x, y := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		n, err := io.ReadFull(src, x)
		if n > 0 {
			if m, _ := io.ReadFull(dst, y[:n]); m != n || !bytes.Equal(x[:n], y[:n]) {
				return false, nil
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// initKind names the init's binary in the driver's report.
func (d *Driver) initKind() string {
	if d.initFile != nil {
		return "embedded"
	}
	return "self"
}

// Name implements Driver.
func (d *Driver) Name() string { return "linux" }

// Report implements Reporter: what this host enforces, and what it cannot.
func (d *Driver) Report() map[string]any { return d.report }

// Seccomp describes the seccomp filter of every sandbox (serve logs it
// and shows it in /readyz). "unfiltered" lists the running sandboxes
// adopted from an init that predates the filter: they run without it
// until they end (a stop and resume starts them under it).
func (d *Driver) Seccomp() map[string]any {
	d.mu.Lock()
	unfiltered := slices.Sorted(maps.Keys(d.unfiltered))
	d.mu.Unlock()
	return map[string]any{
		"enabled": !d.noSeccomp, "arch": d.seccomp.Arch, "errno": "EPERM",
		"blocked": d.seccomp.Blocked, "userns": d.seccomp.UserNS, "unfiltered": unfiltered,
	}
}

func (d *Driver) buildReport() map[string]any {
	l := d.limits
	unenforced := []string{}
	limit := func(name string, value any, unit, via, missing string) map[string]any {
		m := map[string]any{unit: value, "enforced": missing == ""}
		if missing == "" {
			m["via"] = via
		} else {
			m["reason"] = missing
			unenforced = append(unenforced, name)
			d.log.Warn("sandbox limit not enforced on this host", "limit", name, "reason", missing)
		}
		return m
	}
	limits := map[string]any{
		"memory":    limit("memory", l.MemoryBytes, "bytes", d.cg.Via("memory"), d.cg.Missing("memory")),
		"pids":      limit("pids", l.Pids, "max", d.cg.Via("pids"), d.cg.Missing("pids")),
		"cpu":       limit("cpu", l.CPUs, "cores", d.cg.Via("cpu"), d.cg.Missing("cpu")),
		"tmp":       limit("tmp", l.TmpBytes, "bytes", "tmpfs size", ""),
		"workspace": limit("workspace", l.WorkspaceBytes, "bytes", d.ws.via(), ""),
	}
	if d.ws.reason != "" {
		d.log.Warn("sandbox workspaces are tmpfs, sharing the memory limit", "reason", d.ws.reason)
		limits["workspace"].(map[string]any)["note"] = d.ws.reason
	}
	return map[string]any{
		"driver":     "linux",
		"namespaces": "user,mount,pid,net,ipc,uts,cgroup",
		"user":       fmt.Sprintf("uid %d in the sandbox (host uids from %d), no_new_privs, no capabilities", ctl.SandboxUID, hostIDBase),
		"network":    "none (loopback only)",
		"init":       d.initKind(),
		"limits":     limits,
		"unenforced": unenforced,
	}
}

func (d *Driver) dir(id string) string { return filepath.Join(d.root, id) }

// allocSlot reserves a free uid range for id, the first free one from a
// random slot on: a sandbox sees its range's host ids (/proc/self/uid_map,
// mount options), and the lowest free one would tell its tenant how many
// sandboxes the host holds, other tenants' and the warm pool's included.
func (d *Driver) allocSlot(id string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := 1 + rand.IntN(maxSlots-1)
	for i := range maxSlots - 1 {
		s := 1 + (start-1+i)%(maxSlots-1)
		if _, used := d.slots[s]; !used {
			d.slots[s] = id
			return s, nil
		}
	}
	return 0, errors.New("no free sandbox uid range")
}

func (d *Driver) freeSlot(slot int, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if slot > 0 && d.slots[slot] == id {
		delete(d.slots, slot)
		delete(d.unfiltered, id)
	}
}

// Create implements Driver.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if !sandbox.ValidID(spec.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", spec.ID)
	}
	if img := spec.Image; img != nil {
		for _, l := range img.Layers {
			if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
				return nil, fmt.Errorf("image %s: layer %s is missing", img.Name, l)
			}
		}
	}
	ctx, cancel := withInitTimeout(ctx)
	defer cancel()
	slot, dir, err := d.newSandboxDir(spec.ID)
	if err != nil {
		return nil, err
	}
	st := &sandboxState{
		ID: spec.ID, Slot: slot, UIDBase: hostIDBase + slot*idRange,
		Workspace: filepath.Join(dir, "workspace"), Socket: filepath.Join(dir, "control.sock"),
		Cgroups: d.cg.DirsFor(spec.ID), Created: time.Now().UTC(), Protocol: ctl.Protocol,
	}
	if d.ws.template != "" {
		st.Image = filepath.Join(dir, "workspace.img")
	}
	// The session's own limits over the driver's, the workspace's size
	// included; kept with what else a Resume needs.
	lim := spec.Limits.Or(d.limits)
	st.Boot = &bootSpec{Image: spec.Image, Limits: lim, TrustPEM: spec.TrustPEM}
	sb := newLinuxSandbox(d, st)
	sb.trustPEM = spec.TrustPEM
	sb.warm = spec.Warm
	ok := false
	defer func() {
		if !ok {
			_ = sb.teardown()
		}
	}()
	// Written before anything exists, so that a crash from here on leaves
	// enough behind for the next start to clean up.
	if err := st.save(dir); err != nil {
		return nil, err
	}
	tr := sandbox.TraceOf(ctx)
	tr.Mark("driver_state")
	// The workspace is made while the init starts (the init waits for
	// its spec before it does anything).
	wsDone := make(chan error, 1)
	go func() {
		t0 := time.Now()
		err := d.ws.create(st.Workspace, st.Image, lim.WorkspaceBytes, st.UIDBase+ctl.SandboxUID, st.UIDBase+ctl.SandboxGID, tr)
		tr.Add("workspace_image_bg", time.Since(t0))
		wsDone <- err
	}()
	if err := d.bootInit(ctx, sb, spec.Image, lim, wsDone); err != nil {
		return nil, err
	}
	ok = true
	return sb, nil
}

// bootInit starts sb's init in its cgroups, then, once the workspace is
// ready (wsDone), hands it everything it needs and waits until the sandbox
// is built. It returns only after wsDone has answered.
func (d *Driver) bootInit(ctx context.Context, sb *linuxSandbox, img *sandbox.Image, lim sandbox.Limits, wsDone <-chan error) (err error) {
	st := sb.st
	tr := sandbox.TraceOf(ctx)
	var fds []int
	var names []string
	waited := false
	defer func() {
		procio.CloseFDs(fds)
		if !waited {
			<-wsDone
		}
	}()
	// The init is born in its cgroups: CLONE_INTO_CGROUP for v2; for v1,
	// it is forked from a thread that joined them.
	cgs, err := d.cg.Create(st.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUs: lim.CPUs})
	if err != nil {
		return err
	}
	sb.mu.Lock()
	warm := sb.warm
	sb.mu.Unlock()
	cgfd, err := cgs.OpenV2()
	if err != nil {
		return err
	}
	// A warm init is born in its CPU cgroup, at the least weight once
	// started (below): all of its build yields to the creates that claim
	// (cgroup.Set.TaskFiles).
	// Not a checkpointable one: its cgroup namespace (CLONE_NEWCGROUP) is
	// rooted where it is born, and its commands must see the cgroups a
	// cold create's see.
	bornInCPU := warm && !d.cfg.Checkpoint
	initTasks, procsTasks, err := cgs.TaskFiles(bornInCPU)
	if err != nil {
		if cgfd >= 0 {
			unix.Close(cgfd)
		}
		return err
	}
	fds, names = procsTasks, slices.Repeat([]string{"tasks"}, len(procsTasks))
	tr.Mark("cgroups")
	if d.beforeLaunch != nil {
		d.beforeLaunch(st.ID)
	}
	forkAt := time.Now()
	in, conn, err := d.launchInit(ctx, st.UIDBase, filepath.Join(d.dir(st.ID), "init.log"), cgfd, initTasks)
	procio.CloseFDs(initTasks)
	if cgfd >= 0 {
		unix.Close(cgfd)
	}
	if err != nil {
		return err
	}
	// A warm sandbox yields the CPU from here on: its init runs, but has
	// not its spec yet. Not before: the thread that forks it (the spawn
	// server's, or the gateway's) joins the v1 cgroups it is born in, and
	// waits for its exec (v2: the child alone is there). At the least
	// weight, among busy sandboxes, that took seconds, past the spawn
	// server's bound (spawnReplyWait), which then ends the server for
	// good; the gateway's own thread (no server) waited as long.
	if warm {
		if err := d.cg.Idle(st.ID); err != nil {
			return err
		}
	}
	// Started: cloned into its namespaces, its ids mapped, the init's
	// binary exec'd (exec.Cmd.Start returns once the exec succeeded), by
	// the spawn server or by the gateway itself.
	tr.Add("init_exec_bg", time.Since(forkAt))
	defer conn.Close()
	st.Pid = in.pid
	st.Seccomp = !d.noSeccomp
	st.Checkpoint = d.cfg.Checkpoint
	sb.mu.Lock()
	st.KeepJobs, st.KeepPTY, st.KeepLater = true, true, true // Keeps reads them under mu
	sb.mu.Unlock()
	d.mu.Lock()
	delete(d.unfiltered, st.ID) // a resumed sandbox runs under this init
	d.mu.Unlock()
	sb.setInit(in.cmd, in.pidfd)
	// The default root's /etc: a clone of the gateway's template, or for
	// a checkpointable sandbox a bind of its /etc dir.
	st.EtcTemplate, st.EtcDir = false, ""
	switch {
	case img != nil:
	case !d.cfg.Checkpoint && d.etc != nil:
		if etc := d.etc.clone(st.Pid); etc >= 0 {
			fds, names = append(fds, etc), append(names, "etc")
			st.EtcTemplate = true
		}
	case d.cfg.Checkpoint && d.etcDirs != nil:
		if name := d.etcDirs.dir(); name != "" {
			if etc, err := d.etcDirs.open(name); err != nil {
				// Gone from the disk: this init builds its /etc, the next
				// create gets a new dir.
				d.log.Warn("sandbox /etc: the /etc dir could not be bound; this sandbox's init builds its own", "sandbox", st.ID, "err", err.Error())
				d.etcDirs.drop(name)
			} else {
				fds, names = append(fds, etc), append(names, "etc")
				st.EtcDir = name
			}
		}
	}
	if _, st.StartTime, err = procStat(st.Pid); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	if err := st.save(d.dir(st.ID)); err != nil {
		return err
	}
	tr.Mark("init_fork")
	if d.cfg.Checkpoint {
		// The control socket is made in the sandbox's network namespace,
		// where a checkpoint finds it; the gateway still reaches it by its
		// path. No "socket-file": it is a file of the host.
		ln, err := listenUnixIn(st.Pid, st.Socket)
		if err != nil {
			return err
		}
		fds, names = append(fds, ln), append(names, "listener")
		self, err := unix.OpenTree(unix.AT_FDCWD, d.initPath, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("init binary: %w", err)
		}
		fds, names = append(fds, self), append(names, "init")
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(self, "", unix.AT_EMPTY_PATH, attr); err != nil {
			return fmt.Errorf("init binary: %w", err)
		}
	} else {
		ln, err := listenUnix(st.Socket)
		if err != nil {
			return err
		}
		fds, names = append(fds, ln), append(names, "listener")
		sf, err := unix.Open(st.Socket, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("control socket: %w", err)
		}
		fds, names = append(fds, sf), append(names, "socket-file")
	}
	is := ctl.Spec{
		Checkpoint: d.cfg.Checkpoint,
		ID:         st.ID, Hostname: sandbox.ShortID(st.ID), TmpBytes: lim.TmpBytes,
		ShmBytes: min(lim.TmpBytes, 64<<20), SocketCheckMillis: d.sockCheck.Milliseconds(),
		TrustPEM: string(sb.trustPEM), AllowUserNS: d.cfg.AllowUserNS, NoSeccomp: d.noSeccomp,
	}
	if !d.noSeccomp {
		is.Seccomp = d.seccompProg
	}
	is.NofileSoft, is.NofileHard = d.cfg.Nofile.Soft, d.cfg.Nofile.Hard
	is.InitNofile = initNofileFor(lim.Pids)
	// The spec goes out now, without the workspace (and an image's root),
	// which follow once made (ctl.Attach): meanwhile the init builds what
	// needs neither, the default root's /etc above all.
	is.Late = []string{"workspace"}
	name := ""
	if img != nil {
		is.Env, is.WorkingDir = img.Env, img.WorkingDir
		is.Late = []string{"rootfs", "workspace"}
		name = img.Name
	}
	// The init goes under the sandboxes' CPU parent once it has its
	// workspace, before its spawner thread joins the commands' cgroups
	// and anything of the sandbox runs: it moves itself, thread by thread
	// (cgroup.Set.CPUTasks), unless it was born there.
	cpuTasks := -1
	if !bornInCPU {
		if cpuTasks, err = cgs.CPUTasks(); err != nil {
			return err
		}
	}
	defer func() {
		if cpuTasks >= 0 {
			unix.Close(cpuTasks)
		}
	}()
	if cpuTasks >= 0 {
		is.Late = append(is.Late, "cputasks")
	}
	is.FDs = names
	hs, err := d.startHandshake(ctx, conn, is, fds)
	if err != nil {
		return err
	}
	defer hs.stop()
	procio.CloseFDs(fds)
	fds, names = nil, nil
	tr.Mark("init_spec")
	waited = true
	if err := <-wsDone; err != nil {
		return err
	}
	tr.Mark("workspace_wait")
	home := st.Workspace
	if img != nil {
		if err := prepareImageWorkspace(st.Workspace, st.UIDBase); err != nil {
			return err
		}
		home = filepath.Join(st.Workspace, imageHome)
		userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", st.Pid))
		if err != nil {
			return fmt.Errorf("sandbox user namespace: %w", err)
		}
		rootfs, err := imageRoot(d.dir(st.ID), st.Workspace, img, int(userns.Fd()))
		userns.Close()
		if err != nil {
			return err
		}
		fds, names = append(fds, rootfs), append(names, "rootfs")
	}
	ws, err := unix.OpenTree(unix.AT_FDCWD, home, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("workspace mount: %w", err)
	}
	fds, names = append(fds, ws), append(names, "workspace")
	if cpuTasks >= 0 {
		fds, names = append(fds, cpuTasks), append(names, "cputasks")
		cpuTasks = -1
	}
	tr.Mark("workspace_mount")
	if d.beforeAttach != nil {
		d.beforeAttach(st.Pid)
	}
	if err := hs.finish(ctl.Attach{FDs: names}, fds, name, forkAt); err != nil {
		return err
	}
	// Built: from now on it weighs as much as any running sandbox, or,
	// warm, the least until its claim (Rebind).
	if warm {
		return d.cg.Idle(st.ID)
	}
	return d.cg.Started(st.ID)
}

// initNofileFor is what the init needs in a sandbox with pids processes:
// two descriptors per running command (its control connection and its
// namespace), three more per kept one (the pipes it holds until the exit
// is acknowledged; kept commands run as processes, so at most pids of
// them, and at most ctl.MaxKept), and some of its own. At the default
// 256 pids that is 864, under the default soft limit of 1024, so a
// session's commands get exactly the configured limits; a session with
// many more pids gets a soft limit raised to this, as its init does.
func initNofileFor(pids int64) uint64 {
	p := uint64(max(pids, 0))
	return 2*p + 3*min(p, ctl.MaxKept) + 64
}

// ctxErr is err, or, when ctx ended (its cancellation set the deadline
// that err reports as an i/o timeout), why ctx ended: the caller went
// away, which is not the sandbox's failure.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// handshake sends the init its spec and waits until the sandbox is built.
// forkAt, when known, is when the init was started: the create's trace
// shows how long it took to reach its main.
func (d *Driver) handshake(ctx context.Context, conn *net.UnixConn, spec ctl.Spec, image string, fds []int, forkAt time.Time) error {
	hs, err := d.startHandshake(ctx, conn, spec, fds)
	if err != nil {
		return err
	}
	defer hs.stop()
	return hs.finish(nil, nil, image, forkAt)
}

// initHandshake is a handshake with a new init under way: its spec is
// sent, the rest (finish) is to come.
type initHandshake struct {
	ctx  context.Context
	conn *net.UnixConn
	stop func()
}

// startHandshake sends the init its spec (and fds), under ctx's deadline
// until the handshake's stop.
func (d *Driver) startHandshake(ctx context.Context, conn *net.UnixConn, spec ctl.Spec, fds []int) (*initHandshake, error) {
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	hs := &initHandshake{ctx: ctx, conn: conn, stop: procio.DeadlineOnCancel(ctx, conn.SetDeadline)}
	if err := ctl.WriteFrame(conn, spec, fds...); err != nil {
		hs.stop()
		return nil, fmt.Errorf("send sandbox spec: %w", ctxErr(ctx, err))
	}
	return hs, nil
}

// finish sends what the spec left for later (attach, with fds; nil when
// it left nothing), and waits until the sandbox is built.
func (hs *initHandshake) finish(attach any, fds []int, image string, forkAt time.Time) error {
	ctx, conn := hs.ctx, hs.conn
	var werr error
	if attach != nil {
		// An init that failed before it needed these has answered and
		// gone (the write finds the socket closed): its answer says why.
		werr = ctl.WriteFrame(conn, attach, fds...)
		if werr != nil && !errors.Is(werr, unix.EPIPE) && !errors.Is(werr, unix.ECONNRESET) {
			return fmt.Errorf("send sandbox workspace: %w", ctxErr(ctx, werr))
		}
	}
	var ready ctl.Ready
	got, err := ctl.ReadFrame(conn, &ready)
	procio.CloseFDs(got)
	switch {
	case werr != nil && (err != nil || ready.OK):
		return fmt.Errorf("send sandbox workspace: %w", ctxErr(ctx, werr))
	case err != nil:
		return fmt.Errorf("sandbox init: %w", ctxErr(ctx, err))
	}
	if tr := sandbox.TraceOf(ctx); tr != nil {
		tr.Mark("init_handshake")
		if !forkAt.IsZero() && ready.StartedMicros > 0 {
			tr.Add("init.exec_to_main", time.UnixMicro(ready.StartedMicros).Sub(forkAt))
		}
		for _, s := range ready.Steps {
			tr.Add("init."+s.Name, time.Duration(s.Micros)*time.Microsecond)
		}
	}
	if !ready.OK && ready.BadImage {
		return &sandbox.BadImageError{Image: image, Reason: ready.Error}
	}
	if !ready.OK {
		return fmt.Errorf("sandbox init: %s", ready.Error)
	}
	return nil
}

// startInit starts a sandbox init whose ids 0..65535 map to uidBase
// onwards, and returns it with the gateway's end of its set-up socket.
// The init waits on that socket for its spec; closing the socket first
// makes it exit.
func (d *Driver) startInit(uidBase int, logPath string, cgroupFD int, cgroupTasks []int) (*exec.Cmd, *net.UnixConn, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "init"), os.NewFile(uintptr(pair[1]), "init")
	defer theirs.Close()
	defer ours.Close()
	cmd := &exec.Cmd{
		Path:       d.exe,
		Args:       []string{"sandgate", "sandbox-init"},
		Env:        d.initEnv(),
		Dir:        "/",
		ExtraFiles: []*os.File{theirs}, // fd 3
	}
	if logPath != "" {
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, err
		}
		defer logf.Close()
		cmd.Stderr = logf
	} else {
		cmd.Stderr = &bytes.Buffer{}
	}
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: uidBase, Size: idRange}}
	flags := d.initCloneflags()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 flags,
		UidMappings:                ids,
		GidMappings:                ids,
		GidMappingsEnableSetgroups: true,
		// Root of its user namespace, so that it keeps its capabilities
		// there across exec.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		// Its own session: no signal for the gateway's terminal or process
		// group reaches it, and it outlives the gateway (no Pdeathsig).
		Setsid: true,
	}
	if cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgroupFD
	}
	if err := d.cg.StartJoined(cmd, cgroupTasks); err != nil {
		return nil, nil, fmt.Errorf("start sandbox init: %w", err)
	}
	fc, err := net.FileConn(ours)
	if err != nil {
		killWait(cmd)
		return nil, nil, err
	}
	return cmd, fc.(*net.UnixConn), nil
}

// initEnv is a new init's environment.
func (d *Driver) initEnv() []string {
	env := []string{"GOMAXPROCS=1"}
	if d.cfg.Checkpoint {
		// The Go runtime keeps the cgroup's CPU files open (of the host's
		// cgroupfs) to follow the quota: a checkpoint cannot carry them.
		env = append(env, "GODEBUG=containermaxprocs=0,updatemaxprocs=0")
	}
	return env
}

// initCloneflags are the namespaces a new init is born in.
func (d *Driver) initCloneflags() uintptr {
	flags := uintptr(initFlags)
	if d.cfg.Checkpoint {
		// One cgroup namespace for the whole sandbox, rooted at the init's
		// cgroup: CRIU cannot dump the nested one the spawner thread makes
		// otherwise.
		flags |= syscall.CLONE_NEWCGROUP
	}
	return flags
}

// killWait kills an init this gateway started and has not handed over
// yet, and reaps it.
func killWait(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// probe builds a throwaway sandbox (without cgroups or control socket) to
// learn whether this host supports the driver.
func (d *Driver) probe() error {
	ws, err := unix.OpenTree(unix.AT_FDCWD, d.root, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(ws)
	cmd, conn, err := d.startInit(hostIDBase, "", -1, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Sandboxes are watched through pidfds (Driver 5.3).
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, unix.O_NONBLOCK)
	if err != nil {
		killWait(cmd)
		return fmt.Errorf("pidfd_open: %w", err)
	}
	unix.Close(pidfd)
	ctx, cancel := context.WithTimeout(context.Background(), initTimeout)
	defer cancel()
	spec := ctl.Spec{ID: "probe", Hostname: "probe", TmpBytes: 1 << 20, ShmBytes: 1 << 20, Probe: true, FDs: []string{"workspace"},
		AllowUserNS: d.cfg.AllowUserNS, Seccomp: d.seccompProg}
	herr := d.handshake(ctx, conn, spec, "", []int{ws}, time.Time{})
	if herr != nil {
		_ = cmd.Process.Kill()
	}
	werr := cmd.Wait()
	if herr != nil {
		if out := strings.TrimSpace(cmd.Stderr.(*bytes.Buffer).String()); out != "" && !strings.Contains(herr.Error(), out) {
			return fmt.Errorf("%w (%s)", herr, out)
		}
		return herr
	}
	if werr != nil {
		return fmt.Errorf("probe sandbox: %w", werr)
	}
	return nil
}

// listenUnix makes the control socket at path, listening, and returns its
// descriptor for the init.
func listenUnix(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	addr, done, err := unixAddr(path)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	defer done()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind control socket: %w", err)
	}
	// The init's spawner thread takes one connection at a time (each to
	// its command's fork): a burst of starts waits in this backlog, and a
	// connect finding it full retries (linuxSandbox.dial).
	if err := unix.Listen(fd, 4096); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen on control socket: %w", err)
	}
	return fd, nil
}

// listenUnixIn is listenUnix from the network namespace of process pid.
func listenUnixIn(pid int, path string) (int, error) {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return -1, fmt.Errorf("sandbox network namespace: %w", err)
	}
	defer ns.Close()
	f, err := inNetNS(ns, func() (*os.File, error) {
		fd, err := listenUnix(path)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), "control.sock"), nil
	})
	if err != nil {
		return -1, err
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return -1, fmt.Errorf("control socket: %w", err)
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// unixAddr returns an address for the socket at path that fits in
// sun_path, going through /proc/self/fd when path is too long; done
// releases it.
func unixAddr(path string) (addr string, done func(), err error) {
	if len(path) < 100 {
		return path, func() {}, nil
	}
	dfd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + filepath.Base(path), func() { unix.Close(dfd) }, nil
}

// List returns the ids of the sandboxes present on disk, running or not:
// those of a previous run, when Config.KeepOrphans kept them for Adopt or
// Remove (sandbox.Reattacher).
func (d *Driver) List(ctx context.Context) ([]string, error) {
	return sandbox.ListIDs(d.root)
}

// Adopt returns the running sandbox id of a previous run of the gateway,
// found by its state on disk, usable again as if this driver had created
// it: its files, /tmp and background processes are as they were. It fails
// with an error wrapping os.ErrNotExist when there is no such sandbox or
// its init is gone (Remove then cleans up after it).
func (d *Driver) Adopt(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return d.adopt(ctx, id, false)
}

// adopt is Adopt; restoring says a restore of this driver's made the
// sandbox just now (its lazy-pages daemon, if any, is this driver's).
func (d *Driver) adopt(ctx context.Context, id string, restoring bool) (sandbox.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, fmt.Errorf("invalid sandbox id %q", id)
	}
	st, err := loadState(d.dir(id))
	if err != nil {
		return nil, fmt.Errorf("adopt %s: %w", id, err)
	}
	if st.Stopped {
		return d.adoptStopped(st)
	}
	if st.Protocol != ctl.Protocol {
		return nil, fmt.Errorf("adopt %s: its init speaks control protocol %d, not %d", id, st.Protocol, ctl.Protocol)
	}
	if st.Paused && st.PauseImages != "" {
		if sb, ok, err := d.adoptPausedCheckpoint(st); ok || err != nil {
			return sb, err
		}
	}
	if !restoring && lazyUnfinished(d.dir(id)) {
		// Restored with lazy pages by a gateway that stopped before its
		// daemon copied every page: what is missing reads as zeros.
		cgroup.KillProcs(d.cgroupsOf(st))
		return nil, fmt.Errorf("adopt %s: %w: its memory was still being restored (lazy pages) when the gateway stopped, and may be incomplete: its processes were killed", id, os.ErrNotExist)
	}
	pidfd, err := openInit(st, unix.O_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("adopt %s: %w: %w", id, os.ErrNotExist, err)
	}
	d.mu.Lock()
	if owner, used := d.slots[st.Slot]; used && owner != id || st.Slot <= 0 || st.Slot >= maxSlots {
		d.mu.Unlock()
		unix.Close(pidfd)
		return nil, fmt.Errorf("adopt %s: uid range %d is taken", id, st.Slot)
	}
	d.slots[st.Slot] = id
	d.mu.Unlock()
	sb := newLinuxSandbox(d, st)
	sb.setInit(nil, os.NewFile(uintptr(pidfd), "init"))
	if st.Paused { // frozen on purpose, and so until Unpause: its init cannot answer a dial
		d.noteUnfiltered(st)
		return sb, nil
	}
	// A gateway that died during a snapshot left the sandbox frozen:
	// every command would hang. Adopting always thaws.
	if err := d.thaw(id, d.cgroupsOf(st), "adopted"); err != nil {
		_ = sb.Detach(ctx)
		d.freeSlot(st.Slot, id)
		return nil, fmt.Errorf("adopt %s: %w", id, err)
	}
	c, err := sb.dial(ctx)
	if err != nil {
		_ = sb.Detach(ctx)
		d.freeSlot(st.Slot, id)
		return nil, fmt.Errorf("adopt %s: %w", id, err)
	}
	c.Close()
	d.noteUnfiltered(st)
	return sb, nil
}

// noteUnfiltered lists adopted sandbox st as running without the seccomp
// filter (Seccomp's "unfiltered", in /readyz) when its init predates it,
// paused or not.
func (d *Driver) noteUnfiltered(st *sandboxState) {
	if st.Seccomp || d.noSeccomp {
		return
	}
	d.mu.Lock()
	d.unfiltered[st.ID] = true
	d.mu.Unlock()
	d.log.Warn("sandbox_without_seccomp", "sandbox", st.ID,
		"reason", "adopted from an init that predates the seccomp filter; it runs without it until it ends")
}

// Remove kills sandbox id of a previous run, if its init still runs, and
// removes everything it owns on the host (sandbox.Reattacher).
func (d *Driver) Remove(ctx context.Context, id string) error {
	if !sandbox.ValidID(id) {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	return d.reap(id)
}

// reserveExisting marks the uid ranges of sandboxes on disk as taken.
func (d *Driver) reserveExisting() {
	entries, _ := os.ReadDir(d.root)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range entries {
		if st, err := loadState(d.dir(e.Name())); err == nil && st.Slot > 0 {
			d.slots[st.Slot] = st.ID
		}
	}
}

// removeTemplates removes the workspace templates of earlier runs (Open
// makes a new one), and any half made.
func (d *Driver) removeTemplates() {
	entries, _ := os.ReadDir(d.root)
	for _, e := range entries {
		if p := filepath.Join(d.root, e.Name()); strings.HasPrefix(e.Name(), ".workspace-") {
			_ = unmountUnder(p)
			_ = os.RemoveAll(p)
		}
	}
}

// reapAll reaps every sandbox a previous run left behind.
func (d *Driver) reapAll() {
	entries, err := os.ReadDir(d.root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !sandbox.ValidID(e.Name()) {
			continue
		}
		if err := d.reap(e.Name()); err != nil {
			d.log.Error("sandbox_reap_failed", "sandbox", e.Name(), "err", err)
			continue
		}
		d.log.Warn("sandbox_reaped", "sandbox", e.Name(), "reason", "left by a previous run of the gateway")
	}
}

// reap kills the init of sandbox id if it still runs and removes its
// cgroups, mounts and directory.
func (d *Driver) reap(id string) error {
	dir := d.dir(id)
	st, err := loadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: %w", id, os.ErrNotExist)
		}
	}
	if err != nil || st == nil {
		st = &sandboxState{ID: id, Workspace: filepath.Join(dir, "workspace")}
	}
	cgs := d.cgroupsOf(st)
	// A running sandbox's CPU weight first: one left warm (a pool's, which
	// a restart removes) has the least, at which its init's exit waited
	// for every busy sandbox (teardown).
	_ = d.cg.Started(id)
	if d.beforeKill != nil {
		d.beforeKill(id)
	}
	errs := []error{d.killLeft(st, cgs, "reaped")}
	errs = append(errs, cgroup.Remove(cgs), unmountUnder(dir), os.RemoveAll(dir))
	d.freeSlot(st.Slot, id)
	return errors.Join(errs...)
}

// killLeft kills what runs of sandbox st, which this gateway does not
// hold (a previous run's): it thaws its cgroups cgs (a frozen init, from
// a snapshot cut short, ignores SIGKILL until thawed; why says when, in
// the log), kills its init if it still runs and waits for it, then kills
// whatever the cgroups still hold (without a state file, or with one that
// no longer names its init, they still hold what runs of it).
func (d *Driver) killLeft(st *sandboxState, cgs []string, why string) error {
	d.thaw(st.ID, cgs, why)
	var err error
	if fd, oerr := openInit(st, 0); oerr == nil {
		err = killPidfd(fd, 10*time.Second)
		unix.Close(fd)
	}
	cgroup.KillProcs(cgs)
	return err
}

// cgroupsOf lists the cgroups of the sandbox of st: those its state names
// and those this host's plan would give it.
func (d *Driver) cgroupsOf(st *sandboxState) []string {
	cgs := slices.Clone(st.Cgroups)
	for _, c := range d.cg.DirsFor(st.ID) {
		if !slices.Contains(cgs, c) {
			cgs = append(cgs, c)
		}
	}
	return cgs
}

// thaw thaws the cgroups cgs of sandbox id, which a gateway that died
// during a snapshot left frozen, and logs it when they were (why: what
// is being done to the sandbox).
func (d *Driver) thaw(id string, cgs []string, why string) error {
	frozen, err := cgroup.Thaw(cgs)
	if err != nil {
		d.log.Error("sandbox_thaw_failed", "sandbox", id, "when", why, "err", err)
		return err
	}
	if frozen {
		d.log.Warn("sandbox_thawed", "sandbox", id, "when", why,
			"reason", "left frozen by a snapshot the previous gateway did not finish")
	}
	return nil
}

// withInitTimeout bounds ctx by initTimeout unless it has a deadline.
func withInitTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, initTimeout)
}

// newSandboxDir takes a uid slot for sandbox id and makes its directory.
func (d *Driver) newSandboxDir(id string) (slot int, dir string, err error) {
	if slot, err = d.allocSlot(id); err != nil {
		return 0, "", err
	}
	dir = d.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		d.freeSlot(slot, id)
		return 0, "", fmt.Errorf("sandbox dir: %w", err)
	}
	return slot, dir, nil
}

// unmountUnder unmounts every mount at or below dir, deepest first. It
// reads the mounts of the thread that unmounts them: /proc/self is the
// main thread's, which a locked goroutine that ended in another mount
// namespace leaves parked there.
func unmountUnder(dir string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := mountinfo.Parse(sc.Text()); ok && (m.Point == dir || strings.HasPrefix(m.Point, dir+"/")) {
			points = append(points, m.Point)
		}
	}
	f.Close()
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
