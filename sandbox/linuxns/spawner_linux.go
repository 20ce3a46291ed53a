//go:build linux

package linuxns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// spawnServer is the small init running as `sandbox-spawner`
// (initd.SpawnMain; ctl.SpawnRequest says why): it starts every new
// sandbox init, so that the gateway never forks itself for one. It runs
// as long as the gateway (it ends when its socket closes: the gateway's
// exit, or the Driver becoming unreachable); its inits outlive it as they
// outlive the gateway. Without the small init (go install) there is none,
// and the driver forks inits itself.
type spawnServer struct {
	mu   sync.Mutex // one request written at a time
	conn *net.UnixConn
	cmd  *exec.Cmd
	// gone is set once the server has ended (reaped, or a request could
	// not be written): the driver forks its inits itself from then on.
	gone atomic.Bool
	// closing is set by close; exited is closed once the server is
	// reaped (by the goroutine startSpawnServer starts).
	closing atomic.Bool
	exited  chan struct{}
}

// startSpawnServer starts the server from the small init's memfd, with
// its stderr appended to logPath.
func startSpawnServer(initFile *os.File, logPath string, log *slog.Logger) (*spawnServer, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "spawner"), os.NewFile(uintptr(pair[1]), "spawner")
	defer theirs.Close()
	defer ours.Close()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := &exec.Cmd{
		Path:       "/proc/self/fd/" + fmt.Sprint(initFile.Fd()),
		Args:       []string{"sandgate", "sandbox-spawner"},
		Env:        []string{"GOMAXPROCS=1"},
		Dir:        "/",
		ExtraFiles: []*os.File{theirs, initFile}, // ctl.SpawnConnFD, ctl.SpawnInitFD
		Stderr:     logf,
		// Its own session, like the inits: no signal for the gateway's
		// terminal reaches it.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the sandbox spawner: %w", err)
	}
	fc, err := net.FileConn(ours)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	s := &spawnServer{conn: fc.(*net.UnixConn), cmd: cmd, exited: make(chan struct{})}
	// Reaped as soon as it ends, however it ends: a server that died
	// (killed, OOM) is no zombie of the gateway for as long as it runs.
	go func() {
		err := cmd.Wait()
		s.gone.Store(true)
		if !s.closing.Load() {
			log.Warn("sandbox spawner ended; the gateway forks every init itself from now on", "err", fmt.Sprint(err))
		}
		close(s.exited)
	}()
	return s, nil
}

// close ends the server (its inits run on; no create is waiting for it
// when the Driver is unreachable), even a stuck one, and returns at once:
// it runs as a runtime cleanup, which must not block the others. The
// goroutine startSpawnServer started reaps it.
func (s *spawnServer) close() {
	s.closing.Store(true)
	s.conn.Close()
	_ = s.cmd.Process.Kill()
}

// start asks the server for an init as startInit describes, and returns
// its pid and pidfd. initSock, logf and cgroupFD (-1: none) and tasks stay
// the caller's.
func (s *spawnServer) start(ctx context.Context, req ctl.SpawnRequest, initSock, logf *os.File, cgroupFD int, tasks []int) (int, *os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, nil, fmt.Errorf("socketpair: %w", err)
	}
	rf := os.NewFile(uintptr(pair[0]), "spawn-reply")
	defer rf.Close()
	fds := []int{pair[1], int(initSock.Fd()), int(logf.Fd())}
	req.FDs = []string{"reply", "init", "log"}
	if cgroupFD >= 0 {
		fds, req.FDs = append(fds, cgroupFD), append(req.FDs, "cgroup")
	}
	for _, fd := range tasks {
		fds, req.FDs = append(fds, fd), append(req.FDs, "tasks")
	}
	if s.gone.Load() {
		unix.Close(pair[1])
		return 0, nil, errSpawnerGone
	}
	// The server answers within milliseconds: one that has not answered
	// within spawnReplyWait (or ctx's deadline, if sooner) is stuck.
	dl, byCtx := time.Now().Add(spawnReplyWait), false
	if cdl, ok := ctx.Deadline(); ok && cdl.Before(dl) {
		dl, byCtx = cdl, true
	}
	s.mu.Lock()
	_ = s.conn.SetWriteDeadline(dl)
	werr := ctl.WriteFrame(s.conn, req, fds...)
	s.mu.Unlock()
	if werr != nil {
		// Ended, stuck, or a frame cut short: it is not asked again.
		if !s.gone.Swap(true) {
			werr = fmt.Errorf("%w: %w", errSpawnerGone, werr)
		}
		_ = s.cmd.Process.Kill()
	}
	runtime.KeepAlive(initSock)
	runtime.KeepAlive(logf)
	unix.Close(pair[1])
	if werr != nil {
		return 0, nil, fmt.Errorf("sandbox spawner: %w", werr)
	}
	fc, err := net.FileConn(rf)
	if err != nil {
		return 0, nil, err
	}
	rc := fc.(*net.UnixConn)
	defer rc.Close()
	_ = rc.SetDeadline(dl)
	// A create given up on stops waiting at once.
	stop := context.AfterFunc(ctx, func() { _ = rc.SetDeadline(time.Now()) })
	defer stop()
	var r ctl.SpawnReply
	got, err := ctl.ReadFrame(rc, &r)
	if err != nil {
		procio.CloseFDs(got)
		if errors.Is(err, os.ErrDeadlineExceeded) && !byCtx && ctx.Err() == nil {
			// Stuck (stopped, wedged): ended, so that neither this
			// create nor the next ones wait for it; the driver forks
			// the inits itself from now on. The init it may still
			// start exits: its set-up socket closes with this create.
			s.gone.Store(true)
			_ = s.cmd.Process.Kill()
			return 0, nil, fmt.Errorf("sandbox spawner: no answer within %v: %w", spawnReplyWait, err)
		}
		return 0, nil, fmt.Errorf("sandbox spawner: %w", err)
	}
	if r.Error != "" || len(got) != 1 || r.Pid <= 0 {
		procio.CloseFDs(got)
		if r.Error == "" {
			r.Error = fmt.Sprintf("a reply with pid %d and %d descriptors", r.Pid, len(got))
		}
		return 0, nil, errors.New(r.Error)
	}
	// Non-blocking, as unix.PidfdOpen gives the driver's own: the
	// sandbox's watch polls it through the runtime's poller.
	if err := unix.SetNonblock(got[0], true); err != nil {
		procio.CloseFDs(got)
		return 0, nil, err
	}
	return r.Pid, os.NewFile(uintptr(got[0]), "init"), nil
}

// spawnReplyWait bounds the spawn server's answer to one request (it
// takes milliseconds, tens under heavy load); past it the server is taken
// for stuck and ended.
const spawnReplyWait = 5 * time.Second

// errSpawnerGone: the spawn server has ended.
var errSpawnerGone = errors.New("the sandbox spawner has ended")

// spawnerLog is the spawn server's stderr, in the driver's dir.
func spawnerLog(root string) string { return filepath.Join(root, ".spawner.log") }

// startedInit is a new init: its pid and pidfd, and cmd when the gateway
// forked it itself (nil: the spawn server did, and the kernel reaps it).
type startedInit struct {
	cmd   *exec.Cmd
	pid   int
	pidfd *os.File
}

// kill kills an init not handed over yet (and reaps it, when it is the
// gateway's child).
func (in startedInit) kill() {
	if in.cmd != nil {
		killWait(in.cmd)
	} else {
		_ = unix.PidfdSendSignal(int(in.pidfd.Fd()), unix.SIGKILL, nil, 0)
	}
	in.pidfd.Close()
}

// launchInit starts a sandbox init as startInit describes, through the
// spawn server when there is one, and returns it with a pidfd and the
// gateway's end of its set-up socket.
func (d *Driver) launchInit(ctx context.Context, uidBase int, logPath string, cgroupFD int, cgroupTasks []int) (startedInit, *net.UnixConn, error) {
	if d.spawner != nil {
		in, conn, err := d.spawnInit(ctx, uidBase, logPath, cgroupFD, cgroupTasks)
		if err == nil {
			return in, conn, nil
		}
		if ctx.Err() != nil {
			// Given up on: no init to fork.
			return startedInit{}, nil, fmt.Errorf("sandbox init: %w", ctxErr(ctx, err))
		}
		// Logged for each request it failed, and once when it ended:
		// every init is then forked here.
		if err != errSpawnerGone {
			d.log.Warn("sandbox spawner failed; the gateway starts the init itself", "err", err.Error())
		}
	}
	cmd, conn, err := d.startInit(uidBase, logPath, cgroupFD, cgroupTasks)
	if err != nil {
		return startedInit{}, nil, err
	}
	// An unreaped child: the pid cannot have been reused.
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, unix.O_NONBLOCK)
	if err != nil {
		killWait(cmd)
		conn.Close()
		return startedInit{}, nil, fmt.Errorf("pidfd of sandbox init: %w", err)
	}
	return startedInit{cmd: cmd, pid: cmd.Process.Pid, pidfd: os.NewFile(uintptr(pidfd), "init")}, conn, nil
}

// spawnInit is launchInit through the spawn server.
func (d *Driver) spawnInit(ctx context.Context, uidBase int, logPath string, cgroupFD int, cgroupTasks []int) (startedInit, *net.UnixConn, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return startedInit{}, nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "init"), os.NewFile(uintptr(pair[1]), "init")
	defer theirs.Close()
	defer ours.Close()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return startedInit{}, nil, err
	}
	defer logf.Close()
	pid, pidfd, err := d.spawner.start(ctx, ctl.SpawnRequest{UIDBase: uidBase, IDs: idRange, Cloneflags: d.initCloneflags(), Env: d.initEnv()},
		theirs, logf, cgroupFD, cgroupTasks)
	if err != nil {
		return startedInit{}, nil, err
	}
	in := startedInit{pid: pid, pidfd: pidfd}
	fc, err := net.FileConn(ours)
	if err != nil {
		in.kill()
		return startedInit{}, nil, err
	}
	return in, fc.(*net.UnixConn), nil
}
