//go:build linux

// Package initd is what runs as a linux sandbox's pid 1 (`sandgate
// sandbox-init`), in the sandbox's namespaces, apart from the gateway: it
// builds the sandbox's root (root_linux.go), then starts every command of the
// session on the gateway's behalf (initd_linux.go). It talks to the gateway
// only through package ctl.
package initd

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// Inside every linux sandbox.
const (
	ttyGID        = 5
	hostBindPerms = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
)

// Main is `sandgate sandbox-init`, the per-session init of the linux
// driver. The gateway starts it in new user, mount, pid, net, ipc and uts
// namespaces with a socketpair on fd 3, sends it an ctl.Spec there, and the
// init builds the sandbox's root filesystem, pivots into it, answers, and
// then serves its control socket: every command of the session is started
// by the init, inside the sandbox, until the gateway kills it.
func Main(args []string) int {
	// The main goroutine keeps the main thread, the thread group's leader,
	// for good: the spawner's goroutine, which locks a thread and moves it
	// into the commands' cgroups, then never takes it. The leader's cgroups
	// are the ones /proc/<pid>/cgroup shows, and, on cgroup v1, the init's
	// memory is charged to the leader's memory cgroup: not the commands'.
	runtime.LockOSThread()
	tm := newStepTimer()
	if len(args) == 2 && args[0] == serveArg {
		catchSignals()
		return serveMain(args[1])
	}
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "sandbox-init: takes no arguments; the gateway starts it")
		return 2
	}
	closeInherited(ctl.SpecFD)
	f := os.NewFile(ctl.SpecFD, "gateway")
	if f == nil {
		fmt.Fprintln(os.Stderr, "sandbox-init: no gateway connection on fd 3")
		return 2
	}
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-init: gateway connection:", err)
		return 2
	}
	c, ok := fc.(*net.UnixConn)
	if !ok {
		fmt.Fprintln(os.Stderr, "sandbox-init: fd 3 is not a unix socket")
		return 2
	}
	var spec ctl.Spec
	fds, err := ctl.ReadFrame(c, &spec)
	if err != nil {
		// The gateway went away before the sandbox was built.
		fmt.Fprintln(os.Stderr, "sandbox-init: read spec:", err)
		return 2
	}
	tm.mark("wait_spec")
	// The descriptors the spec left for later (ctl.Spec.Late): the
	// gateway sends them once the workspace is made.
	late := func() ([]string, []int, error) {
		var a ctl.Attach
		fds, err := ctl.ReadFrame(c, &a)
		if err != nil {
			return nil, nil, fmt.Errorf("read the workspace: %w", err)
		}
		tm.mark("wait_workspace")
		return a.FDs, fds, nil
	}
	in, err := buildSandbox(&spec, fds, late, tm)
	if err != nil {
		_, bad := errors.AsType[*ctl.ImageError](err)
		_ = ctl.WriteFrame(c, ctl.Ready{Error: err.Error(), BadImage: bad})
		fmt.Fprintln(os.Stderr, "sandbox-init:", err)
		return 1
	}
	if spec.Checkpoint {
		// The gateway hears Ready from the re-executed init (serveMain),
		// so that it never looks at the init in the middle of its exec
		// (/proc/<pid>/ns/* can be missing then).
		catchSignals()
		return reexec(in, &spec, c, tm)
	}
	if err := ctl.WriteFrame(c, ctl.Ready{OK: true, Steps: tm.steps, StartedMicros: tm.start.UnixMicro()}); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-init: report ready:", err)
		return 1
	}
	c.Close()
	if spec.Probe {
		return 0
	}
	// Before the first command, which the gateway may ask for as soon as
	// it reads Ready: serve starts none before this.
	catchSignals()
	// Whether commands may skip the shell is asked now, while the
	// gateway answers the create (or the sandbox waits in the warm pool),
	// rather than by the first command: it reads the shell's binary.
	in.sp.run(func() { in.directShell() })
	// Building the root left garbage (the spec, the seccomp program,
	// /etc's files, that read): the sandbox idles on what remains.
	trimMemory()
	in.serve()
	return 1
}

// catchSignals catches and drops the signals that would end the init.
// Nothing in the sandbox runs as the init's user, so no one there can
// signal it; the init has no terminal either. Still, a stray signal must
// not end it. Caught (not ignored), so that commands start with the
// default dispositions, as exec resets handlers but keeps SIG_IGN (the
// gateway may run under nohup). Called once the sandbox is built, not at
// start: os/signal's first use starts a thread of its own (about 0.4 ms
// of a cold create, issue 41 row 11b), and until the sandbox answers
// Ready only root on the host could signal the init, failing that create.
func catchSignals() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
		syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGUSR1, syscall.SIGUSR2,
		syscall.SIGALRM, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGPROF)
}

// ptyMax caps the terminals open at once in one sandbox (its devpts's
// max=): they come out of the host's kernel.pty.max, shared by every
// sandbox, which one sandbox opening /dev/ptmx in a loop would otherwise
// exhaust for the others.
const ptyMax = 64

// limitFiles sets the RLIMIT_NOFILE of the init, and so of every command
// it starts, to soft and hard (ctl.Spec.NofileSoft and NofileHard): the
// gateway's own limit is raised far above what one sandbox may hold. Going
// through syscall.Setrlimit also tells the Go runtime not to restore the
// limit it found at start in the processes it forks. Zero keeps the
// inherited limit.
func limitFiles(soft, hard uint64) error {
	if hard == 0 {
		return nil
	}
	rl := syscall.Rlimit{Cur: min(soft, hard), Max: hard}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("limit open files to %d/%d: %w", rl.Cur, rl.Max, err)
	}
	return nil
}

// writableWorkDir is the image's working directory when the sandbox user
// may write it, else "" (the workspace): an image whose WORKDIR is owned
// by root (most of them, built to run as root) must not start commands
// and SFTP in a directory where they cannot create a file. It runs in the
// sandbox's root, after buildRoot.
func writableWorkDir(dir string) string {
	if dir == "" || dir == ctl.WorkspaceDir {
		return dir
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return ""
	}
	switch {
	case st.Uid == ctl.SandboxUID && st.Mode&0o300 == 0o300,
		st.Gid == ctl.SandboxGID && st.Mode&0o030 == 0o030,
		st.Mode&0o003 == 0o003:
		return dir
	}
	return ""
}

// buildSandbox turns the init's fresh namespaces into the sandbox and
// returns the server of its control socket. It closes fds. late reads the
// descriptors the spec names in Late, when the root needs them.
func buildSandbox(spec *ctl.Spec, fds []int, late func() ([]string, []int, error), tm *stepTimer) (*initd, error) {
	defer procio.CloseFDs(fds)
	if len(fds) != len(spec.FDs) {
		return nil, fmt.Errorf("got %d descriptors for %d names", len(fds), len(spec.FDs))
	}
	var listener *os.File
	var keptTasks []int
	initFD := -1
	workspace, sockFile, rootfs, cpuTasks, etc := -1, -1, -1, -1, -1
	var tasks []int
	take := func(names []string, fds []int) error {
		for i, name := range names {
			switch name {
			case "listener":
				// An *os.File owns its descriptor from here on.
				listener, fds[i] = os.NewFile(uintptr(fds[i]), "control.sock"), -1
			case "workspace":
				workspace = fds[i]
			case "socket-file":
				sockFile = fds[i]
			case "rootfs":
				rootfs = fds[i]
			case "cputasks":
				cpuTasks = fds[i]
			case "etc":
				etc = fds[i]
			case "tasks":
				tasks = append(tasks, fds[i])
			case "init":
				initFD = fds[i]
			default:
				return fmt.Errorf("unknown descriptor %q", name)
			}
		}
		return nil
	}
	defer func() {
		if listener != nil {
			listener.Close()
		}
	}()
	if err := take(spec.FDs, fds); err != nil {
		return nil, err
	}
	if listener == nil && !spec.Probe {
		return nil, fmt.Errorf("no control socket")
	}
	// The spawner thread confines itself (the seccomp filter above all)
	// while this one builds the root; it joins the commands' cgroups once
	// the init is in its cpu cgroup (below). A checkpointable init starts
	// its spawner after its re-exec (reexec).
	var sp *spawner
	if !spec.Checkpoint {
		sp = newSpawner(spawnFilter{on: !spec.NoSeccomp, program: spec.Seccomp})
		defer func() {
			if sp != nil {
				sp.stop()
			}
		}()
	}
	var lateFDs []int
	defer func() { procio.CloseFDs(lateFDs) }()
	attached := len(spec.Late) == 0
	attach := func() (ws, root int, err error) {
		if !attached {
			attached = true
			names, fds, err := late()
			if err != nil {
				return -1, -1, err
			}
			lateFDs = fds
			if len(fds) != len(names) || !slices.Equal(names, spec.Late) {
				return -1, -1, fmt.Errorf("got descriptors %q (%d) for %q", names, len(fds), spec.Late)
			}
			if err := take(names, fds); err != nil {
				return -1, -1, err
			}
		}
		return workspace, rootfs, nil
	}
	if initFD >= 0 {
		spec.InitPath = "/proc/self/fd/" + strconv.Itoa(initFD)
	}
	if err := buildRoot(spec, etc, attach, tm); err != nil {
		return nil, err
	}
	if cpuTasks >= 0 {
		if err := joinCgroup(cpuTasks); err != nil {
			return nil, err
		}
		tm.mark("cpu_join")
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return nil, fmt.Errorf("set hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return nil, err
	}
	tm.mark("net")
	// Nested user namespaces would hand sandbox processes a fresh set of
	// capabilities over new namespaces: a large kernel surface for no need.
	// The seccomp filter refuses them too (EPERM, where this limit answers
	// ENOSPC); the operator may allow them (serve --sandbox-allow-userns).
	if !spec.AllowUserNS {
		if err := os.WriteFile("/proc/sys/user/max_user_namespaces", []byte("0\n"), 0); err != nil {
			return nil, fmt.Errorf("forbid nested user namespaces: %w", err)
		}
	}
	// One limit for the init and its commands, which inherit it: raised
	// above the configured one only when the init needs more for the
	// commands it holds (a session with many pids). Commands then start
	// with no extra step.
	soft := max(spec.NofileSoft, spec.InitNofile)
	if err := limitFiles(soft, max(spec.NofileHard, soft)); err != nil {
		return nil, err
	}
	tm.mark("limits")
	var err error
	if spec.Checkpoint {
		// The host's /dev/null and init.log are outside the sandbox's
		// mounts, where a checkpoint cannot find them: stdio is the
		// sandbox's own /dev/null from here on. The spawner starts after
		// the re-exec (reexec), which keeps the tasks files open for it.
		if err := stdioDevNull(); err != nil {
			return nil, err
		}
		for _, fd := range tasks {
			kept, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, 3)
			if err != nil {
				return nil, err
			}
			keptTasks = append(keptTasks, kept)
		}
	} else {
		err = sp.join(tasks)
		tm.steps = append(tm.steps, ctl.Step{Name: "seccomp_bg", Micros: sp.filterTime.Microseconds()})
		if err != nil {
			sp = nil // its thread has ended
			return nil, err
		}
	}
	tm.mark("seccomp")
	in := &initd{etcTemplate: etc >= 0 && !slices.Contains(spec.FDs, "rootfs") && !slices.Contains(spec.Late, "rootfs"), checkpoint: spec.Checkpoint, tasks: keptTasks, sp: sp, shell: sandbox.FindShell(), waiters: map[int]*child{}, jobs: map[string]*child{}, sockFile: -1, ln: -1,
		forked: make(chan struct{}, 1),
		env:    spec.Env, workDir: writableWorkDir(spec.WorkingDir),
		sockCheck: max(time.Duration(spec.SocketCheckMillis)*time.Millisecond, 100*time.Millisecond)}
	if sockFile >= 0 {
		if in.sockFile, err = unix.FcntlInt(uintptr(sockFile), unix.F_DUPFD_CLOEXEC, 3); err != nil {
			return nil, err
		}
	}
	if listener != nil {
		// A duplicate, blocking: the spawner thread waits in accept(2).
		if in.ln, err = unix.FcntlInt(listener.Fd(), unix.F_DUPFD_CLOEXEC, 3); err != nil {
			return nil, fmt.Errorf("control socket: %w", err)
		}
		if err := unix.SetNonblock(in.ln, false); err != nil {
			return nil, fmt.Errorf("control socket: %w", err)
		}
	}
	sp = nil // in's from here on
	return in, nil
}

// joinCgroup moves every thread of the init into the cgroup whose tasks
// file is open at fd (the sandbox's cgroup of the v1 cpu hierarchy,
// cgroup.Set.CPUTasks), each thread writing "0", which moves the writing
// thread alone: the kernel then skips its global threadgroup lock, whose
// RCU grace period (5-20 ms) writing a thread id waits for. Threads made
// later inherit the cgroup of the thread that makes them. A runtime that
// cannot run a syscall on every thread (an init linked with cgo: the
// gateway's own binary built so) writes each thread's id instead.
func joinCgroup(fd int) error {
	zero := []byte("0")
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&zero[0])), 1)
	runtime.KeepAlive(zero)
	switch {
	case errno == 0:
		return nil
	case errno != syscall.ENOTSUP:
		return fmt.Errorf("join the sandbox's cpu cgroup: %w", errno)
	}
	// Until a pass finds no thread it had not moved: one made meanwhile
	// by a thread not yet moved is moved by the next pass.
	moved := map[string]bool{}
	for pass := 0; ; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("join the sandbox's cpu cgroup: %w", err)
		}
		fresh := false
		for _, t := range tasks {
			if moved[t.Name()] {
				continue
			}
			fresh = true
			if _, err := unix.Write(fd, []byte(t.Name())); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("join the sandbox's cpu cgroup: %w", err)
			}
			moved[t.Name()] = true
		}
		if !fresh {
			return nil
		}
		if pass > 100 {
			return errors.New("join the sandbox's cpu cgroup: its threads keep changing")
		}
	}
}

// stdioDevNull points the init's stdin, stdout and stderr at /dev/null.
func stdioDevNull() error {
	fd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("stdio: %w", err)
	}
	defer unix.Close(fd)
	for i := range 3 {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return fmt.Errorf("stdio: %w", err)
		}
	}
	return nil
}

// closeInherited closes the descriptors this process inherited without
// close-on-exec (other than stdio and keep): whatever the gateway's own
// parent left open must not reach the sandbox.
func closeInherited(keep ...int) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || slices.Contains(keep, fd) {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}

// buildRoot assembles the sandbox's root filesystem and pivots into
// it: a tmpfs with the host's /usr and the sandbox's own /etc, or, when
// the spec has a "rootfs", the image root the gateway built (a detached
// overlay mount). The workspace, when there is one, is a detached mount
// (open_tree); it is attached at /workspace. attach returns both (-1:
// none), waiting for them if the gateway sends them late: the default
// root is built before that.
func buildRoot(spec *ctl.Spec, etc int, attach func() (ws, root int, err error), tm *stepTimer) error {
	// Nothing mounted here may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	r := "/tmp"
	if fi, err := os.Lstat(r); err != nil || !fi.IsDir() {
		r = "/mnt"
	}
	image := slices.Contains(spec.FDs, "rootfs") || slices.Contains(spec.Late, "rootfs")
	if image {
		_, rootFD, err := attach()
		if err != nil {
			return err
		}
		if rootFD < 0 {
			return errors.New("no image root")
		}
		if err := imageRootAt(r, rootFD, spec.Hostname); err != nil {
			return err
		}
		tm.mark("root")
	} else {
		if err := hostRootAt(r); err != nil {
			return err
		}
		tm.mark("root")
		if etc >= 0 {
			if err := etcFromTemplate(r, etc, spec.Hostname, spec.TrustPEM, spec.Checkpoint); err != nil {
				return err
			}
		} else if err := buildEtc(filepath.Join(r, "etc"), spec.Hostname, spec.TrustPEM); err != nil {
			return err
		}
		tm.mark("etc")
	}
	if err := finishRoot(r, spec, attach, image, tm); err != nil {
		return err
	}
	tm.mark("pivot")
	return nil
}

// hostRootAt builds the default root at r: a tmpfs with read-only binds of
// the host's /usr (and /bin, /lib... where they are directories); buildRoot
// then adds the sandbox's own /etc.
func hostRootAt(r string) error {
	if err := mount("tmpfs", r, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return err
	}
	for _, d := range []string{"usr", "etc", "proc", "dev", "tmp", "workspace"} {
		if err := os.Mkdir(filepath.Join(r, d), 0o755); err != nil {
			return fmt.Errorf("new root: %w", err)
		}
	}
	// /bin, /lib and friends are symlinks into /usr on merged-/usr hosts,
	// directories elsewhere.
	for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		host := "/" + name
		fi, err := os.Lstat(host)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err != nil {
				return fmt.Errorf("read %s: %w", host, err)
			}
			if err := os.Symlink(target, filepath.Join(r, name)); err != nil {
				return fmt.Errorf("new root: %w", err)
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(r, name), 0o755); err != nil {
				return fmt.Errorf("new root: %w", err)
			}
			if err := roBind(host, filepath.Join(r, name)); err != nil {
				return err
			}
		}
	}
	return roBind("/usr", filepath.Join(r, "usr"))
}

// finishRoot adds /dev, /proc, /tmp and the workspace to the root at r,
// pivots into it and makes what must be read-only so (the whole root but
// for an image's, whose writable layer is the session's).
func finishRoot(r string, spec *ctl.Spec, attach func() (ws, root int, err error), image bool, tm *stepTimer) error {
	if err := buildDev(r, spec.ShmBytes); err != nil {
		return err
	}
	tm.mark("dev")
	if err := mount("proc", filepath.Join(r, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", filepath.Join(r, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
		fmt.Sprintf("mode=1777,size=%d", spec.TmpBytes)); err != nil {
		return err
	}
	tm.mark("proc_tmp")
	wsFD, _, err := attach()
	if err != nil {
		return err
	}
	if wsFD >= 0 {
		if err := unix.MoveMount(wsFD, "", unix.AT_FDCWD, filepath.Join(r, "workspace"), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach workspace: %w", err)
		}
	}
	if spec.Checkpoint && spec.InitPath != "" {
		p := filepath.Join(r, selfPath)
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			return fmt.Errorf("init binary: %w", err)
		}
		fd, err := strconv.Atoi(strings.TrimPrefix(spec.InitPath, "/proc/self/fd/"))
		if err != nil {
			return fmt.Errorf("init binary: %w", err)
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("init binary: %w", err)
		}
	}
	if err := unix.Chdir(r); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	// The old root is stacked on the new one: detach it.
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	readOnly := []string{"/", "/dev"}
	if image {
		readOnly = readOnly[1:]
		if _, err := os.Stat("/bin/sh"); err != nil {
			return &ctl.ImageError{Reason: "it has no /bin/sh: a session needs a shell"}
		}
		if spec.TrustPEM != "" {
			if err := imageTrust(spec.TrustPEM); err != nil {
				return err
			}
		}
	}
	for _, p := range readOnly {
		if err := setReadOnly(p); err != nil {
			return err
		}
	}
	return nil
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", src, dst, err)
	}
	return nil
}

// roBind binds the host's src at dst, recursively, read-only, nosuid and nodev.
func roBind(src, dst string) error {
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	attr := &unix.MountAttr{Attr_set: hostBindPerms}
	if err := unix.MountSetattr(unix.AT_FDCWD, dst, unix.AT_RECURSIVE, attr); err != nil {
		// Kernels before 5.12: remount the top mount, keeping the flags
		// a user namespace may not change.
		flags := lockedFlags(dst) | unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV
		if err := unix.Mount("", dst, "", flags, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", dst, err)
		}
	}
	return nil
}

// setReadOnly makes the mount at p read-only (not its submounts).
func setReadOnly(p string) error {
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, p, 0, attr); err != nil {
		flags := lockedFlags(p) | unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY
		if err := unix.Mount("", p, "", flags, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// lockedFlags returns the mount flags of p that a remount must repeat.
func lockedFlags(p string) uintptr {
	var st unix.Statfs_t
	if unix.Statfs(p, &st) != nil {
		return 0
	}
	var f uintptr
	for _, m := range []struct{ st, ms int64 }{
		{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st.Flags&m.st != 0 {
			f |= uintptr(m.ms)
		}
	}
	return f
}

// etcSecrets are host /etc entries (patterns of paths below /etc) the
// sandbox must not read, even where their permissions would already stop
// it. In the sandbox's /etc each is an empty entry of mode 0.
var etcSecrets = []string{
	"shadow", "shadow-", "gshadow", "gshadow-", "passwd-", "group-", "security/opasswd",
	"ssl/private", "sandgate", "ssh/ssh_host_*key",
}

// etcOwn are the /etc files the sandbox gets its own version of.
var etcOwn = []string{"passwd", "group", "hostname", "hosts", "machine-id", "resolv.conf", bundleName}

// nameFiles are the /etc files that name the sandbox: hostname, hosts and
// machine-id (its own, random: never the host's, which would tie every
// session to the host and to each other), and resolv.conf, which names
// the gateway's resolver on the sandbox's loopback (linuxns.ResolverAddr;
// nothing answers there when the session has no egress).
func nameFiles(hostname string) map[string]string {
	return map[string]string{
		"machine-id": machineID(),
		"hostname":   hostname + "\n",
		"hosts":      "127.0.0.1\tlocalhost\n127.0.1.1\t" + hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		// TCP fallback works too (the resolver serves both).
		"resolv.conf": "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n",
	}
}

// machineID is a new machine-id(5): 32 lower-case hex digits of
// randomness, and a newline.
func machineID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:]) + "\n"
}

// ownEtc are the sandbox's own passwd and group, the same in every
// default root.
func ownEtc() map[string]string {
	return map[string]string{
		"passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
			fmt.Sprintf("sandbox:x:%d:%d:sandbox:%s:/bin/bash\n", ctl.SandboxUID, ctl.SandboxGID, ctl.WorkspaceDir) +
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group": "root:x:0:\ntty:x:5:\n" + fmt.Sprintf("sandbox:x:%d:\n", ctl.SandboxGID) + "nogroup:x:65534:\n",
	}
}

// etcCopyMax is the size up to which a host /etc file is copied into the
// sandbox's /etc; larger ones are bound.
const etcCopyMax = 64 << 10

// buildEtc makes the sandbox's /etc at dst: a tmpfs of the sandbox's own,
// never the host's directory. Small host files are copied, directories and
// large files are bound read-only one by one, secrets are empty entries of
// mode 0, and passwd, group, hostname and hosts are the sandbox's. So no
// host-side change (a rename over /etc/passwd, new host keys) can ever
// show a hidden file: a bind follows the inode it was made on, and nothing
// is mounted over a host dentry that the host could replace.
func buildEtc(dst, hostname, trustPEM string) error {
	if err := mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=4m"); err != nil {
		return err
	}
	if err := copyEtcDir("/etc", dst, ""); err != nil {
		return err
	}
	own := ownEtc()
	maps.Copy(own, nameFiles(hostname))
	for name, content := range own {
		if err := os.WriteFile(filepath.Join(dst, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
	}
	if trustPEM != "" {
		if err := hostTrust(dst, trustPEM); err != nil {
			return err
		}
	}
	return setReadOnly(dst)
}

// BuildEtcTemplate fills the tmpfs whose root is open at root, a mount
// that no namespace holds (fsmount), with what every default root's /etc
// shares: what buildEtc makes but for the files that name a sandbox
// (hostname, hosts, machine-id, resolv.conf), which are empty files there
// for each sandbox's own to be bound over (etcFromTemplate). It returns
// the host paths whose contents the template copied (files, and the
// directories whose entries it listed), for the gateway to notice when
// one changes. The gateway makes the whole tree read-only.
func BuildEtcTemplate(root int) ([]string, error) {
	dir := "/proc/self/fd/" + strconv.Itoa(root)
	read := []string{"/etc"}
	if err := copyEtcDirNoting("/etc", dir, "", &etcCopy{bind: treeBind, read: &read, asOther: true}); err != nil {
		return nil, err
	}
	if err := writeShared(dir); err != nil {
		return nil, err
	}
	return read, nil
}

// BuildEtcDir fills dir, an empty directory of the host, with a
// checkpointable default root's /etc (the gateway's, one for every such
// sandbox, bound read-only at its /etc): what BuildEtcTemplate makes, but
// with the host's directories and large files copied instead of bound, so
// that /etc is one mount, not one per host directory, for CRIU to dump
// and restore. Entries others may not read stay masked, as in the
// template. It returns the host paths it read, as BuildEtcTemplate does.
func BuildEtcDir(dir string) ([]string, error) {
	read := []string{"/etc"}
	if err := copyEtcDirNoting("/etc", dir, "", &etcCopy{read: &read, asOther: true, copyDirs: true, left: etcDirMax}); err != nil {
		return nil, err
	}
	if err := writeShared(dir); err != nil {
		return nil, err
	}
	return read, nil
}

// writeShared writes, in the shared /etc at dir (a template, an /etc
// dir), the sandbox's passwd and group, and the empty files each sandbox
// binds its own over (templateOwn).
func writeShared(dir string) error {
	for name, content := range ownEtc() {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
	}
	for _, name := range templateOwn() {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
	}
	return nil
}

// EtcOwnNames are the names, in /etc, of the files that each default
// root whose /etc is the template binds its own over (templateOwn).
func EtcOwnNames() []string { return templateOwn() }

// templateOwn are the files of the /etc template that each sandbox binds
// its own over: those that name it, and the trust bundle (empty, but for
// a session with a CA: sandbox.TrustBundle).
func templateOwn() []string {
	return append(slices.Sorted(maps.Keys(nameFiles(""))), bundleName)
}

// treeBind binds src at dst as roBind does, with the mount API, which
// also binds into a detached mount (Linux 6.15 and later). src is never
// followed if it is a symlink: the gateway binds as host root, and an
// entry of the host's /etc made a symlink since it was looked at must not
// bind what it names (host root's /root, say) into every sandbox.
func treeBind(src, dst string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: hostBindPerms}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// etcFromTemplate attaches the /etc template the gateway sent (a detached
// read-only mount, open at etc) at r/etc, and binds over its empty
// hostname, hosts, machine-id and resolv.conf the sandbox's own, and,
// with trustPEM, the trust bundle over the empty TrustBundle and the
// host's store (bindOwn). For a checkpointable sandbox (checkpoint), etc
// is a bind of the gateway's /etc dir (BuildEtcDir), and the tmpfs that
// holds the sandbox's own files stays mounted, at /.sandgate-etc: CRIU
// dumps a bind only of a filesystem it can reach.
func etcFromTemplate(r string, etc int, hostname, trustPEM string, checkpoint bool) error {
	dst := filepath.Join(r, "etc")
	if err := unix.MoveMount(etc, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach /etc: %w", err)
	}
	own := map[string][]byte{}
	for name, content := range nameFiles(hostname) {
		own[filepath.Join(dst, name)] = []byte(content)
	}
	if trustPEM != "" {
		maps.Copy(own, trustFiles(dst, trustPEM))
	}
	if checkpoint {
		return bindOwnKept(r, own)
	}
	return bindOwn(r, own)
}

// EtcHolder is, in a checkpointable default root, the tmpfs holding the
// sandbox's own /etc files (etcFromTemplate), each bound over /etc's.
const EtcHolder = "/.sandgate-etc"

// bindOwnKept is bindOwn with the holder tmpfs kept, read-only, at
// dir/.sandgate-etc (EtcHolder).
func bindOwnKept(dir string, own map[string][]byte) error {
	holder := filepath.Join(dir, EtcHolder)
	if err := os.Mkdir(holder, 0o755); err != nil {
		return fmt.Errorf("/etc: %w", err)
	}
	if err := mount("tmpfs", holder, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=16m"); err != nil {
		return err
	}
	if err := writeOwn(holder, own); err != nil {
		return err
	}
	return setReadOnly(holder)
}

// trustFiles are the trust bundle made of the host's store (in the
// sandbox's /etc at etc, a template's) and pem, at TrustBundle and over
// the store.
func trustFiles(etc, pem string) map[string][]byte {
	system, store := systemBundle(etc)
	bundle := joinPEM(system, pem)
	files := map[string][]byte{filepath.Join(etc, bundleName): bundle}
	if store != "" {
		files[filepath.Join(etc, store)] = bundle
	}
	return files
}

// bindOwn binds, read-only, each file of own (path -> content) over the
// path, from a tmpfs of the sandbox's own made for them at dir/.etc-own
// (dir, writable, is the sandbox's root) and detached once they are bound:
// they are the sandbox root's files, each with its one link, and only
// /etc names them.
func bindOwn(dir string, own map[string][]byte) (err error) {
	holder := filepath.Join(dir, ".etc-own")
	if err := os.Mkdir(holder, 0o700); err != nil {
		return fmt.Errorf("/etc: %w", err)
	}
	defer func() {
		if rerr := os.Remove(holder); err == nil && rerr != nil {
			err = fmt.Errorf("/etc: %w", rerr)
		}
	}()
	if err := mount("tmpfs", holder, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=16m"); err != nil {
		return err
	}
	defer func() {
		if uerr := unix.Unmount(holder, unix.MNT_DETACH); err == nil && uerr != nil {
			err = fmt.Errorf("/etc: %w", uerr)
		}
	}()
	return writeOwn(holder, own)
}

// writeOwn writes each file of own (path -> content) in the directory
// holder, and binds it read-only over the path.
func writeOwn(holder string, own map[string][]byte) error {
	i := 0
	for _, dst := range slices.Sorted(maps.Keys(own)) {
		i++
		src := filepath.Join(holder, strconv.Itoa(i))
		if err := os.WriteFile(src, own[dst], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", dst, err)
		}
		if err := unix.Chmod(src, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", dst, err)
		}
		if err := roBind(src, dst); err != nil {
			return err
		}
	}
	return nil
}

// copyEtcDir fills dst, a directory of the sandbox's /etc, from the host
// directory host, which is /etc/rel. Entries that vanish meanwhile are
// skipped; devices, FIFOs and sockets are never carried over.
func copyEtcDir(host, dst, rel string) error {
	return copyEtcDirNoting(host, dst, rel, &etcCopy{bind: roBind})
}

// etcCopy is how copyEtcDirNoting binds (roBind, or treeBind into a
// detached mount), and what it notes: the host files it copied and the
// directories below /etc it listed, when read is not nil.
type etcCopy struct {
	bind func(src, dst string) error
	read *[]string
	// asOther copies only the files that others may read, and masks the
	// rest, as for an init (which reads the host's /etc as no owner of
	// its files): the gateway builds the template as host root.
	asOther bool
	// copyDirs copies directories (those others may list; the rest are
	// masked) and files of any size instead of binding them (BuildEtcDir),
	// strictly: no path with a symlink in it is opened (an entry of a
	// host directory that another account may write, swapped for a
	// symlink since it was looked at, must not show what it names), a
	// directory is listed only if others may list the one opened, group
	// and others lose write permission, and the copy stops at etcDirMax.
	copyDirs bool
	// left is what the copy may still take (copyDirs).
	left etcBudget
}

// etcBudget is a count of entries and bytes.
type etcBudget struct{ entries, bytes int64 }

// etcDirMax bounds the gateway's copy of the host's /etc (BuildEtcDir),
// which fails past it (the inits then build their own /etc): Debian's
// holds some 1,300 entries and 4 MiB.
var etcDirMax = etcBudget{entries: 20000, bytes: 64 << 20}

// take counts one entry of size bytes against c's budget.
func (c *etcCopy) take(size int64) error {
	if !c.copyDirs {
		return nil
	}
	c.left.entries--
	c.left.bytes -= max(size, 0)
	if c.left.entries < 0 || c.left.bytes < 0 {
		return fmt.Errorf("etc: the host's /etc is larger than the gateway copies (%d entries, %d MiB)", etcDirMax.entries, etcDirMax.bytes>>20)
	}
	return nil
}

// copyEtcDirNoting is copyEtcDir with c's bind and notes.
func copyEtcDirNoting(host, dst, rel string, c *etcCopy) error {
	read := c.read
	var entries []os.DirEntry
	var err error
	if c.copyDirs {
		entries, err = readDirStrict(host)
	} else {
		entries, err = readDir(host, rel != "")
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", host, err)
	}
	for _, e := range entries {
		name := path.Join(rel, e.Name())
		h, d := filepath.Join(host, e.Name()), filepath.Join(dst, e.Name())
		if rel == "" && slices.Contains(etcOwn, name) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if err := c.take(fi.Size()); err != nil {
			return err
		}
		if etcSecret(name) {
			if err := maskEntry(d, fi.IsDir()); err != nil {
				return err
			}
			continue
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(h)
			if err != nil {
				continue
			}
			if err := os.Symlink(target, d); err != nil {
				return fmt.Errorf("etc: %w", err)
			}
		case fi.IsDir() && (etcSecretBelow(name) || c.copyDirs) && c.asOther && fi.Mode().Perm()&0o005 != 0o005:
			// A directory others may not list: the init could not copy
			// it; the gateway, host root, does not either.
			if err := maskEntry(d, true); err != nil {
				return err
			}
		case fi.IsDir() && (etcSecretBelow(name) || c.copyDirs):
			perm := fi.Mode().Perm()
			if c.copyDirs {
				perm &^= 0o022
			}
			if err := os.Mkdir(d, perm); err != nil {
				return fmt.Errorf("etc: %w", err)
			}
			if read != nil {
				*read = append(*read, h)
			}
			if err := copyEtcDirNoting(h, d, name, c); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("etc: %w", err)
			}
			if err := bindEtc(c.bind, h, d); err != nil {
				return err
			}
		case fi.Mode().IsRegular() && (fi.Size() <= etcCopyMax || c.copyDirs):
			if read != nil {
				*read = append(*read, h)
			}
			if c.asOther && fi.Mode().Perm()&0o004 == 0 {
				if err := maskEntry(d, false); err != nil {
					return err
				}
				continue
			}
			if err := copyEtcFile(h, d, fi.Mode().Perm(), c.asOther, c.copyDirs); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := os.WriteFile(d, nil, 0o644); err != nil {
				return fmt.Errorf("etc: %w", err)
			}
			if err := bindEtc(c.bind, h, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// readDir is os.ReadDir; with noFollow, of a directory that must not be
// a symlink: an entry of the host's /etc looked at as a directory, and
// turned into a symlink since, is not followed (to a directory that only
// host root, as whom the gateway copies, may list). /etc itself is.
func readDir(dir string, noFollow bool) ([]os.DirEntry, error) {
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	if noFollow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(dir, flags, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}

// readDirStrict is readDir of a host directory opened with no symlink in
// its path, listed only if others may list it (copyDirs).
func readDirStrict(dir string) ([]os.DirEntry, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&0o005 != 0o005 {
		return nil, fmt.Errorf("others may not list it (mode %o)", st.Mode&0o7777)
	}
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}

// bindEtc binds the host's h at d, read-only. An entry the host removed
// meanwhile is left empty.
func bindEtc(bind func(src, dst string) error, h, d string) error {
	if err := bind(h, d); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// copyEtcFile copies the host file h to d with mode perm, in the kernel
// (sendfile: no buffer of the init's, whose heap every idle sandbox
// keeps). A file the sandbox's init may not read (host root's, mode
// 0600) becomes an empty entry of mode 0: unreadable in the sandbox too.
// With asOther (the gateway, host root, copies), so does a file that
// others may not read, judged on the file opened: not on what a look at
// h found before, which a file renamed over h since (a 0600 one) belies.
//
// strict (copyDirs) opens h with no symlink anywhere in its path, and
// without blocking (a FIFO swapped in), and takes group and others' write
// permission away.
func copyEtcFile(h, d string, perm os.FileMode, asOther, strict bool) error {
	var in int
	var err error
	if strict {
		in, err = unix.Openat2(unix.AT_FDCWD, h, &unix.OpenHow{
			Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		if errors.Is(err, unix.ELOOP) {
			return maskEntry(d, false)
		}
	} else {
		in, err = unix.Open(h, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}
	switch {
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		return maskEntry(d, false)
	case err != nil:
		return nil // gone meanwhile (or no longer a file)
	}
	defer unix.Close(in)
	if asOther {
		var st unix.Stat_t
		if err := unix.Fstat(in, &st); err != nil {
			return fmt.Errorf("etc: %s: %w", h, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o004 == 0 {
			return maskEntry(d, false)
		}
		perm = os.FileMode(st.Mode & 0o7777).Perm()
	}
	if strict {
		perm &^= 0o022
	}
	out, err := unix.Open(d, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("etc: %w", err)
	}
	defer unix.Close(out)
	for {
		n, err := unix.Sendfile(out, in, nil, etcCopyMax)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EISDIR) {
			break // not a regular file any more: left empty
		}
		if err != nil {
			return fmt.Errorf("etc: copy %s: %w", h, err)
		}
		if n == 0 {
			break
		}
	}
	// The mode set on the descriptor, not through the umask.
	if err := unix.Fchmod(out, uint32(perm)); err != nil {
		return fmt.Errorf("etc: %w", err)
	}
	return nil
}

// maskEntry makes d an empty file or directory of mode 0.
func maskEntry(d string, dir bool) error {
	var err error
	if dir {
		err = os.Mkdir(d, 0)
	} else {
		err = os.WriteFile(d, nil, 0)
	}
	if err != nil {
		return fmt.Errorf("etc: %w", err)
	}
	return nil
}

// etcSecret reports whether name, a path below /etc, is one of etcSecrets.
func etcSecret(name string) bool {
	for _, p := range etcSecrets {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// etcSecretBelow reports whether a secret lies below the directory name.
func etcSecretBelow(name string) bool {
	for _, p := range etcSecrets {
		if strings.HasPrefix(p, name+"/") {
			return true
		}
	}
	return false
}

// buildDev makes a minimal /dev under r: the harmless character devices of
// the host bound in (a user namespace cannot mknod), a private devpts
// instance, and a size-limited /dev/shm.
func buildDev(r string, shmBytes int64) error {
	dev := filepath.Join(r, "dev")
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, name)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
		if err := mount("/dev/"+name, p, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		fmt.Sprintf("newinstance,ptmxmode=0666,mode=0620,gid=%d,max=%d", ttyGID, ptyMax)); err != nil {
		return err
	}
	if err := mount("tmpfs", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
		fmt.Sprintf("mode=1777,size=%d", shmBytes)); err != nil {
		return err
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd",
		"stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	return nil
}

// loopbackUp brings up lo, the sandbox's only network interface.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// imageRootAt attaches the image root rootFD at r and gives it what every
// sandbox has: the mount points, the sandbox user in /etc/passwd and
// /etc/group (added when absent), and the sandbox's hostname. These writes
// land in the session's writable layer, never in the image.
func imageRootAt(r string, rootFD int, hostname string) error {
	if err := unix.MoveMount(rootFD, "", unix.AT_FDCWD, r, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the image root: %w", err)
	}
	for _, d := range []string{"proc", "dev", "tmp", "workspace", "etc"} {
		p := filepath.Join(r, d)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("image root: %w", err)
		}
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			return &ctl.ImageError{Reason: "/" + d + " is not a directory"}
		}
	}
	user := fmt.Sprintf("sandbox:x:%d:%d:sandbox:%s:/bin/sh\n", ctl.SandboxUID, ctl.SandboxGID, ctl.WorkspaceDir)
	group := fmt.Sprintf("sandbox:x:%d:\n", ctl.SandboxGID)
	for _, f := range []struct{ name, root, add string }{
		{"passwd", "root:x:0:0:root:/root:/bin/sh\n", user},
		{"group", "root:x:0:\n", group},
	} {
		if err := addEntry(filepath.Join(r, "etc", f.name), f.root, f.add); err != nil {
			return err
		}
	}
	for name, content := range nameFiles(hostname) {
		p := filepath.Join(r, "etc", name)
		if fi, err := os.Lstat(p); err == nil && !fi.Mode().IsRegular() {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("image /etc/%s: %w", name, err)
			}
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("image /etc/%s: %w", name, err)
		}
	}
	return nil
}

// addEntry appends line to the passwd or group file p unless an entry of
// the same name is there; a missing file starts with root's entry. A file
// that is a symlink is replaced, never followed.
func addEntry(p, root, line string) error {
	name, _, _ := strings.Cut(line, ":")
	fi, err := os.Lstat(p)
	var old []byte
	switch {
	case err == nil && fi.Mode().IsRegular():
		if old, err = os.ReadFile(p); err != nil {
			return fmt.Errorf("image %s: %w", p, err)
		}
	case err == nil:
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("image %s: %w", p, err)
		}
		old = []byte(root)
	case errors.Is(err, fs.ErrNotExist):
		old = []byte(root)
	default:
		return fmt.Errorf("image %s: %w", p, err)
	}
	for _, l := range strings.Split(string(old), "\n") {
		if n, _, _ := strings.Cut(l, ":"); n == name {
			return nil
		}
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		old = append(old, '\n')
	}
	if err := os.WriteFile(p, append(old, line...), 0o644); err != nil {
		return fmt.Errorf("image %s: %w", p, err)
	}
	return nil
}

// stepTimer times the init's steps of building a sandbox, for the
// gateway's trace of the create (ctl.Ready.Steps).
type stepTimer struct {
	start time.Time
	last  time.Time
	steps []ctl.Step
}

func newStepTimer() *stepTimer {
	now := time.Now()
	return &stepTimer{start: now, last: now}
}

// mark ends the step name now.
func (t *stepTimer) mark(name string) {
	now := time.Now()
	t.steps = append(t.steps, ctl.Step{Name: name, Micros: now.Sub(t.last).Microseconds()})
	t.last = now
}
