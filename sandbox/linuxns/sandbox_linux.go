//go:build linux

package linuxns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// linuxSandbox is the gateway's handle on one sandbox: its init, reached
// through the control socket, and what it owns on the host.
type linuxSandbox struct {
	d  *Driver
	st *sandboxState
	// trustPEM is what Create was asked to add to the trust store.
	trustPEM []byte
	// warm: built for a warm pool (sandbox.Spec.Warm), not claimed yet;
	// its init has the least CPU weight until Rebind (cgroup.Plan.Idle).
	// Under mu.
	warm bool
	// lazy, on a fork restored with lazy pages, is its lazy-pages
	// daemon (lazy_linux.go): a dump waits for its end (waitLazy), since
	// one before would miss the pages not copied in yet. Set by Restore
	// before the sandbox is anyone's; cleared by Stop, under life.
	lazy *lazyPages

	// The init is the gateway's child (cmd, reaped here) when this run
	// created it; an adopted one is a child of the host's init. Either way
	// a pidfd watches it, through the runtime's poller: no thread waits.
	// Each init of the sandbox (a stopped one has none; Resume starts a
	// new one) has its own; they change under mu.
	cmd      *exec.Cmd
	pidfd    *os.File
	initDone chan struct{} // closed once the init has exited (or is detached)
	// ended is closed once the sandbox has ended (Done): its init exited
	// but for a Stop, or it was destroyed or detached.
	ended    chan struct{}
	endedOne sync.Once
	// life orders Stop and Resume.
	life sync.Mutex

	mu     sync.Mutex
	kept   map[*initProcess]struct{} // kept processes this gateway reads (trackKept)
	closed bool
	// halted: Halt was called; an init that a Resume or an unpause
	// started since is killed as it is set (setInit).
	halted   bool
	stopping bool // the init's exit is wanted (Stop): the sandbox does not end
	// held are the init's Unix sockets, by inode, that a pause by
	// checkpoint keeps open for its restore (pause_checkpoint_linux.go).
	held map[uint64]*os.File
	end  sync.Once
	err  error

	// imagesGone, once a resume from a pause by checkpoint has returned,
	// closes when that pause's images are deleted (removeImagesLater).
	imagesGone <-chan struct{}
}

func newLinuxSandbox(d *Driver, st *sandboxState) *linuxSandbox {
	done := make(chan struct{})
	close(done) // no init yet
	return &linuxSandbox{d: d, st: st, initDone: done, ended: make(chan struct{})}
}

// setInit makes the init (cmd, nil when not the gateway's child; pidfd)
// the sandbox's and watches it.
func (s *linuxSandbox) setInit(cmd *exec.Cmd, pidfd *os.File) {
	done := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.pidfd, s.initDone = cmd, pidfd, done
	halted := s.halted
	s.mu.Unlock()
	go s.watch(cmd, pidfd, done)
	if halted { // a Halt came while it started: it would run on until Destroy
		s.signalInit(unix.SIGKILL)
	}
}

// current returns the sandbox's init: its pidfd (nil: none) and the
// channel closed once it has exited.
func (s *linuxSandbox) current() (*os.File, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pidfd, s.initDone
}

// markEnded closes ended, once.
func (s *linuxSandbox) markEnded() { s.endedOne.Do(func() { close(s.ended) }) }

// Workdir implements Sandbox: the host mount of the workspace.
func (s *linuxSandbox) Workdir() string { return s.st.Workspace }

// InitPID is the host pid of the sandbox's init, the pid 1 of its pid
// namespace.
func (s *linuxSandbox) InitPID() int { return s.st.Pid }

// HostUID is the host uid the sandbox user (uid 1000 inside) maps to.
func (s *linuxSandbox) HostUID() int { return s.st.UIDBase + ctl.SandboxUID }

// watch waits for the init to exit (its pidfd becomes readable), reaps it
// when it is the gateway's child, and closes initDone. Closing the pidfd
// (Detach) ends the watch early.
func (s *linuxSandbox) watch(cmd *exec.Cmd, pidfd *os.File, done chan struct{}) {
	defer func() {
		close(done)
		s.mu.Lock()
		wanted := s.stopping && s.initDone == done
		s.mu.Unlock()
		if !wanted {
			s.markEnded()
		}
	}()
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return
	}
	exited := false
	err = rc.Read(func(fd uintptr) bool {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(p, 0)
		exited = n > 0
		return exited
	})
	if err == nil && exited && cmd != nil {
		_ = cmd.Wait()
	}
}

// Done is closed once the init has exited (but for a Stop), or the
// sandbox was destroyed or detached.
func (s *linuxSandbox) Done() <-chan struct{} { return s.ended }

// signalInit sends sig to the init through its pidfd.
func (s *linuxSandbox) signalInit(sig unix.Signal) {
	pidfd, _ := s.current()
	if pidfd == nil {
		return
	}
	if rc, err := pidfd.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
}

func (s *linuxSandbox) dial(ctx context.Context) (*net.UnixConn, error) {
	addr, done, err := unixAddr(s.st.Socket)
	if err != nil {
		return nil, err
	}
	defer done()
	var dl net.Dialer
	connect := func() (net.Conn, error) { return dl.DialContext(ctx, "unix", addr) }
	if s.st.Checkpoint {
		connect = func() (net.Conn, error) { return s.dialFromNetNS(addr) }
	}
	c, err := connect()
	// A full backlog (a burst of starts) answers EAGAIN at once: wait for
	// the init to take some, as long as the start may last (initTimeout
	// without a deadline).
	giveUp := time.Now().Add(initTimeout)
	for wait := time.Millisecond; errors.Is(err, syscall.EAGAIN) && time.Now().Before(giveUp); wait = min(2*wait, 50*time.Millisecond) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("control socket: %w", context.Cause(ctx))
		case <-time.After(wait):
		}
		c, err = connect()
	}
	if err != nil {
		_, done := s.current()
		select {
		case <-done:
			return nil, errInitGone
		default:
		}
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return c.(*net.UnixConn), nil
}

// dialFromNetNS connects to the control socket at addr with a socket made
// in the sandbox's network namespace: the init's end, which the kernel
// makes in the connecting socket's namespace, is then one a checkpoint
// finds there (checkpoint_linux.go).
func (s *linuxSandbox) dialFromNetNS(addr string) (net.Conn, error) {
	s.mu.Lock()
	pid := s.st.Pid
	s.mu.Unlock()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	sk, err := inNetNS(ns, func() (fdCloser, error) {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		return fdCloser(fd), err
	})
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(int(sk), &unix.SockaddrUnix{Name: addr}); err != nil {
		sk.Close()
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", err)}
	}
	f := os.NewFile(uintptr(sk), "control")
	defer f.Close()
	return net.FileConn(f)
}

// fdCloser is a descriptor that inNetNS can close.
type fdCloser int

func (fd fdCloser) Close() error { return unix.Close(int(fd)) }

// Start implements Sandbox: the init starts the command inside the
// sandbox; its stdio are pipes made here, or a terminal the init opens in
// the sandbox's devpts and hands back.
func (s *linuxSandbox) Start(ctx context.Context, cmd sandbox.Cmd) (sandbox.Process, error) {
	if cmd.Subsystem != "" && cmd.Subsystem != "sftp" {
		return nil, fmt.Errorf("unknown subsystem %q", cmd.Subsystem)
	}
	s.mu.Lock()
	closed, stopped, paused := s.closed, s.st.Stopped, s.st.Paused
	s.mu.Unlock()
	if closed {
		return nil, sandbox.ErrClosed
	}
	if stopped {
		return nil, sandbox.ErrStopped
	}
	if paused { // its init is frozen: a dial would wait on it for good
		return nil, sandbox.ErrPaused
	}
	if cmd.Keep != "" && (!s.Keeps() || cmd.PTY != nil && !s.KeepsPTY() || cmd.Subsystem != "") {
		cmd.Keep = "" // this init cannot keep it: it ends with the gateway
	}
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	keepLater := s.st.KeepLater
	s.mu.Unlock()
	p, err := startInSandbox(ctx, conn, cmd, keepLater)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if p.kept {
		s.trackKept(p)
	}
	return p, nil
}

// Keeps implements sandbox.Keeper: inits started by this binary keep
// processes.
func (s *linuxSandbox) Keeps() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.KeepJobs
}

// KeepsPTY implements sandbox.PTYKeeper: inits started by this binary
// keep processes on a terminal too (they hold a copy of its master).
func (s *linuxSandbox) KeepsPTY() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.KeepJobs && s.st.KeepPTY
}

// Reattach implements sandbox.Keeper: the init hands back kept process
// key's pid and the gateway's ends of its pipes.
func (s *linuxSandbox) Reattach(ctx context.Context, key string) (sandbox.Process, error) {
	s.mu.Lock()
	closed, stopped, paused := s.closed, s.st.Stopped, s.st.Paused
	s.mu.Unlock()
	if closed || stopped || !s.Keeps() {
		return nil, sandbox.ErrNotKept
	}
	if paused { // its init is frozen: it may well keep key, but cannot say so now
		return nil, sandbox.ErrPaused
	}
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	p, err := attachInSandbox(ctx, conn, key)
	if err != nil {
		conn.Close()
		return nil, err
	}
	s.trackKept(p)
	return p, nil
}

// Destroy implements Sandbox: it kills the init, which takes every
// process of the sandbox with it, then removes the cgroups, the workspace
// mount and image, and the sandbox's directory.
func (s *linuxSandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.life.Lock() // no Stop or Resume half done
	defer s.life.Unlock()
	s.end.Do(func() { s.err = s.teardown() })
	s.markEnded()
	return s.err
}

// Halt implements sandbox.Halter: the init (thawed first if frozen) gets
// SIGKILL, which ends every process of the sandbox, and nothing waits for
// it; Destroy, later, waits for the init and releases the rest. Start
// fails from now on. A Resume or an unpause under way (they hold life,
// which Halt does not wait for) has its new init killed as it is set.
func (s *linuxSandbox) Halt() {
	s.mu.Lock()
	s.closed, s.halted = true, true
	cgs := slices.Clone(s.st.Cgroups)
	s.mu.Unlock()
	if frozen, err := cgroup.Thaw(cgs); frozen || err != nil {
		s.d.log.Warn("sandbox_thawed", "sandbox", s.st.ID, "reason", "frozen when it was to be killed", "err", err)
	}
	s.signalInit(unix.SIGKILL)
}

// Detach implements Detacher: the gateway lets go of the sandbox, which
// keeps running, with its state on disk, for the next gateway process to
// adopt. Commands still running lose their client (their connections to
// the init close with the gateway) and end as Kill ends them, but for kept
// ones (sandbox.Cmd.Keep), which the next gateway takes back.
func (s *linuxSandbox) Detach(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.life.Lock()
	defer s.life.Unlock()
	s.stopKept() // their output stays in their pipes, not half read
	s.mu.Lock()
	held := s.held // a pause by checkpoint's: the next gateway has none
	s.held = nil
	s.mu.Unlock()
	for _, f := range held {
		f.Close()
	}
	s.end.Do(func() {
		if pidfd, done := s.current(); pidfd != nil {
			pidfd.Close()
			<-done
		}
	})
	s.markEnded()
	return nil
}

func (s *linuxSandbox) teardown() error {
	// A warm sandbox never claimed (a pool's shrink or close, a build that
	// failed) gets a running sandbox's CPU weight back first: its init's
	// exit, its namespaces' teardown, runs in its cgroups, and at the
	// least weight it waited for every busy sandbox (seconds here), up to
	// killCurrent's and cgroup.Remove's bounds, past which the destroy
	// fails and leaves the cgroups.
	s.mu.Lock()
	warm := s.warm
	s.mu.Unlock()
	if warm {
		_ = s.d.cg.Started(s.st.ID) // no cgroups yet: nothing to weigh
	}
	if s.d.beforeKill != nil {
		s.d.beforeKill(s.st.ID)
	}
	errs := []error{s.killCurrent(), s.dropPause()}
	dir := s.d.dir(s.st.ID)
	errs = append(errs,
		cgroup.Remove(s.st.Cgroups),
		removeWorkspace(s.st.Workspace, s.st.Image),
		unmountUnder(dir),
		os.RemoveAll(dir))
	s.d.freeSlot(s.st.Slot, s.st.ID)
	return errors.Join(errs...)
}

// killCurrent kills the sandbox's current init, if it has one, and
// waits (at most 10 s) until it is gone, and with it every process of its
// pid namespace. A frozen init (a snapshot cut short) ignores SIGKILL
// until thawed: the cgroups are thawed first.
func (s *linuxSandbox) killCurrent() error {
	s.thawForKill()
	pidfd, done := s.current()
	if pidfd == nil {
		return nil
	}
	defer pidfd.Close()
	s.signalInit(unix.SIGKILL)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("sandbox init did not exit after SIGKILL")
	}
}

// thawForKill thaws the sandbox's cgroups before its init is killed,
// logging when they were frozen.
func (s *linuxSandbox) thawForKill() {
	frozen, err := cgroup.Thaw(s.st.Cgroups)
	if frozen || err != nil {
		s.d.log.Warn("sandbox_thawed", "sandbox", s.st.ID, "reason", "frozen when it was to be killed", "err", err)
	}
}

// initProcess is a command running in a linux sandbox, seen from the
// gateway: its stdio, and its control connection to the init.
type initProcess struct {
	conn   *net.UnixConn
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr io.ReadCloser
	pty    *os.File
	// pid is the command's pid in the sandbox's pid namespace, as the
	// init's "started" reply says (0: not told).
	pid int
	// directPWD is the command's directory when it runs without the
	// shell (sandbox.Cmd.Direct), "" when the shell runs it.
	directPWD string
	// kept says the init keeps the process across gateway restarts
	// (sandbox.Cmd.Keep).
	kept bool
	// untrack unregisters a kept process from its sandbox (trackKept).
	untrack func()
	// detached says that the gateway let go of the kept process (Detach):
	// nothing more is sent to the init for it (no kill, eof or ack), and
	// Wait no longer returns, so that its end and the rest of its output
	// go to the next gateway.
	detached atomic.Bool

	// keeping is set while KeepAs waits for the init's answer, which
	// Wait (the connection's reader) hands it on keepReply (one answer:
	// what else an init sends is dropped, never waited on); handedOff,
	// once the init keeps the command (KeepAs): Wait then returns
	// sandbox.ErrHandedOff, and nothing more is sent for it. A "kept"
	// that comes once KeepAs gave up (lateKept: the command was killed)
	// is answered "ack" at its exit, so that the init forgets it. kmu
	// guards keeping and lateKept, and orders them with handedOff.
	// waiting says Wait reads the connection; waitDone is closed when
	// it returns. canKeepLater says the init knows "keep" (KeepLater).
	kmu                sync.Mutex
	keeping, lateKept  bool
	handedOff, waiting atomic.Bool
	keepReply          chan ctl.Reply
	waitDone           chan struct{}
	canKeepLater       bool
	keepWait           time.Duration // how long KeepAs waits (0: keepAsWait)

	wmu  sync.Mutex
	kill sync.Once
	// ack sends a kept command's "ack" and closes its connection (Ack).
	ack sync.Once
}

// DirectPWD implements sandbox.DirectProcess.
func (p *initProcess) DirectPWD() (string, bool) { return p.directPWD, p.directPWD != "" }

// startInSandbox starts cmd through the init on conn; keepLater says the
// init knows "keep" (sandboxState.KeepLater).
func startInSandbox(ctx context.Context, conn *net.UnixConn, cmd sandbox.Cmd, keepLater bool) (*initProcess, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(initTimeout)
	}
	_ = conn.SetDeadline(dl)
	stop := procio.DeadlineOnCancel(ctx, conn.SetDeadline)
	defer stop()

	req := ctl.Request{Op: "exec", Command: cmd.Command, Subsystem: cmd.Subsystem, Env: cmd.Env, PTY: cmd.PTY, Keep: cmd.Keep, Direct: cmd.Direct, DirectArgv: cmd.DirectArgv, DirectCwd: cmd.DirectCwd, Builtin: cmd.Builtin}
	p := &initProcess{conn: conn, kept: cmd.Keep != "", keepReply: make(chan ctl.Reply, 1), waitDone: make(chan struct{}), canKeepLater: keepLater}
	if cmd.PTY == nil || cmd.Subsystem != "" {
		req.PTY = nil
		// The child's ends stay raw descriptors, blocking as a command
		// expects, never in the runtime's poller: they only go to the
		// init. Ours are non-blocking, so that the runtime polls them.
		child := [3]int{-1, -1, -1}
		var parent [3]*os.File
		for i := range 3 {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				procio.CloseFDs(child[:])
				closeFiles(parent[:])
				return nil, fmt.Errorf("pipe: %w", os.NewSyscallError("pipe2", err))
			}
			if i < 2 {
				procio.GrowPipeFD(p[0])
			}
			mine, theirs, name := p[0], p[1], "|0"
			if i == 0 {
				mine, theirs, name = p[1], p[0], "|1"
			}
			child[i] = theirs
			_ = unix.SetNonblock(mine, true)
			parent[i] = os.NewFile(uintptr(mine), name)
		}
		fds := []int{child[0], child[1], child[2]}
		if req.Keep != "" {
			// The init holds copies of our ends too (SyscallConn leaves
			// ours non-blocking, as the runtime polls them).
			for _, f := range parent {
				fds = append(fds, rawFD(f))
			}
		}
		err := ctl.WriteFrame(conn, req, fds...)
		procio.CloseFDs(child[:])
		if err != nil {
			closeFiles(parent[:])
			return nil, fmt.Errorf("send command: %w", err)
		}
		p.stdin, p.stdout, p.stderr = parent[0], parent[1], parent[2]
		if p.kept {
			p.stdin = &keptStdin{File: parent[0], p: p}
			p.stdout, p.stderr = newKeptReader(parent[1]), newKeptReader(parent[2])
		}
	} else if err := ctl.WriteFrame(conn, req); err != nil {
		return nil, fmt.Errorf("send command: %w", err)
	}
	var rep ctl.Reply
	fds, err := ctl.ReadFrame(conn, &rep)
	if err == nil && rep.Op != "started" {
		err = rep.Err()
		if rep.Op != "error" {
			err = fmt.Errorf("unexpected reply %q", rep.Op)
		}
	}
	if err == nil && cmd.PTY != nil && req.PTY != nil && len(fds) != 1 {
		err = fmt.Errorf("want the terminal, got %d descriptors", len(fds))
	}
	if err != nil {
		procio.CloseFDs(fds)
		p.closeStdio()
		return nil, fmt.Errorf("start in sandbox: %w", err)
	}
	if req.PTY != nil {
		// Non-blocking, so that the runtime polls it and Close ends reads.
		if err := unix.SetNonblock(fds[0], true); err != nil {
			procio.CloseFDs(fds)
			return nil, err
		}
		p.pty = os.NewFile(uintptr(fds[0]), "ptmx")
		p.stdin, p.stdout = procio.NopWriteCloser{Writer: p.pty}, p.pty
		if p.kept {
			p.stdout = newKeptReader(p.pty)
		}
	} else {
		procio.CloseFDs(fds)
	}
	p.pid = rep.Pid
	p.directPWD = rep.DirectPWD
	stop() // so that a cancel from now on does not set it again
	_ = conn.SetDeadline(time.Time{})
	return p, nil
}

// attachInSandbox takes kept process key back from the init on conn.
func attachInSandbox(ctx context.Context, conn *net.UnixConn, key string) (*initProcess, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(initTimeout)
	}
	_ = conn.SetDeadline(dl)
	stop := procio.DeadlineOnCancel(ctx, conn.SetDeadline)
	defer stop()
	if err := ctl.WriteFrame(conn, ctl.Request{Op: "attach", Keep: key}); err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	var rep ctl.Reply
	fds, err := ctl.ReadFrame(conn, &rep)
	if err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	if rep.Op == "error" {
		procio.CloseFDs(fds)
		if err := rep.Err(); errors.Is(err, syscall.ENOENT) || rep.Errno == 0 {
			// An init that predates kept commands answers without errno.
			return nil, sandbox.ErrNotKept
		}
		return nil, fmt.Errorf("attach: %w", rep.Err())
	}
	want := 3
	switch {
	case rep.PTY:
		want = 1
	case rep.StdinClosed:
		want = 2
	}
	if rep.Op != "started" || len(fds) != want {
		procio.CloseFDs(fds)
		return nil, fmt.Errorf("attach: unexpected reply %q with %d descriptors", rep.Op, len(fds))
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		// Non-blocking, so that the runtime polls them and Close ends reads.
		_ = unix.SetNonblock(fd, true)
		files[i] = os.NewFile(uintptr(fd), "kept")
	}
	p := &initProcess{conn: conn, pid: rep.Pid, kept: true}
	if rep.PTY {
		p.pty = files[0]
		p.stdin, p.stdout = procio.NopWriteCloser{Writer: p.pty}, newKeptReader(p.pty)
	} else if rep.StdinClosed {
		p.stdin = procio.NopWriteCloser{Writer: io.Discard}
		p.stdout, p.stderr = newKeptReader(files[0]), newKeptReader(files[1])
	} else {
		p.stdin = &keptStdin{File: files[0], p: p}
		p.stdout, p.stderr = newKeptReader(files[1]), newKeptReader(files[2])
	}
	stop()
	_ = conn.SetDeadline(time.Time{})
	return p, nil
}

// rawFD is f's descriptor, left in the mode it is in.
func rawFD(f *os.File) int {
	fd := -1
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

// keptStdin is a kept process's stdin: closing it closes the init's end
// too, so that the process sees EOF.
type keptStdin struct {
	*os.File
	p    *initProcess
	once sync.Once
}

func (k *keptStdin) Close() error {
	err := k.File.Close()
	k.once.Do(func() { _ = k.p.send(ctl.Request{Op: "eof"}) })
	return err
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

func (p *initProcess) closeStdio() {
	for _, c := range []io.Closer{p.stdin, p.stdout, p.stderr} {
		if c != nil {
			c.Close()
		}
	}
}

// PID is the command's pid inside the sandbox (sandbox.PIDer); 0 when
// the init did not say.
func (p *initProcess) PID() int { return p.pid }

func (p *initProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *initProcess) Stdout() io.ReadCloser { return p.stdout }
func (p *initProcess) Stderr() io.ReadCloser {
	if p.stderr == nil {
		return nil
	}
	return p.stderr
}

func (p *initProcess) Resize(w sandbox.Window) error {
	if p.pty == nil {
		return errors.New("no pty")
	}
	return procio.SetWinsize(p.pty, w)
}

func (p *initProcess) send(m ctl.Request) error {
	if p.detached.Load() || p.handedOff.Load() {
		return nil
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return ctl.WriteFrame(p.conn, m)
}

func (p *initProcess) Signal(sig syscall.Signal) error {
	if err := p.send(ctl.Request{Op: "signal", Signal: int(sig)}); err != nil {
		return fmt.Errorf("signal process group: %w", err)
	}
	return nil
}

// Kill asks the init to end the command's process group: SIGHUP, then
// SIGKILL after a grace.
func (p *initProcess) Kill() {
	p.kill.Do(func() { _ = p.send(ctl.Request{Op: "kill"}) })
}

// Wait waits for the init to report the command's end. When the sandbox
// goes away first (Destroy), the command died with it: SIGKILL. A kept
// command's exit is not acknowledged here: its connection stays open for
// Ack (sandbox.Acker), which the caller sends once the exit is stored.
func (p *initProcess) Wait() (sandbox.Exit, error) {
	keepConn := false
	p.waiting.Store(true)
	defer func() {
		if p.waitDone != nil {
			close(p.waitDone)
		}
		if p.untrack != nil {
			p.untrack()
		}
		if !keepConn {
			p.conn.Close()
		}
		if p.pty == nil && p.stdin != nil {
			p.stdin.Close()
		}
	}()
	for {
		var rep ctl.Reply
		fds, err := ctl.ReadFrame(p.conn, &rep)
		procio.CloseFDs(fds)
		if p.detached.Load() {
			select {} // the next gateway learns how it ended
		}
		if err == nil && (rep.Op == "kept" || rep.Op == "error") {
			p.kmu.Lock()
			asked := p.keeping
			if rep.Op == "kept" {
				if asked {
					// The init keeps it from here: its exit goes to the
					// gateway that takes it back (KeepAs).
					p.handedOff.Store(true)
				} else {
					p.lateKept = true // KeepAs gave up on it: killed
				}
			}
			if asked {
				select {
				case p.keepReply <- rep: // KeepAs's one answer
				default: // an init that answers twice is not waited on
				}
			}
			p.kmu.Unlock()
			if rep.Op == "kept" && asked {
				return sandbox.Exit{}, sandbox.ErrHandedOff
			}
			continue
		}
		if err != nil {
			if p.handedOff.Load() {
				return sandbox.Exit{}, sandbox.ErrHandedOff
			}
			return sandbox.Exit{Signal: "KILL"}, nil
		}
		if rep.Op == "exit" && rep.Exit != nil {
			// The init keeps a kept command's exit until it hears (Ack)
			// that it is safe with the gateway.
			keepConn = p.kept
			p.kmu.Lock()
			late := p.lateKept
			p.kmu.Unlock()
			if late && !p.kept {
				// Kept by a "keep" answered too late (KeepAs killed it):
				// its exit is here, and nobody else will ask for it.
				_ = p.send(ctl.Request{Op: "ack"})
			}
			return *rep.Exit, nil
		}
	}
}

// Ack implements sandbox.Acker: the init may forget the kept command
// whose exit Wait returned. It closes the control connection.
func (p *initProcess) Ack() {
	p.ack.Do(func() {
		if p.kept {
			_ = p.send(ctl.Request{Op: "ack"})
		}
		p.conn.Close()
	})
}

// ProxyAddr is where a sandbox's processes reach the egress proxy: on the
// loopback of its network namespace, its only interface.
const ProxyAddr = "127.0.0.1:3128"

// ListenProxy implements sandbox.ProxyListener: a listener on ProxyAddr
// inside the sandbox's network namespace, held by the gateway. Only the
// sandbox's own processes can connect to it.
func (s *linuxSandbox) ListenProxy(ctx context.Context) (net.Listener, string, error) {
	s.mu.Lock()
	done, pid, stopped := s.initDone, s.st.Pid, s.st.Stopped
	s.mu.Unlock()
	if stopped {
		return nil, "", sandbox.ErrStopped
	}
	select {
	case <-done:
		return nil, "", sandbox.ErrClosed
	default:
	}
	// The init is alive and watched through its pidfd, so its pid names it.
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, "", fmt.Errorf("sandbox network namespace: %w", err)
	}
	defer ns.Close()
	ln, err := listenIn(ctx, ns, ProxyAddr)
	if err != nil {
		return nil, "", err
	}
	return ln, ProxyAddr, nil
}

// listenIn opens a TCP listener on addr inside the network namespace ns
// (inNetNS).
func listenIn(ctx context.Context, ns *os.File, addr string) (net.Listener, error) {
	return inNetNS(ns, func() (net.Listener, error) {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("egress proxy listener in the sandbox: %w", err)
		}
		return ln, nil
	})
}
