//go:build linux

package initd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// initd is the running init: it starts commands for the gateway, reports
// how they end, and reaps every process of the sandbox (it is pid 1).
type initd struct {
	ln    *net.UnixListener
	sp    *spawner
	shell string
	// env and workDir come from the sandbox's image: the environment
	// commands start from (over the sandbox's own) and where they start
	// ("": the workspace).
	env     []string
	workDir string
	// sockFile is an O_PATH descriptor of the control socket's file on
	// the host (-1: none), checked every sockCheck.
	sockFile  int
	sockCheck time.Duration

	// mu orders fork against reap, so that a child that exits at once is
	// never reaped before it is registered in waiters.
	mu      sync.Mutex
	waiters map[int]*child
}

// child is a command started for one control connection.
type child struct {
	pid int
	uts nsID // the command's own UTS namespace: its tree
	// utsFD holds that namespace open until the command is done with, so
	// that its inode (uts) cannot name the next command's namespace while
	// a delayed killTree may still look for it.
	utsFD  int
	status chan syscall.WaitStatus // receives the exit status, once
	exited atomic.Bool
	kill   sync.Once
}

// end is Process.Kill inside the sandbox. While the command's first
// process still runs, its process group gets SIGHUP (and SIGCONT, so
// stopped jobs see it), and after a grace every process of its tree gets
// SIGKILL, whatever it did to leave the group (setsid, double fork,
// ignoring SIGHUP). Once that process has ended on its own, what it left
// running was detached on purpose (nohup job &) and stays: end does nothing.
//
// end is called at least once for every command (when its control
// connection ends, if not before), and releases the namespace's fd.
func (c *child) end() {
	c.kill.Do(func() {
		if c.exited.Load() {
			unix.Close(c.utsFD)
			return
		}
		_ = unix.Kill(-c.pid, unix.SIGHUP)
		_ = unix.Kill(-c.pid, unix.SIGCONT)
		time.AfterFunc(sandbox.KillGrace, func() {
			killTree(c.uts)
			unix.Close(c.utsFD)
		})
	})
}

// nsID names a namespace: the device and inode of its nsfs file.
type nsID struct{ dev, ino uint64 }

func nsOf(p string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return nsID{}, err
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// openNS opens the namespace file p and names it.
func openNS(p string) (int, nsID, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nsID{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nsID{}, err
	}
	return fd, nsID{dev: st.Dev, ino: st.Ino}, nil
}

// killTree sends SIGKILL to every process of the sandbox in the UTS
// namespace uts: one command's tree. Each command gets a namespace of its
// own at start, which its processes inherit and cannot leave (no
// capabilities, no nested user namespaces). It repeats while it finds
// some, as a process may fork while the tree is killed. Under serve
// --sandbox-allow-userns a process can leave it (a new user namespace,
// then a UTS one): it then outlives its command's kill, though never the
// sandbox, whose pid namespace ends with the init.
func killTree(uts nsID) {
	for range 100 {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		found := false
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 {
				continue
			}
			if ns, err := nsOf("/proc/" + e.Name() + "/ns/uts"); err == nil && ns == uts {
				_ = unix.Kill(pid, unix.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serve accepts control connections until the listener fails.
func (in *initd) serve() {
	if in.sockFile >= 0 {
		go in.watchSocketFile()
	}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	go func() {
		for {
			in.reap()
			<-sigc
		}
	}()
	for {
		c, err := in.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: a command's connection cannot be taken
			// now; the gateway sees it fail and may retry.
			fmt.Fprintln(os.Stderr, "sandbox-init: accept:", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go in.handle(c)
	}
}

// watchSocketFile ends the sandbox once its control socket's file is gone
// from the host (its data dir was deleted): no gateway can ever reach it
// again, so it must not live on as an orphan.
func (in *initd) watchSocketFile() {
	for range time.Tick(in.sockCheck) {
		var st unix.Stat_t
		if err := unix.Fstat(in.sockFile, &st); err == nil && st.Nlink > 0 {
			continue
		}
		fmt.Fprintln(os.Stderr, "sandbox-init: the control socket was removed from the host; ending the sandbox")
		os.Exit(1)
	}
}

// reap collects every exited child: the commands, and the orphans that the
// kernel hands to the namespace's pid 1.
func (in *initd) reap() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG|unix.WALL, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if c, ok := in.waiters[pid]; ok {
			delete(in.waiters, pid)
			c.exited.Store(true)
			c.status <- ws
		}
	}
}

// handle serves one control connection: one command, start to exit.
func (in *initd) handle(conn *net.UnixConn) {
	defer conn.Close()
	var req ctl.Request
	fds, err := ctl.ReadFrame(conn, &req)
	if err != nil {
		return
	}
	if req.Op != "exec" {
		procio.CloseFDs(fds)
		_ = ctl.WriteFrame(conn, ctl.Reply{Op: "error", Error: fmt.Sprintf("unexpected %q before exec", req.Op)})
		return
	}
	c, master, err := in.start(&req, fds)
	if err != nil {
		_ = ctl.WriteFrame(conn, ctl.ErrorReply(err))
		return
	}
	if master >= 0 {
		err = ctl.WriteFrame(conn, ctl.Reply{Op: "started", Pid: c.pid}, master)
		unix.Close(master)
	} else {
		err = ctl.WriteFrame(conn, ctl.Reply{Op: "started", Pid: c.pid})
	}
	if err != nil {
		c.end()
	}
	go func() {
		for {
			var m ctl.Request
			fds, err := ctl.ReadFrame(conn, &m)
			procio.CloseFDs(fds)
			if err != nil {
				// The connection is over: if the command still runs, the
				// gateway let go of it before it ended, and end kills it;
				// either way end releases the command's namespace.
				c.end()
				return
			}
			switch m.Op {
			case "signal":
				if m.Signal > 0 && m.Signal < 65 {
					_ = unix.Kill(-c.pid, syscall.Signal(m.Signal))
				}
			case "kill":
				c.end()
			}
		}
	}()
	exit := sandbox.ExitFromWaitStatus(<-c.status)
	_ = ctl.WriteFrame(conn, ctl.Reply{Op: "exit", Exit: &exit})
}

// start starts req's command as the sandbox user and returns it with the
// PTY master to hand to the gateway (-1 without a PTY). It consumes fds.
func (in *initd) start(req *ctl.Request, fds []int) (*child, int, error) {
	defer procio.CloseFDs(fds)
	var path string
	var argv []string
	switch {
	case req.Subsystem == "sftp":
		path = "/proc/self/exe"
		argv = []string{"sandgate", "sftp-server", "--root", "/", "--start", in.dir()}
	case req.Subsystem != "":
		return nil, -1, fmt.Errorf("unknown subsystem %q", req.Subsystem)
	case req.Command == "":
		path, argv = in.shell, []string{in.shell, "-l"}
	default:
		path, argv = in.shell, []string{in.shell, "-c", req.Command}
	}
	env := sandbox.CommandEnv(ctl.WorkspaceDir, in.shell, in.env, req.Env, req.PTY)
	sys := &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: ctl.SandboxUID, Gid: ctl.SandboxGID, Groups: []uint32{}},
	}
	var files []uintptr
	master := -1
	if req.PTY != nil {
		m, s, err := openPTY(req.PTY.Window)
		if err != nil {
			return nil, -1, err
		}
		defer unix.Close(s)
		master = m
		files = []uintptr{uintptr(s), uintptr(s), uintptr(s)}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		if len(fds) != 3 {
			return nil, -1, fmt.Errorf("want 3 stdio descriptors, got %d", len(fds))
		}
		files = []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}
		sys.Setpgid = true
	}
	attr := &syscall.ProcAttr{Dir: in.dir(), Env: env, Files: files, Sys: sys}
	c := &child{status: make(chan syscall.WaitStatus, 1)}
	var err error
	in.sp.run(func() {
		// A new UTS namespace for the spawner thread, which the command
		// inherits: it names the command's tree (see killTree). Same
		// hostname; nobody in the sandbox may change it.
		if err = unix.Unshare(unix.CLONE_NEWUTS); err != nil {
			err = fmt.Errorf("command namespace: %w", err)
			return
		}
		if c.utsFD, c.uts, err = openNS("/proc/thread-self/ns/uts"); err != nil {
			return
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		c.pid, err = syscall.ForkExec(path, argv, attr)
		if err == nil {
			in.waiters[c.pid] = c
		} else {
			unix.Close(c.utsFD)
		}
	})
	if err != nil {
		if master >= 0 {
			unix.Close(master)
		}
		return nil, -1, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return c, master, nil
}

// dir is where commands start: the image's working directory, or the
// workspace.
func (in *initd) dir() string {
	if in.workDir != "" {
		return in.workDir
	}
	return ctl.WorkspaceDir
}

// openPTY opens a new terminal in the sandbox's devpts: the master for the
// gateway, the slave (owned by the sandbox user) for the command.
func openPTY(w sandbox.Window) (master, slave int, err error) {
	master, err = unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("open ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(master)
		return -1, -1, fmt.Errorf("unlock pty: %w", err)
	}
	slave, err = ptyPeer(master)
	if err != nil {
		unix.Close(master)
		return -1, -1, err
	}
	_ = unix.Fchown(slave, ctl.SandboxUID, ttyGID)
	if w.Cols == 0 || w.Rows == 0 {
		w = sandbox.Window{Cols: 80, Rows: 24}
	}
	if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: w.Rows, Col: w.Cols}); err != nil {
		unix.Close(master)
		unix.Close(slave)
		return -1, -1, fmt.Errorf("set pty size: %w", err)
	}
	return master, slave, nil
}

func ptyPeer(master int) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER,
		uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno == 0 {
		return int(fd), nil
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		return -1, fmt.Errorf("pty number: %w", err)
	}
	slave, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open pty slave: %w", err)
	}
	return slave, nil
}

// spawner forks every command from one OS thread that carries what the
// commands must inherit and the init itself must not have: membership of
// the commands' cgroups, a cgroup namespace rooted there, no_new_privs, an
// empty capability bounding set and the seccomp filter (seccomp_linux.go). The init's other threads stay outside
// the commands' limits, so a fork bomb or an OOM in the sandbox cannot
// starve or kill the init.
type spawner struct {
	fns chan func()
}

// spawnFilter says whether the spawner thread loads the seccomp filter,
// and which.
type spawnFilter struct{ on, allowUserNS bool }

func startSpawner(tasks []int, filter spawnFilter) (*spawner, error) {
	s := &spawner{fns: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the process, and the Go
		// runtime starts new threads from a clean template thread.
		runtime.LockOSThread()
		if err := prepareSpawnThread(tasks, filter); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for f := range s.fns {
			f()
		}
	}()
	return s, <-errc
}

// run runs f on the spawner thread and waits for it.
func (s *spawner) run(f func()) {
	done := make(chan struct{})
	s.fns <- func() {
		defer close(done)
		f()
	}
	<-done
}

func prepareSpawnThread(tasks []int, filter spawnFilter) error {
	// "0" moves the writing thread alone: this one. (Moving oneself skips
	// the kernel's global threadgroup lock, and its RCU grace period.)
	for _, fd := range tasks {
		if _, err := unix.Write(fd, []byte("0")); err != nil {
			return fmt.Errorf("join the commands' cgroup: %w", err)
		}
	}
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	for c := 0; c <= capLastCap(); c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	// Last: the filter is per thread, so this one alone has it, and every
	// process forked from here inherits it. The thread itself still calls
	// unshare(CLONE_NEWUTS) per command, which the filter allows.
	if filter.on {
		return loadSeccomp(filter.allowUserNS)
	}
	return nil
}

func capLastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && n < 256 {
			return n
		}
	}
	return 63
}
