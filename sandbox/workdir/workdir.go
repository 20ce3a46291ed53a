// Package workdir is the portable sandbox driver, in the gateway process: a
// plain directory per session and processes started from the gateway in
// their own process groups. It does not isolate sessions from the host or
// from each other; cmd/sandgate warns when it is used.
package workdir

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// SessionEnvVar tags every process a workdir sandbox starts, so that Destroy
// can find processes that left their process group (setsid, double fork).
const SessionEnvVar = "SANDGATE_SESSION"

// CommandEnvVar tags every process of one command's tree likewise, so that
// Process.Kill can find them.
const CommandEnvVar = sandbox.CommandTagEnv

// Config configures the portable workdir driver.
type Config struct {
	// Root is the host directory under which each session gets a workdir.
	Root string
	// SelfExe is the sandgate binary, run as `sftp-server` for SFTP.
	SelfExe string
}

// Driver is the portable driver: a plain directory per session, processes in
// their own process groups, killed as groups. It does not isolate processes
// from the host or from each other.
type Driver struct {
	cfg   Config
	shell string
	// direct says whether the shell is a bash whose start commands may
	// skip (sandbox.DirectShell), asked once.
	direct func() bool
}

// New returns a workdir driver. It creates cfg.Root if needed.
func New(cfg Config) (*Driver, error) {
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("workdir root: %w", err)
	}
	if cfg.SelfExe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		cfg.SelfExe = exe
	}
	shell := sandbox.FindShell()
	return &Driver{cfg: cfg, shell: shell, direct: sync.OnceValue(func() bool { return sandbox.DirectShell(shell) })}, nil
}

// directShell says whether commands may skip the shell (Cmd.Direct).
func (d *Driver) directShell() bool { return d.direct != nil && d.direct() }

// Name implements sandbox.Driver.
func (d *Driver) Name() string { return "workdir" }

// Create implements sandbox.Driver.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if !sandbox.ValidID(spec.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", spec.ID)
	}
	if spec.Image != nil {
		return nil, sandbox.ErrNoImages
	}
	if len(spec.TrustPEM) > 0 {
		return nil, sandbox.ErrNoTrust
	}
	dir := filepath.Join(d.cfg.Root, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create workdir: %w", err)
	}
	return &workdirSandbox{d: d, id: spec.ID, dir: dir, procs: map[*hostProcess]struct{}{}}, nil
}

type workdirSandbox struct {
	d   *Driver
	id  string
	dir string

	mu      sync.Mutex
	closed  bool
	stopped bool // Stop ended its processes; Resume clears it
	procs   map[*hostProcess]struct{}
	started int // commands started, for their tags
}

func (s *workdirSandbox) Workdir() string { return s.dir }

// ListenProxy implements sandbox.ProxyListener with a port on the host's
// loopback: workdir processes share the host's network, so the proxy is
// a convenience there (the tools that honour HTTP_PROXY get the session's
// policy), never a boundary.
func (s *workdirSandbox) ListenProxy(ctx context.Context) (net.Listener, string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("egress proxy listener: %w", err)
	}
	return ln, ln.Addr().String(), nil
}

func (s *workdirSandbox) Start(ctx context.Context, cmd sandbox.Cmd) (sandbox.Process, error) {
	var argv []string
	switch {
	case cmd.Subsystem == "sftp":
		argv = []string{s.d.cfg.SelfExe, "sftp-server", "--root", s.dir}
	case cmd.Subsystem != "":
		return nil, fmt.Errorf("unknown subsystem %q", cmd.Subsystem)
	case cmd.Command == "":
		argv = []string{s.d.shell, "-l"}
	default:
		argv = []string{s.d.shell, "-c", cmd.Command}
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = s.dir
	c.Env = sandbox.CommandEnv(s.dir, s.d.shell, nil, cmd.Env, cmd.PTY)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, sandbox.ErrClosed
	}
	if s.stopped {
		return nil, sandbox.ErrStopped
	}
	s.started++
	tag := fmt.Sprintf("%s=%s.%d", CommandEnvVar, s.id, s.started)
	c.Env = append(c.Env, SessionEnvVar+"="+s.id, tag)
	var err error
	p := s.startDirect(cmd, c)
	if p == nil {
		p, err = startHost(c, cmd.PTY)
	}
	if err != nil {
		return nil, err
	}
	p.tag = tag
	s.procs[p] = struct{}{}
	go func() {
		<-p.done
		s.mu.Lock()
		delete(s.procs, p)
		s.mu.Unlock()
	}()
	return p, nil
}

// startDirect starts cmd's words without the shell when bash would exec
// them as they are (sandbox.Cmd.Direct), with what bash would give them;
// nil when the shell must run it (c, the shell's command, then does).
func (s *workdirSandbox) startDirect(cmd sandbox.Cmd, c *exec.Cmd) *hostProcess {
	if cmd.Direct == nil || cmd.PTY != nil || cmd.Subsystem != "" || !s.d.directShell() {
		return nil
	}
	path, env, pwd, ok := sandbox.DirectExec(sandbox.DirectSpec{Words: cmd.Direct, ExecBuiltin: cmd.DirectArgv,
		Env: c.Env, Dir: c.Dir, Cwd: cmd.DirectCwd, UID: os.Geteuid(), GID: os.Getegid(), ShellArgv: c.Args})
	if !ok {
		return nil
	}
	p, err := startHost(&exec.Cmd{Path: path, Args: cmd.Direct, Env: env, Dir: pwd}, nil)
	if err != nil {
		return nil // the exec failed (a script without #!): bash runs it and says what it says
	}
	p.directPWD = pwd
	return p
}

// Destroy kills every process of the sandbox, including ones that left their
// process group but kept the session tag in their environment, then removes
// the workdir.
func (s *workdirSandbox) Destroy(ctx context.Context) error {
	s.kill(ctx)
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("remove workdir: %w", err)
	}
	return nil
}

// Halt implements sandbox.Halter: the sandbox takes no new process, and
// every process it has (those tagged with its session too, in one pass)
// gets SIGKILL; nothing waits for them. Destroy, later, kills what is
// left, waits for them and removes the workdir.
func (s *workdirSandbox) Halt() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.killGroups()
	killTagged(SessionEnvVar + "=" + s.id)
}

// killGroups sends SIGKILL to the process group of every process the
// sandbox has, and returns them.
func (s *workdirSandbox) killGroups() []*hostProcess {
	s.mu.Lock()
	procs := make([]*hostProcess, 0, len(s.procs))
	for p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	return procs
}

// kill closes the sandbox to new processes and kills every process it has.
func (s *workdirSandbox) kill(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.killProcs(ctx)
}

// Stop implements sandbox.Stopper: every process of the sandbox is
// killed, as Destroy kills them, and the directory stays.
func (s *workdirSandbox) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sandbox.ErrClosed
	}
	s.stopped = true
	s.mu.Unlock()
	s.killProcs(ctx)
	return nil
}

// Resume implements sandbox.Stopper: processes may start again.
func (s *workdirSandbox) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return sandbox.ErrClosed
	}
	s.stopped = false
	return nil
}

// Stopped implements sandbox.Stopper.
func (s *workdirSandbox) Stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// killProcs kills every process the sandbox has, including ones that left
// their process group but kept the session tag, and waits a while for
// them to be reaped.
func (s *workdirSandbox) killProcs(ctx context.Context) {
	procs := s.killGroups()
	killAllTagged(SessionEnvVar + "=" + s.id)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// killTagged sends SIGKILL to every process whose environment holds tag and
// returns how many it found.
func killTagged(tag string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	want := []byte(tag)
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(kv, want) {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					n++
				}
				break
			}
		}
	}
	return n
}
