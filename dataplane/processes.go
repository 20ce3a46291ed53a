package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// Defaults of ProcessConfig.
const (
	DefaultMaxRunning  = 64
	DefaultMaxFinished = 100
	// startTimeout bounds starting a process in the sandbox.
	startTimeout = 30 * time.Second
	// drainGrace is how long, after a process exited, its output is still
	// read: what it left running may hold its pipes open.
	drainGrace = 2 * time.Second
)

// Process states, as ProcessInfo.Status shows them.
const (
	StatusRunning = "running"
	StatusExited  = "exited"
	StatusKilled  = "killed"
)

// Errors of Processes; package rest maps them to answers.
var (
	ErrTooManyProcesses = errors.New("too many running processes in this session")
	ErrProcessExited    = errors.New("the process has exited")
	ErrStdinClosed      = errors.New("the process's standard input was closed (eof)")
	// ErrStdinClosedByProcess is ErrStdinClosed for an input the running
	// process closed itself (exec 0<&-).
	ErrStdinClosedByProcess = errors.New("the process closed its standard input and is still running")
	ErrStdinBlocked         = errors.New("the process is not reading its standard input")
)

// ProcessConfig bounds one session's background processes. Zero values
// get the defaults.
type ProcessConfig struct {
	// StateDir holds each process's output under <StateDir>/<session>/<id>;
	// "" keeps output in memory (capped all the same).
	StateDir string
	// OutputCap is how many bytes of output a process keeps
	// (DefaultOutputCap).
	OutputCap int64
	// MaxRunning caps the running processes of a session
	// (DefaultMaxRunning); MaxFinished is how many finished ones it
	// remembers, oldest dropped first (DefaultMaxFinished).
	MaxRunning, MaxFinished int
	Log                     *slog.Logger
}

func (c ProcessConfig) withDefaults() ProcessConfig {
	if c.OutputCap <= 0 {
		c.OutputCap = DefaultOutputCap
	}
	if c.MaxRunning <= 0 {
		c.MaxRunning = DefaultMaxRunning
	}
	if c.MaxFinished <= 0 {
		c.MaxFinished = DefaultMaxFinished
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// StartRequest is a background process to start.
type StartRequest struct {
	// Command is run by the sandbox's shell; Argv, when set instead, is
	// run as it is (quoted into `exec 'a' 'b'`).
	Command string
	Argv    []string
	// Env holds KEY=VALUE pairs, already filtered.
	Env []string
	// Cwd is where the process starts ("": the sandbox's default, the
	// workspace); relative to the workspace when relative.
	Cwd string
	// Name is the client's label for the process.
	Name string
}

// ProcessInfo is what a client sees of a background process.
type ProcessInfo struct {
	ProcessID string `json:"processId"`
	// PID is the process's pid as the sandbox sees it; 0 (left out) when
	// the driver does not tell.
	PID     int      `json:"pid,omitempty"`
	Name    string   `json:"name,omitempty"`
	Command string   `json:"command"`
	Argv    []string `json:"argv,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	Status  string   `json:"status"`
	// ExitCode is set once the process exited (status exited); ExitSignal
	// once a signal ended it (status killed).
	ExitCode   *int       `json:"exitCode,omitempty"`
	ExitSignal string     `json:"exitSignal,omitempty"`
	StartedAt  time.Time  `json:"startedAt"`
	EndedAt    *time.Time `json:"endedAt,omitempty"`
	// OutputBytes is how many bytes of output (stdout and stderr) the
	// process wrote: the offset its output ends at. OutputStartOffset is
	// the offset of the oldest byte still kept.
	OutputBytes       int64 `json:"outputBytes"`
	OutputStartOffset int64 `json:"outputStartOffset"`
}

// Processes holds every session's background processes. Its zero value
// is ready to use; it is safe for concurrent use.
type Processes struct {
	mu       sync.Mutex
	sessions map[string]*sessionProcs // by session id
	// lastSeq is the last process number of a session whose processes
	// ended with a stop: its ids go on from there after the resume, so an
	// old id never names a new process.
	lastSeq map[string]int
}

// sessionProcs is one session's processes.
type sessionProcs struct {
	id     string
	cfg    ProcessConfig
	dir    string // <StateDir>/<session>, "" in memory
	remove func() // unregisters from the session's connections

	mu       sync.Mutex
	closed   bool
	seq      int
	starting int
	procs    map[string]*Process
	finished []*Process // oldest first
}

// Process is one background process.
type Process struct {
	info ProcessInfo // the fixed fields
	sp   *sessionProcs
	p    sandbox.Process
	out  *OutputLog
	done chan struct{} // closed once it ended and its output is complete

	mu          sync.Mutex
	running     bool
	exit        sandbox.Exit
	endedAt     time.Time
	stdinMu     sync.Mutex // serialises writes to stdin
	stdinClosed bool       // guarded by mu
}

// Start starts a background process in s's sandbox, detached from ctx
// (only its start is bounded by ctx's deadline, at most 30 s): it runs
// until it exits, is signalled, or the session ends, which kills it and
// frees its output.
func (ps *Processes) Start(ctx context.Context, s *gateway.Session, cfg ProcessConfig, req StartRequest) (ProcessInfo, error) {
	sp, err := ps.session(s, cfg)
	if err != nil {
		return ProcessInfo{}, err
	}
	sp.mu.Lock()
	if sp.closed {
		sp.mu.Unlock()
		return ProcessInfo{}, ErrSessionEnded
	}
	if sp.running()+sp.starting >= sp.cfg.MaxRunning {
		sp.mu.Unlock()
		return ProcessInfo{}, fmt.Errorf("%w (at most %d)", ErrTooManyProcesses, sp.cfg.MaxRunning)
	}
	sp.seq++
	sp.starting++
	id := "p" + strconv.Itoa(sp.seq)
	sp.mu.Unlock()
	started := false
	defer func() {
		if !started {
			sp.mu.Lock()
			sp.starting--
			sp.mu.Unlock()
		}
	}()

	dir := ""
	if sp.dir != "" {
		dir = filepath.Join(sp.dir, id)
	}
	out, err := NewOutputLog(dir, sp.cfg.OutputCap)
	if err != nil {
		return ProcessInfo{}, err
	}
	command := req.Command
	if len(req.Argv) > 0 {
		command = "exec " + quoteArgs(req.Argv)
	}
	if req.Cwd != "" {
		command = "cd -- " + shellQuote(req.Cwd) + " || exit 1\n" + command
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		sctx, cancel = context.WithDeadline(sctx, dl)
		defer cancel()
	}
	sctx = gateway.WithCommandSource(sctx, "rest")
	sb := s.Sandbox()
	if sb == nil {
		_ = out.Remove()
		return ProcessInfo{}, ErrSessionEnded
	}
	p, err := sb.Start(sctx, sandbox.Cmd{Command: command, Env: req.Env})
	if err != nil {
		_ = out.Remove()
		if errors.Is(err, sandbox.ErrClosed) {
			return ProcessInfo{}, ErrSessionEnded
		}
		return ProcessInfo{}, fmt.Errorf("start process: %w", err)
	}
	pr := &Process{
		sp: sp, p: p, out: out, done: make(chan struct{}), running: true,
		info: ProcessInfo{
			ProcessID: id, Name: req.Name, Command: req.Command, Argv: req.Argv, Cwd: req.Cwd,
			StartedAt: time.Now().UTC(),
		},
	}
	if len(req.Argv) > 0 {
		pr.info.Command = strings.Join(req.Argv, " ")
	}
	if pp, ok := p.(sandbox.PIDer); ok {
		pr.info.PID = pp.PID()
	}
	sp.mu.Lock()
	sp.starting--
	started = true
	if sp.closed {
		sp.mu.Unlock()
		p.Kill()
		go func() { _, _ = p.Wait() }()
		_ = out.Remove()
		if sp.dir != "" {
			_ = os.Remove(sp.dir) // end removed it before this process's output made it again
		}
		return ProcessInfo{}, ErrSessionEnded
	}
	sp.procs[id] = pr
	sp.mu.Unlock()
	go pr.run()
	sp.cfg.Log.Info("process_started", "session", sp.id, "process", id, "pid", pr.info.PID)
	return pr.Info(), nil
}

// session returns s's processes, registering them to end with s.
func (ps *Processes) session(s *gateway.Session, cfg ProcessConfig) (*sessionProcs, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if sp, ok := ps.sessions[s.ID]; ok {
		return sp, nil
	}
	cfg = cfg.withDefaults()
	sp := &sessionProcs{id: s.ID, cfg: cfg, procs: map[string]*Process{}, seq: ps.lastSeq[s.ID]}
	if cfg.StateDir != "" {
		if !sandbox.ValidID(s.ID) {
			return nil, fmt.Errorf("session id %q cannot name a directory", s.ID)
		}
		sp.dir = filepath.Join(cfg.StateDir, s.ID)
	}
	remove, ok := s.AddConn(func() { ps.end(sp, s.Live()) })
	if !ok {
		return nil, ErrSessionEnded
	}
	sp.remove = remove
	if ps.sessions == nil {
		ps.sessions = map[string]*sessionProcs{}
	}
	ps.sessions[s.ID] = sp
	return sp, nil
}

// end kills a session's processes and frees their output: the session
// ended, or stopped (then its process numbers go on after the resume).
func (ps *Processes) end(sp *sessionProcs, stopped bool) {
	sp.mu.Lock()
	sp.closed = true
	procs := sp.procs
	sp.procs, sp.finished = map[string]*Process{}, nil
	seq := sp.seq
	sp.mu.Unlock()
	ps.mu.Lock()
	if ps.sessions[sp.id] == sp {
		delete(ps.sessions, sp.id)
	}
	if stopped { // still live: it resumes
		if ps.lastSeq == nil {
			ps.lastSeq = map[string]int{}
		}
		ps.lastSeq[sp.id] = seq
	} else {
		delete(ps.lastSeq, sp.id)
	}
	ps.mu.Unlock()
	for _, p := range procs {
		// Output first: a follower then ends without a "done" line (the
		// session is gone, not the process's own end), whichever of
		// the kill and the process's exit it would otherwise see first.
		if err := p.out.Remove(); err != nil {
			sp.cfg.Log.Warn("process_output_remove_failed", "session", sp.id, "process", p.info.ProcessID, "err", err)
		}
		p.p.Kill()
	}
	if sp.dir != "" {
		if err := os.RemoveAll(sp.dir); err != nil {
			sp.cfg.Log.Warn("process_output_remove_failed", "session", sp.id, "err", err)
		}
	}
}

// running counts the running processes; sp.mu is held.
func (sp *sessionProcs) running() int {
	return len(sp.procs) - len(sp.finished)
}

// run copies the process's output until it exits, then records its end.
func (pr *Process) run() {
	var pumps sync.WaitGroup
	pump := func(r io.ReadCloser, stream Stream) {
		defer pumps.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				_ = pr.out.Write(stream, buf[:n]) // a full disk loses output, not the process
			}
			if err != nil {
				return
			}
		}
	}
	stdout, stderr := pr.p.Stdout(), pr.p.Stderr()
	pumps.Add(1)
	go pump(stdout, Stdout)
	if stderr != nil {
		pumps.Add(1)
		go pump(stderr, Stderr)
	}
	exit, err := pr.p.Wait()
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		// What the process left behind holds its output open: stop
		// reading it, as the process is over.
		stdout.Close()
		if stderr != nil {
			stderr.Close()
		}
		<-drained
	}
	stdout.Close()
	if stderr != nil {
		stderr.Close()
	}
	if err != nil {
		exit = sandbox.Exit{Signal: "KILL"}
	}
	pr.mu.Lock()
	pr.running, pr.exit, pr.endedAt = false, exit, time.Now().UTC()
	pr.stdinClosed = true
	pr.mu.Unlock()
	pr.out.Close()
	// Filed before Done: a caller woken by Done lists the process among
	// the finished, in the order they ended (and the oldest beyond the cap
	// already dropped).
	pr.sp.finish(pr)
	close(pr.done)
}

// finish files pr among the finished processes, dropping the oldest
// beyond the cap.
func (sp *sessionProcs) finish(pr *Process) {
	sp.mu.Lock()
	if sp.closed || sp.procs[pr.info.ProcessID] != pr {
		sp.mu.Unlock()
		return
	}
	sp.finished = append(sp.finished, pr)
	var drop []*Process
	for len(sp.finished) > sp.cfg.MaxFinished {
		drop = append(drop, sp.finished[0])
		delete(sp.procs, sp.finished[0].info.ProcessID)
		sp.finished = sp.finished[1:]
	}
	sp.mu.Unlock()
	for _, d := range drop {
		_ = d.out.Remove()
	}
	sp.cfg.Log.Info("process_ended", "session", sp.id, "process", pr.info.ProcessID)
}

// List returns the session's processes, running and recently finished,
// in the order they started.
func (ps *Processes) List(sessionID string) []ProcessInfo {
	sp := ps.lookup(sessionID)
	if sp == nil {
		return []ProcessInfo{}
	}
	sp.mu.Lock()
	procs := make([]*Process, 0, len(sp.procs))
	for _, p := range sp.procs {
		procs = append(procs, p)
	}
	sp.mu.Unlock()
	out := make([]ProcessInfo, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.Info())
	}
	sortInfos(out)
	return out
}

func sortInfos(infos []ProcessInfo) {
	num := func(id string) int { n, _ := strconv.Atoi(strings.TrimPrefix(id, "p")); return n }
	slices.SortFunc(infos, func(a, b ProcessInfo) int { return num(a.ProcessID) - num(b.ProcessID) })
}

// Get returns process id of the session, or false. id is a processId
// (p1) or, as clients that know processes by pid expect, the pid the
// sandbox gave it (a remembered process's, running or finished).
func (ps *Processes) Get(sessionID, id string) (*Process, bool) {
	sp := ps.lookup(sessionID)
	if sp == nil {
		return nil, false
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if p, ok := sp.procs[id]; ok {
		return p, true
	}
	pid, err := strconv.Atoi(id)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != id {
		return nil, false
	}
	// A pid may have been reused: the newest process that had it.
	var found *Process
	for _, p := range sp.procs {
		if p.info.PID == pid && (found == nil || p.info.StartedAt.After(found.info.StartedAt)) {
			found = p
		}
	}
	return found, found != nil
}

func (ps *Processes) lookup(sessionID string) *sessionProcs {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.sessions[sessionID]
}

// Info is the process as a client sees it now.
func (pr *Process) Info() ProcessInfo {
	info := pr.info
	info.Argv = append([]string(nil), pr.info.Argv...)
	if len(info.Argv) == 0 {
		info.Argv = nil
	}
	pr.mu.Lock()
	running, exit, ended := pr.running, pr.exit, pr.endedAt
	pr.mu.Unlock()
	info.Status = StatusRunning
	if !running {
		info.EndedAt = &ended
		if exit.Signal != "" {
			info.Status, info.ExitSignal = StatusKilled, exit.Signal
		} else {
			code := exit.Code
			info.Status, info.ExitCode = StatusExited, &code
		}
	}
	info.OutputBytes, info.OutputStartOffset = pr.out.End(), pr.out.Start()
	return info
}

// Output is the process's combined output.
func (pr *Process) Output() *OutputLog { return pr.out }

// Done is closed once the process ended and its output is complete.
func (pr *Process) Done() <-chan struct{} { return pr.done }

// isRunning reports whether the process has not ended yet.
func (pr *Process) isRunning() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.running
}

// Signal sends sig to the process's group; ErrProcessExited once it
// ended.
func (pr *Process) Signal(sig syscall.Signal) error {
	if !pr.isRunning() {
		return ErrProcessExited
	}
	if err := pr.p.Signal(sig); err != nil {
		if !pr.isRunning() || errors.Is(err, syscall.ESRCH) {
			return ErrProcessExited
		}
		return fmt.Errorf("signal process: %w", err)
	}
	return nil
}

// stdinTimeout bounds a write to a process's standard input that does not
// go through (the process does not read it).
const stdinTimeout = 10 * time.Second

// WriteStdin writes data to the process's standard input, then closes it
// when eof. It returns how many bytes went through; ErrStdinBlocked when
// the process did not take them within 10 s (or before ctx ended).
func (pr *Process) WriteStdin(ctx context.Context, data []byte, eof bool) (int, error) {
	pr.stdinMu.Lock()
	defer pr.stdinMu.Unlock()
	pr.mu.Lock()
	running, closed := pr.running, pr.stdinClosed
	pr.mu.Unlock()
	switch {
	case !running:
		return 0, ErrProcessExited
	case closed:
		return 0, ErrStdinClosed
	}
	w := pr.p.Stdin()
	n := 0
	if len(data) > 0 {
		type deadliner interface{ SetWriteDeadline(time.Time) error }
		if d, ok := w.(deadliner); ok {
			_ = d.SetWriteDeadline(time.Now().Add(stdinTimeout))
			stop := procio.DeadlineOnCancel(ctx, d.SetWriteDeadline)
			defer func() {
				stop()
				_ = d.SetWriteDeadline(time.Time{})
			}()
		}
		var err error
		n, err = w.Write(data)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return n, ErrStdinBlocked
			}
			if errors.Is(err, syscall.EPIPE) {
				// The reading end is gone: the process ended (its exit
				// may not be seen yet), or it closed its input.
				select {
				case <-pr.done:
					return n, ErrProcessExited
				case <-time.After(200 * time.Millisecond):
				}
				if !pr.isRunning() {
					return n, ErrProcessExited
				}
				return n, ErrStdinClosedByProcess
			}
			if !pr.isRunning() || errors.Is(err, os.ErrClosed) {
				return n, ErrProcessExited
			}
			return n, fmt.Errorf("write stdin: %w", err)
		}
	}
	if eof {
		pr.mu.Lock()
		pr.stdinClosed = true
		pr.mu.Unlock()
		if err := w.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return n, fmt.Errorf("close stdin: %w", err)
		}
	}
	return n, nil
}

// quoteArgs quotes argv for a POSIX shell, each argument in single quotes.
func quoteArgs(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// shellQuote is s in single quotes, each ' written as '\”.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
