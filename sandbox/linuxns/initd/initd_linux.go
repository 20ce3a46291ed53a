//go:build linux

package initd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// initd is the running init: it starts commands for the gateway, reports
// how they end, and reaps every process of the sandbox (it is pid 1).
type initd struct {
	// etcTemplate says that /etc is the gateway's shared template
	// (etcFromTemplate): what is the sandbox's own is bound over it.
	etcTemplate bool
	// ln is the control socket, listening and blocking: the spawner
	// thread accepts on it (serve).
	ln    int
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
	// handled counts control connections: the idle trim (watchSocketFile)
	// gives the heap back to the kernel once after each burst of them.
	handled atomic.Uint64

	// mu orders fork against reap, so that a child that exits at once is
	// never reaped before it is registered in waiters.
	mu      sync.Mutex
	waiters map[int]*child
	// jobs are the kept commands (ctl.Request.Keep) by key, from their
	// start until a gateway has received their exit.
	jobs map[string]*child
	// forked wakes the reaper when it has run out of children (buffered:
	// a start while it is not yet waiting is not lost).
	forked chan struct{}
	// utsReady says that the spawner thread is in a fresh UTS namespace
	// that no command has inherited yet (see newCommandNS). Only the
	// spawner thread uses it.
	utsReady bool
	// bashDirect says whether the shell is a bash whose start a command
	// may skip (sandbox.DirectShell): 0 not known yet, 1 yes, -1 no. Only
	// the spawner thread uses it.
	bashDirect int8
	// checkpoint (ctl.Spec.Checkpoint): commands get no UTS namespace of
	// their own, which CRIU cannot dump; a command's tree is then found
	// by ancestry and process group (killDescendants).
	checkpoint bool
	// tasks are the commands' cgroup tasks files, kept open across the
	// re-exec of a checkpointable init for its spawner (reexec).
	tasks []int
}

// child is a command started for one control connection.
type child struct {
	pid int
	// directPWD is the $PWD bash would have had, when the command ran
	// without it (ctl.Request.Direct); "" when the shell ran it.
	directPWD string
	// checkpoint: the tree is found by ancestry (killDescendants), not
	// by uts.
	checkpoint bool
	uts        nsID // the command's own UTS namespace: its tree
	// utsFD holds that namespace open until the command is done with, so
	// that its inode (uts) cannot name the next command's namespace while
	// a delayed killTree may still look for it.
	utsFD  int
	exited atomic.Bool
	kill   sync.Once

	// The exit frame goes out from whichever of the reaper (exit) and the
	// spawner thread (attach) comes second, so that a command's end
	// reaches the gateway without a hand-off to another goroutine.
	mu     sync.Mutex
	conn   *net.UnixConn       // the control connection, once "started" is sent
	status *syscall.WaitStatus // the exit status, once reaped

	// A kept command (keep != "") also has the gateway's ends of its
	// pipes, held here (stdin's write end, -1 once closed; stdout's and
	// stderr's read ends) so that it runs on, and its output waits in its
	// pipes, while no gateway holds them; forget releases them once a
	// gateway has its exit. Guarded by mu.
	keep      string
	held      []int
	pty       bool // held is the terminal's master (a kept command on a PTY)
	forgotten bool
	forget    func()
}

// exit reports the command's exit status, from the reaper.
func (c *child) exit(ws syscall.WaitStatus) {
	c.exited.Store(true)
	c.mu.Lock()
	conn := c.conn
	c.status = &ws // kept for a gateway that attaches later (a kept command)
	c.mu.Unlock()
	if conn != nil {
		c.sendExit(conn, ws)
	}
}

// attach hands the command's control connection over once "started" has
// gone out on it: from then on the connection is the command's, and it is
// closed after the exit frame. A kept command's new connection replaces
// the one it had (a second gateway took it over).
func (c *child) attach(conn *net.UnixConn) {
	c.mu.Lock()
	st := c.status
	var old *net.UnixConn
	if st == nil {
		old, c.conn = c.conn, conn
	}
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if st != nil {
		c.sendExit(conn, *st)
	}
}

// detach lets a kept command's connection go (its gateway is gone): the
// command runs on, and its exit waits for the next attach.
func (c *child) detach(conn *net.UnixConn) {
	c.mu.Lock()
	if c.conn == conn {
		c.conn = nil
	}
	c.mu.Unlock()
	conn.Close()
}

// closeStdin closes the init's end of a kept command's stdin ("eof").
func (c *child) closeStdin() {
	c.mu.Lock()
	fd := -1
	if len(c.held) > 0 && !c.pty {
		fd, c.held[0] = c.held[0], -1
	}
	c.mu.Unlock()
	if fd >= 0 {
		unix.Close(fd)
	}
}

// sendExit writes the exit frame and closes the connection: the
// gateway's side has nothing more to wait for, and the reader (follow)
// ends. The reaper calls it: the write cannot hold reaping up, as a
// connection carries two small frames from the init in all ("started"
// and this one), which its socket buffer always takes. A kept command's
// connection stays open for the gateway's "ack", which tells that the
// exit reached it (follow then forgets the command); without one (the
// gateway died first) the exit waits for the next attach.
func (c *child) sendExit(conn *net.UnixConn, ws syscall.WaitStatus) {
	exit := sandbox.ExitFromWaitStatus(ws)
	_ = ctl.WriteFrame(conn, ctl.Reply{Op: "exit", Exit: &exit})
	if c.forget == nil {
		conn.Close()
	}
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
			if c.utsFD >= 0 { // none for a builtin's answer
				unix.Close(c.utsFD)
			}
			return
		}
		if c.checkpoint {
			// The tree as it is now: once the first process ends, its
			// children are the init's and their ancestry is gone.
			tree := descendants(c.pid)
			_ = unix.Kill(-c.pid, unix.SIGHUP)
			_ = unix.Kill(-c.pid, unix.SIGCONT)
			time.AfterFunc(sandbox.KillGrace, func() { killDescendants(c.pid, tree) })
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

// descendants returns pid's process tree (pid included), by the parents
// /proc shows now.
func descendants(pid int) map[int]bool {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == 1 {
			continue
		}
		if pp, _, err := procParentGroup(p); err == nil {
			parent[p] = pp
		}
	}
	tree := map[int]bool{pid: true}
	for grew := true; grew; {
		grew = false
		for p, pp := range parent {
			if !tree[p] && tree[pp] {
				tree[p], grew = true, true
			}
		}
	}
	return tree
}

// procParentGroup reads pid's parent and process group from its stat.
func procParentGroup(pid int) (ppid, pgid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// After the command's name, in parentheses: state ppid pgrp.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 3 {
		return 0, 0, fmt.Errorf("bad stat of %d", pid)
	}
	ppid, _ = strconv.Atoi(f[1])
	pgid, _ = strconv.Atoi(f[2])
	return ppid, pgid, nil
}

// killDescendants is killTree for a checkpointable sandbox, whose commands
// share the sandbox's UTS namespace: SIGKILL to every process of the tree
// seen at the kill (tree), to what descends from it now, and to the
// command's process group. It repeats while it finds some, as a process
// may fork while the tree is killed. A process that left both the tree
// (its parent ended first: a double fork) and the group (setsid) before
// the kill outlives its command, never the sandbox.
func killDescendants(pid int, tree map[int]bool) {
	for range 100 {
		found := false
		for p := range descendants(pid) {
			tree[p] = true
		}
		for p := range tree {
			if p != 1 && unix.Kill(p, unix.SIGKILL) == nil {
				found = true
			} else {
				delete(tree, p)
			}
		}
		if unix.Kill(-pid, unix.SIGKILL) == nil {
			found = true
		}
		if !found {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serve serves the control socket; it never returns. Each connection's
// request is read and its command forked on the spawner thread itself,
// with blocking system calls, so that a command starts with no hand-off
// between goroutines: the kernel wakes that thread when the gateway
// connects. The rest of the connection (signals, the exit) is a
// goroutine's (follow).
func (in *initd) serve() {
	if in.sockFile >= 0 {
		go in.watchSocketFile()
	}
	if err := defaultChildSignal(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-init: SIGCHLD:", err)
	}
	go in.reap()
	in.sp.run(func() {
		_ = in.newCommandNS()
		for {
			fd, _, err := unix.Accept4(in.ln, unix.SOCK_CLOEXEC)
			switch {
			case err == nil:
				in.handle(fd)
			case err == unix.EINTR || err == unix.ECONNABORTED:
			case err == unix.EBADF || err == unix.EINVAL || err == unix.ENOTSOCK:
				// The control socket itself is gone: no gateway can
				// start anything here again.
				fmt.Fprintln(os.Stderr, "sandbox-init: control socket:", err)
				os.Exit(1)
			default:
				// EMFILE and friends: a command's connection cannot be
				// taken now; the gateway sees it fail and may retry.
				fmt.Fprintln(os.Stderr, "sandbox-init: accept:", err)
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
}

// trimMemory collects the init's garbage and gives every free page of its
// heap back to the kernel at once (the runtime's scavenger would keep some
// of it for minutes): an idle sandbox's init is most of its memory, and a
// host holds many of them (issue 41: at most 2 MiB per idle sandbox).
func trimMemory() { debug.FreeOSMemory() }

// watchSocketFile ends the sandbox once its control socket's file is gone
// from the host (its data dir was deleted): no gateway can ever reach it
// again, so it must not live on as an orphan.
//
// On the same tick it trims the init's memory: when commands started since
// the last tick, it returns the heap they left to the kernel (trimMemory),
// so that an idle sandbox holds only what its init still uses.
func (in *initd) watchSocketFile() {
	var trimmed uint64
	for range time.Tick(in.sockCheck) {
		if n := in.handled.Load(); n != trimmed {
			trimmed = n
			trimMemory()
		}
		var st unix.Stat_t
		if err := unix.Fstat(in.sockFile, &st); err == nil && st.Nlink > 0 {
			continue
		}
		fmt.Fprintln(os.Stderr, "sandbox-init: the control socket was removed from the host; ending the sandbox")
		os.Exit(1)
	}
}

// reap collects every exited child: the commands, and the orphans that the
// kernel hands to the namespace's pid 1. It blocks in wait4 itself (a
// goroutine that holds a thread while it waits there) rather than waiting
// for SIGCHLD, so that a command's end reaches its connection without a
// signal's trip through the runtime; with no child left, it waits for the
// next fork.
func (in *initd) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, unix.WALL, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.ECHILD:
			<-in.forked
			continue
		case err != nil:
			// Nothing else is documented for these arguments.
			fmt.Fprintln(os.Stderr, "sandbox-init: wait4:", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		// A command is in waiters before its fork's lock is let go.
		in.mu.Lock()
		c, ok := in.waiters[pid]
		delete(in.waiters, pid)
		in.mu.Unlock()
		if ok {
			c.exit(ws)
		}
	}
}

// kernelSigaction is the kernel's struct sigaction on linux (amd64 and
// arm64 alike: handler, flags, restorer, mask).
type kernelSigaction struct {
	handler, flags, restorer uintptr
	mask                     uint64
}

// defaultChildSignal gives SIGCHLD its default disposition (SIG_DFL: the
// kernel drops it; children still wait to be reaped, unlike SIG_IGN). The
// Go runtime installs a handler for every signal, and the reaper waits in
// wait4 rather than for the signal: with the handler, each command's exit
// also interrupted whichever thread the kernel picked, most often the
// spawner thread in accept4, which ran the handler and restarted its call
// on the way of the reaper's wake (about 12 µs per exec in a trace of the
// init, issue 41 row e2). Nothing in the init asks for SIGCHLD, and
// nothing may: the runtime counts its handler as installed, so a later
// signal.Notify for SIGCHLD would not put it back and would get nothing.
func defaultChildSignal() error {
	sa := kernelSigaction{} // handler 0 is SIG_DFL
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGCHLD),
		uintptr(unsafe.Pointer(&sa)), 0, 8, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// requestTimeout bounds how long the spawner thread waits for a request
// after a connection: the gateway sends it at once, and a peer that does
// not must not hold up every other command's start for long.
const requestTimeout = 5 * time.Second

// handle serves control connection fd on the spawner thread until its
// command has started, then hands it to follow. It consumes fd.
func (in *initd) handle(fd int) {
	// f owns fd (and closes it, whatever happens); the blocking reads and
	// writes before "started" go through conn.
	in.handled.Add(1)
	f := os.NewFile(uintptr(fd), "control")
	defer f.Close()
	conn := ctl.FD(fd)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: int64(requestTimeout / time.Second)})
	var req ctl.Request
	fds, err := ctl.ReadFrame(conn, &req)
	if err != nil {
		return
	}
	if req.Op == "attach" {
		procio.CloseFDs(fds)
		in.attachKept(f, req.Keep)
		return
	}
	if req.Op == "trust" {
		procio.CloseFDs(fds)
		if in.etcTemplate && in.checkpoint {
			// The gateway's /etc dir (BuildEtcDir): its own files are bound
			// from the tmpfs kept at EtcHolder, at the build only.
			_ = ctl.WriteFrame(conn, ctl.ErrorReply(errors.New("a checkpointable sandbox's /etc takes a session CA at its build only")))
			return
		}
		if err := addTrust(req.TrustPEM, in.etcTemplate); err != nil {
			_ = ctl.WriteFrame(conn, ctl.ErrorReply(err))
			return
		}
		_ = ctl.WriteFrame(conn, ctl.Reply{Op: "trusted"})
		return
	}
	if req.Op != "exec" {
		procio.CloseFDs(fds)
		_ = ctl.WriteFrame(conn, ctl.Reply{Op: "error", Error: fmt.Sprintf("unexpected %q before exec", req.Op)})
		return
	}
	var held []int
	keptPTY := req.Keep != "" && req.PTY != nil && req.Subsystem == ""
	if keptPTY {
		// A kept command on a terminal: the init holds a copy of the
		// master (below), which an attach hands out.
		procio.CloseFDs(fds)
		fds = nil
		if err := in.reserveKept(req.Keep); err != nil {
			_ = ctl.WriteFrame(conn, ctl.ErrorReply(err))
			return
		}
	} else if req.Keep != "" {
		if len(fds) != 6 || req.PTY != nil {
			procio.CloseFDs(fds)
			_ = ctl.WriteFrame(conn, ctl.Reply{Op: "error", Error: fmt.Sprintf("a kept command needs 6 descriptors and no terminal, got %d", len(fds))})
			return
		}
		held, fds = fds[3:6:6], fds[:3:3]
		if err := in.reserveKept(req.Keep); err != nil {
			procio.CloseFDs(fds)
			procio.CloseFDs(held)
			_ = ctl.WriteFrame(conn, ctl.ErrorReply(err))
			return
		}
	}
	c, master, err := in.start(&req, fds)
	if err != nil {
		in.keptDone(req.Keep, nil)
		procio.CloseFDs(held)
		_ = ctl.WriteFrame(conn, ctl.ErrorReply(err))
		return
	}
	if keptPTY {
		dup, err := unix.FcntlInt(uintptr(master), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			unix.Close(master)
			c.end()
			in.keptDone(req.Keep, nil)
			_ = ctl.WriteFrame(conn, ctl.ErrorReply(fmt.Errorf("hold the terminal: %w", err)))
			return
		}
		c.pty = true
		held = []int{dup}
	}
	if req.Keep != "" {
		in.keep(c, req.Keep, held)
	}
	// The connection goes to the runtime's poller before "started" is
	// sent, so that a failure there is still an error reply, not a
	// started command whose connection then breaks.
	var uc *net.UnixConn
	nc, err := net.FileConn(f) // a duplicate, non-blocking (and so is fd)
	if err != nil {
		_ = ctl.WriteFrame(conn, ctl.ErrorReply(fmt.Errorf("control connection: %w", err)))
	} else {
		uc = nc.(*net.UnixConn)
		if master >= 0 {
			err = ctl.WriteFrame(uc, ctl.Reply{Op: "started", Pid: c.pid}, master)
		} else {
			err = ctl.WriteFrame(uc, ctl.Reply{Op: "started", Pid: c.pid, DirectPWD: c.directPWD})
		}
	}
	if master >= 0 {
		unix.Close(master)
	}
	if err != nil {
		if uc != nil {
			uc.Close()
		}
		c.end() // a kept command too: its gateway never heard of it
		if c.forget != nil {
			c.forget()
		}
	} else {
		go in.follow(uc, c)
		c.attach(uc)
	}
	// The next command's namespace, made now rather than on its way.
	_ = in.newCommandNS()
}

// follow reads a started command's connection until it ends: signals
// and kill from the gateway. The gateway closing it before the exit frame
// means the command's client is gone; either way end releases the
// command's namespace, and kills what still runs.
func (in *initd) follow(conn *net.UnixConn, c *child) {
	for {
		var m ctl.Request
		fds, err := ctl.ReadFrame(conn, &m)
		if err == nil && m.Op == "keep" {
			in.keepRunning(conn, c, m.Keep, fds) // consumes fds
			continue
		}
		procio.CloseFDs(fds)
		if err != nil {
			if c.keep != "" {
				c.detach(conn) // it runs on for the next gateway
				return
			}
			c.end()
			conn.Close()
			return
		}
		switch m.Op {
		case "signal":
			// No pid (a builtin's answer, which ran nothing): -0 would
			// signal the init's own process group.
			if m.Signal > 0 && m.Signal < 65 && c.pid > 0 {
				_ = unix.Kill(-c.pid, syscall.Signal(m.Signal))
			}
		case "kill":
			c.end()
		case "eof":
			c.closeStdin()
		case "ack": // a kept command's exit reached the gateway
			if c.exited.Load() && c.forget != nil {
				c.forget()
				conn.Close()
				return
			}
		}
	}
}

// keepRunning serves a "keep" on the connection of command c, started
// without Request.Keep (an SSH exec): from now on it is kept under key,
// as if it had been started so, with fds, the gateway's ends of its
// output (stdout's and stderr's read ends; or the terminal's master),
// its stdin closed (the gateway closes its end: EOF). It answers "kept",
// or an error: c ended already (its exit goes out, or went out, on conn
// as usual), is kept already, or the init keeps maxKept commands. The
// answer is written under c.mu, which the reaper's exit takes to find
// the connection: "kept" never follows the command's exit on conn, and a
// command whose exit came first is never kept. It consumes fds.
func (in *initd) keepRunning(conn *net.UnixConn, c *child, key string, fds []int) {
	refuse := func(err error) {
		procio.CloseFDs(fds)
		_ = ctl.WriteFrame(conn, ctl.ErrorReply(err))
	}
	if key == "" || c.pid <= 0 || (len(fds) != 1 && len(fds) != 2) {
		refuse(fmt.Errorf("a keep needs a key, a process and its output's descriptors, got %d: %w", len(fds), unix.EINVAL))
		return
	}
	if err := in.reserveKept(key); err != nil {
		refuse(err)
		return
	}
	c.mu.Lock()
	if c.status != nil || c.exited.Load() || c.keep != "" {
		c.mu.Unlock()
		in.keptDone(key, nil)
		refuse(fmt.Errorf("the command ended, or is kept already: %w", unix.ESRCH))
		return
	}
	held := []int{-1, -1, -1}
	if len(fds) == 1 {
		held, c.pty = []int{fds[0]}, true
	} else {
		held[1], held[2] = fds[0], fds[1]
	}
	in.keepLocked(c, key, held)
	// Registered before "kept" goes out: an attach that follows it (the
	// gateway's, after a pause's restore) must find it. in.mu is never
	// held while c.mu is taken, so it nests here.
	in.mu.Lock()
	in.jobs[key] = c
	in.mu.Unlock()
	_ = ctl.WriteFrame(conn, ctl.Reply{Op: "kept"})
	c.mu.Unlock()
}

// maxKept bounds the kept commands of a sandbox (ctl.MaxKept: the init's
// own descriptor limit has room for them).
const maxKept = ctl.MaxKept

// reserveKept claims key for a kept command about to start; keptDone
// releases it (c nil: the start failed).
func (in *initd) reserveKept(key string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ok := in.jobs[key]; ok {
		return fmt.Errorf("a kept command %q exists: %w", key, unix.EEXIST)
	}
	if len(in.jobs) >= maxKept {
		return fmt.Errorf("%d kept commands already: %w", maxKept, unix.EMFILE)
	}
	in.jobs[key] = nil
	return nil
}

func (in *initd) keptDone(key string, c *child) {
	if key == "" {
		return
	}
	in.mu.Lock()
	if in.jobs[key] == c {
		delete(in.jobs, key)
	}
	in.mu.Unlock()
}

// keep registers started command c as kept under key, with the gateway's
// ends of its pipes.
func (in *initd) keep(c *child, key string, held []int) {
	c.mu.Lock()
	in.keepLocked(c, key, held)
	c.mu.Unlock()
	in.mu.Lock()
	in.jobs[key] = c
	in.mu.Unlock()
}

// keepLocked is keep's part under c.mu, which is held: it does not
// register c in in.jobs.
func (in *initd) keepLocked(c *child, key string, held []int) {
	c.keep, c.held = key, held
	c.forget = func() {
		c.mu.Lock()
		if c.forgotten {
			c.mu.Unlock()
			return
		}
		c.forgotten = true
		held := c.held
		c.held = nil
		c.mu.Unlock()
		in.keptDone(key, c)
		procio.CloseFDs(slicesWithout(held, -1))
		c.end() // it has exited: this releases its namespace
	}
}

// attachKept serves an attach: the kept command key's pid and the
// gateway's ends of its pipes go out on f, which then follows the
// command as an exec's connection does. It consumes nothing: f is the
// caller's.
func (in *initd) attachKept(f *os.File, key string) {
	conn := ctl.FD(int(f.Fd()))
	in.mu.Lock()
	c := in.jobs[key]
	in.mu.Unlock()
	if c == nil {
		_ = ctl.WriteFrame(conn, ctl.ErrorReply(fmt.Errorf("no kept command %q: %w", key, unix.ENOENT)))
		return
	}
	nc, err := net.FileConn(f)
	if err != nil {
		_ = ctl.WriteFrame(conn, ctl.ErrorReply(fmt.Errorf("control connection: %w", err)))
		return
	}
	uc := nc.(*net.UnixConn)
	// Under c.mu: the held descriptors cannot be closed while they go out.
	c.mu.Lock()
	if c.forgotten {
		c.mu.Unlock()
		_ = ctl.WriteFrame(uc, ctl.ErrorReply(fmt.Errorf("no kept command %q: %w", key, unix.ENOENT)))
		uc.Close()
		return
	}
	fds := slicesWithout(c.held, -1)
	err = ctl.WriteFrame(uc, ctl.Reply{Op: "started", Pid: c.pid, StdinClosed: !c.pty && c.held[0] < 0, PTY: c.pty}, fds...)
	c.mu.Unlock()
	if err != nil {
		uc.Close()
		return
	}
	go in.follow(uc, c)
	c.attach(uc)
}

// slicesWithout is fds without the entries equal to drop, in a new slice.
func slicesWithout(fds []int, drop int) []int {
	out := make([]int, 0, len(fds))
	for _, fd := range fds {
		if fd != drop {
			out = append(out, fd)
		}
	}
	return out
}

// newCommandNS moves the spawner thread into a new UTS namespace, which
// the next command inherits: it names that command's tree (see killTree).
// Same hostname; nobody in the sandbox may change it.
func (in *initd) newCommandNS() error {
	if in.utsReady || in.checkpoint { // a checkpointable init's commands share one
		return nil
	}
	if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("command namespace: %w", err)
	}
	in.utsReady = true
	return nil
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
		m, s, tty, err := openPTY(req.PTY.Window)
		if err != nil {
			return nil, -1, err
		}
		defer unix.Close(s)
		master = m
		env = sandbox.WithTTY(env, tty)
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
	if req.Builtin != nil && req.PTY == nil && req.Subsystem == "" && req.Command != "" && req.Keep == "" && in.directShell() {
		// true, : or false: bash would start, run the builtin and exit,
		// which nothing in the sandbox can tell from no process at all
		// (sandbox.DirectBuiltin says what it checks): the command has
		// ended already, its pipes closed (fds, here), its exit ready.
		if code, pwd, ok := sandbox.DirectBuiltin(sandbox.DirectSpec{Words: req.Builtin, Env: env, Dir: attr.Dir,
			Cwd: req.DirectCwd, UID: ctl.SandboxUID, GID: ctl.SandboxGID, ShellArgv: argv}); ok {
			ws := syscall.WaitStatus(code << 8)
			c := &child{utsFD: -1, directPWD: pwd, status: &ws}
			c.exited.Store(true)
			return c, master, nil
		}
	}
	c := &child{}
	if req.Direct != nil && req.PTY == nil && req.Subsystem == "" && req.Command != "" && in.directShell() {
		if dpath, denv, pwd, ok := sandbox.DirectExec(sandbox.DirectSpec{Words: req.Direct, ExecBuiltin: req.DirectArgv,
			Env: env, Dir: attr.Dir, Cwd: req.DirectCwd, UID: ctl.SandboxUID, GID: ctl.SandboxGID, ShellArgv: argv}); ok {
			dattr := *attr
			dattr.Env, dattr.Dir = denv, pwd
			if err := in.fork(c, dpath, req.Direct, &dattr); err == nil {
				c.directPWD = pwd
				return c, master, nil
			}
			// The exec failed (a script without #!, a noexec mount...):
			// bash runs it and says what it says.
			c = &child{}
		}
	}
	err := in.fork(c, path, argv, attr)
	if err != nil {
		if master >= 0 {
			unix.Close(master)
		}
		return nil, -1, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return c, master, nil
}

// fork starts c's process, in a UTS namespace of its own (newCommandNS),
// from the spawner thread, where it must run.
func (in *initd) fork(c *child, path string, argv []string, attr *syscall.ProcAttr) error {
	var err error
	if in.checkpoint {
		c.checkpoint, c.utsFD = true, -1
	} else {
		if err := in.newCommandNS(); err != nil {
			return err
		}
		if c.utsFD, c.uts, err = openNS("/proc/thread-self/ns/uts"); err != nil {
			return err
		}
	}
	in.mu.Lock()
	c.pid, err = syscall.ForkExec(path, argv, attr)
	if err == nil {
		in.waiters[c.pid] = c
	}
	in.mu.Unlock()
	if err != nil {
		unix.Close(c.utsFD)
		return err
	}
	in.utsReady = false
	select {
	case in.forked <- struct{}{}:
	default:
	}
	return nil
}

// directShell says whether commands may skip the sandbox's shell
// (sandbox.DirectShell), asking once. Spawner thread only.
func (in *initd) directShell() bool {
	if in.bashDirect == 0 {
		in.bashDirect = -1
		if sandbox.DirectShell(in.shell) {
			in.bashDirect = 1
		}
	}
	return in.bashDirect > 0
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
// gateway, the slave (owned by the sandbox user) for the command, and the
// slave's path.
func openPTY(w sandbox.Window) (master, slave int, tty string, err error) {
	master, err = unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, "", fmt.Errorf("open ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(master)
		return -1, -1, "", fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		unix.Close(master)
		return -1, -1, "", fmt.Errorf("pty number: %w", err)
	}
	tty = "/dev/pts/" + strconv.Itoa(n)
	slave, err = ptyPeer(master, tty)
	if err != nil {
		unix.Close(master)
		return -1, -1, "", err
	}
	_ = unix.Fchown(slave, ctl.SandboxUID, ttyGID)
	if w.Cols == 0 || w.Rows == 0 {
		w = sandbox.Window{Cols: 80, Rows: 24}
	}
	if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: w.Rows, Col: w.Cols}); err != nil {
		unix.Close(master)
		unix.Close(slave)
		return -1, -1, "", fmt.Errorf("set pty size: %w", err)
	}
	return master, slave, tty, nil
}

// ptyPeer opens master's slave, tty, through the master where the kernel
// can (TIOCGPTPEER: no path lookup), else by its path.
func ptyPeer(master int, tty string) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER,
		uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno == 0 {
		return int(fd), nil
	}
	slave, err := unix.Open(tty, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open pty slave: %w", err)
	}
	return slave, nil
}

// spawner forks every command from one OS thread that carries what the
// commands must inherit and the init itself must not have: membership of
// the commands' cgroups, a cgroup namespace rooted there, no_new_privs, an
// empty capability bounding set and the seccomp filter (seccomp_linux.go;
// the gateway's program, package seccompprog).
// The thread also accepts and reads the command requests (serve), so a
// sandbox using up its CPU quota slows its own command starts; the init's
// other threads (the reaper, the connections' readers) stay outside the
// commands' limits, so a fork bomb or an OOM in the sandbox cannot starve
// or kill the init.
type spawner struct {
	fns chan func()
	// tasks hands the thread the commands' cgroups (join); errc answers.
	tasks chan []int
	errc  chan error
	// filterTime is how long the thread took to confine itself (set
	// before it answers join).
	filterTime time.Duration
}

// spawnFilter says whether the spawner thread loads the seccomp filter,
// and its program (ctl.Spec.Seccomp).
type spawnFilter struct {
	on         bool
	program    []byte
	checkpoint bool
}

func startSpawner(tasks []int, filter spawnFilter) (*spawner, error) {
	s := newSpawner(filter)
	return s, s.join(tasks)
}

// newSpawner starts the spawner thread, which at once confines itself
// (prepareSpawnThread: no_new_privs, the capability bounding set, the
// seccomp filter) while the caller goes on building the sandbox: loading
// the filter is the kernel's work of about a millisecond (it compiles the
// program), which need not wait for the root. The thread joins the
// commands' cgroups only when join hands it their tasks files; stop ends a
// spawner that was never joined.
func newSpawner(filter spawnFilter) *spawner {
	s := &spawner{fns: make(chan func()), tasks: make(chan []int, 1), errc: make(chan error, 1)}
	go func() {
		// Never unlocked: the thread ends with the process (or with this
		// goroutine when the spawner is stopped or fails), and the Go
		// runtime starts new threads from a clean template thread.
		runtime.LockOSThread()
		t0 := time.Now()
		err := prepareSpawnThread(filter)
		s.filterTime = time.Since(t0)
		tasks, ok := <-s.tasks
		if !ok {
			return
		}
		if err == nil {
			err = joinSpawnCgroups(tasks, filter)
		}
		s.errc <- err
		if err != nil {
			return
		}
		for f := range s.fns {
			f()
		}
	}()
	return s
}

// join hands the spawner thread the commands' cgroups (their tasks files)
// and waits until it has confined itself and joined them. The thread has
// read filterTime once join returns.
func (s *spawner) join(tasks []int) error {
	s.tasks <- tasks
	return <-s.errc
}

// stop ends a spawner that join was never called on (its thread exits).
func (s *spawner) stop() { close(s.tasks) }

// run runs f on the spawner thread and waits for it.
func (s *spawner) run(f func()) {
	done := make(chan struct{})
	s.fns <- func() {
		defer close(done)
		f()
	}
	<-done
}

// prepareSpawnThread confines the calling thread, which must be locked
// to its goroutine: no_new_privs, an empty capability bounding set, no
// ambient capabilities, and last the seccomp filter. The filter is per
// thread, so this one alone has it, and every process forked from it
// inherits it. The thread keeps its effective capabilities (a bounding set
// limits only what an exec may gain): it still joins the commands' cgroup
// namespace (joinSpawnCgroups) and calls unshare(CLONE_NEWUTS) per
// command, which the filter allows.
func prepareSpawnThread(filter spawnFilter) error {
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
	if filter.on {
		return loadSeccomp(filter.program)
	}
	return nil
}

// joinSpawnCgroups moves the calling thread (the spawner's, confined by
// prepareSpawnThread) into the commands' cgroups, whose tasks files are
// open at tasks, and, unless the sandbox is checkpointable, into a cgroup
// namespace of its own rooted there.
func joinSpawnCgroups(tasks []int, filter spawnFilter) error {
	// "0" moves the writing thread alone: this one. (Moving oneself skips
	// the kernel's global threadgroup lock, and its RCU grace period.)
	for _, fd := range tasks {
		if _, err := unix.Write(fd, []byte("0")); err != nil {
			return fmt.Errorf("join the commands' cgroup: %w", err)
		}
	}
	// A checkpointable sandbox's init was born in a cgroup namespace of
	// its own, which the commands share (CRIU dumps no nested one).
	if !filter.checkpoint {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("cgroup namespace: %w", err)
		}
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
