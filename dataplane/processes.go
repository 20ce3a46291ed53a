package dataplane

import (
	"context"
	"encoding/json"
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

// Errors of Processes; the client-facing ones are *gateway.Error under
// errors.As (errors.go).
var (
	ErrTooManyProcesses       = errors.New("too many running processes in this session")
	ErrProcessExited    error = newClientError("the process has exited", gateway.KindConflict, "process_exited", "the process has exited")
	ErrStdinClosed      error = newClientError("the process's standard input was closed (eof)", gateway.KindConflict, "stdin_closed",
		"the process's standard input was closed (eof)")
	// ErrStdinClosedByProcess is ErrStdinClosed for an input the running
	// process closed itself (exec 0<&-).
	ErrStdinClosedByProcess error = newClientError("the process closed its standard input and is still running", gateway.KindConflict,
		"stdin_closed", "the process closed its standard input and is still running")
	ErrStdinBlocked = errors.New("the process is not reading its standard input")
	// ErrOutputLimit: the tenant's processes keep as much output as
	// ProcessConfig.TenantOutputBytes allows.
	ErrOutputLimit = errors.New("the tenant's background processes keep as much output as allowed")
)

// DefaultTenantOutputBytes is ProcessConfig.TenantOutputBytes's default:
// 128 running processes' worth of output (DefaultOutputCap each), two
// sessions' full of them.
const DefaultTenantOutputBytes = 2 << 30

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
	// TenantOutputBytes bounds the output the processes of all of one
	// tenant's sessions keep (DefaultTenantOutputBytes): a running
	// process counts OutputCap (what it may come to keep), a finished one
	// what it keeps. A start past it first forgets the tenant's oldest
	// finished processes, then fails with ErrOutputLimit.
	TenantOutputBytes int64
	Log               *slog.Logger
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
	if c.TenantOutputBytes <= 0 {
		c.TenantOutputBytes = DefaultTenantOutputBytes
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
	// PTY, when set, runs the process on a pseudo-terminal of that size
	// (the E2B facade's terminals): its output is the terminal's, all
	// stdout; its input is typed on the terminal (Process.WriteStdin);
	// Process.Resize resizes it. Such a process ends with the gateway:
	// a terminal is not kept across restarts.
	PTY *sandbox.PTY
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
	// OutputTruncated, when set, says why the output after OutputBytes
	// is not kept (TruncatedDiskFull: the session's disk quota was
	// full); OutputDiscardedBytes counts what the process wrote since.
	OutputTruncated      string `json:"outputTruncated,omitempty"`
	OutputDiscardedBytes int64  `json:"outputDiscardedBytes,omitempty"`
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
	// charged is the output each tenant's processes count (see
	// ProcessConfig.TenantOutputBytes).
	charged map[string]int64
}

// sessionProcs is one session's processes.
type sessionProcs struct {
	ps     *Processes
	id     string
	tenant string
	cfg    ProcessConfig
	dir    string // <StateDir>/<session>, "" in memory
	remove func() // unregisters from the session's connections
	// s is the session; gone is closed when its processes end (end),
	// offCheckpoint unregisters letGo (processes_pause.go).
	s             *gateway.Session
	gone          chan struct{}
	offCheckpoint func()
	// ckGen counts letGo's calls (a checkpoint each): the processes let
	// go of by the last one carry it in relGen (guarded by mu).
	ckGen int
	// disk charges the output kept under dir to the session's disk
	// quota (nil in memory).
	disk *sessionDisk

	mu       sync.Mutex
	closed   bool
	seq      int
	starting int
	procs    map[string]*Process
	finished []*Process // oldest first

	seqMu    sync.Mutex // orders writes of session.json
	savedSeq int        // the number session.json holds
}

// Process is one background process.
type Process struct {
	info ProcessInfo // the fixed fields
	sp   *sessionProcs
	p    sandbox.Process
	out  *OutputLog
	done chan struct{} // closed once it ended and its output is complete
	// dir holds its output and its record (process.json), "" in memory.
	dir string
	// keep is its key in a sandbox that keeps it across gateway
	// restarts (sandbox.Cmd.Keep).
	keep string
	// pty says it runs on a pseudo-terminal (StartRequest.PTY).
	pty bool
	// charge is what it counts against its tenant's output bound;
	// guarded by the Processes' mu.
	charge  int64
	saveMu  sync.Mutex // orders writes of its record
	dropped bool       // its record was removed: never written again; under saveMu

	mu          sync.Mutex
	running     bool
	exit        sandbox.Exit
	endedAt     time.Time
	stdinMu     sync.Mutex // serialises writes to stdin
	stdinClosed bool       // guarded by mu
	// released says the gateway let go of the process for a pause by
	// checkpoint (sandbox.Releaser): it runs on, kept by the init, until
	// takeBack takes it back, then closes back; guarded by mu.
	released bool
	back     chan struct{}
	// relGen is the sessionProcs.ckGen of the last letGo that let go of
	// the process; relDone is closed once run has stored the output it
	// read before, which then ends at relEnd (guarded by mu): a fork of
	// that checkpoint copies the output up to there (Processes.Fork).
	relGen    int
	relDone   chan struct{}
	relEnd    int64
	relStored bool
	// ending says run is recording its end (guarded by mu): too late to
	// let go of it.
	ending bool
	// A REST command handed over at a pause keeps what was left of its
	// timeout (gateway.Handoff.TimeLeft) as running time: limitLeft,
	// counted down from limitFrom while this gateway runs it (limitTimer
	// set), held while it is let go of; at zero, limitTimer kills it as
	// the timeout would have. Guarded by mu; 0: no limit.
	limitLeft  time.Duration
	limitFrom  time.Time
	limitTimer *time.Timer
}

// armLimit starts counting pr's running-time limit down, if it has one,
// for its process p (run's).
func (pr *Process) armLimit(p sandbox.Process) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.limitLeft <= 0 || pr.limitTimer != nil || !pr.running || pr.released {
		return
	}
	pr.limitFrom = time.Now()
	pr.limitTimer = time.AfterFunc(pr.limitLeft, func() { pr.timeUp(p) })
}

// holdLimitLocked stops the count down (its process let go of, or
// ended), keeping what is left; pr.mu is held.
func (pr *Process) holdLimitLocked() {
	if pr.limitTimer == nil {
		return
	}
	if pr.limitTimer.Stop() {
		pr.limitLeft = max(pr.limitLeft-time.Since(pr.limitFrom), time.Millisecond)
	} else {
		pr.limitLeft = time.Millisecond // it ran out as it was held: at once, when it runs again
	}
	pr.limitTimer = nil
}

// limitNowLocked is what is left of pr's limit now; pr.mu is held.
func (pr *Process) limitNowLocked() time.Duration {
	if pr.limitTimer == nil || pr.limitLeft <= 0 {
		return pr.limitLeft
	}
	return max(pr.limitLeft-time.Since(pr.limitFrom), time.Millisecond)
}

// timeUp ends p, pr's process, whose running-time limit ran out, as its
// command's timeout would have: its whole tree, SIGHUP then SIGKILL.
func (pr *Process) timeUp(p sandbox.Process) {
	pr.mu.Lock()
	live := pr.running && !pr.released && pr.limitTimer != nil
	if live {
		pr.limitTimer, pr.limitLeft = nil, 0
	}
	pr.mu.Unlock()
	if !live {
		return
	}
	pr.sp.cfg.Log.Info("process_timed_out", "session", pr.sp.id, "process", pr.info.ProcessID)
	p.Kill()
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
		return ProcessInfo{}, refusal(fmt.Errorf("%w (at most %d)", ErrTooManyProcesses, sp.cfg.MaxRunning),
			"too_many_processes", "; wait for one to end or signal one")
	}
	sp.seq++
	sp.starting++
	id := "p" + strconv.Itoa(sp.seq)
	seq := sp.seq
	sp.mu.Unlock()
	started := false
	defer func() {
		if !started {
			sp.mu.Lock()
			sp.starting--
			sp.mu.Unlock()
		}
	}()
	pr := &Process{
		sp: sp, done: make(chan struct{}), running: true, keep: "process/" + id, pty: req.PTY != nil,
		info: ProcessInfo{
			ProcessID: id, Name: req.Name, Command: req.Command, Argv: req.Argv, Cwd: req.Cwd,
			StartedAt: time.Now().UTC(),
		},
	}
	if len(req.Argv) > 0 {
		pr.info.Command = strings.Join(req.Argv, " ")
	}
	if err := sp.reserve(pr); err != nil {
		return ProcessInfo{}, err
	}
	defer func() {
		if !started {
			sp.ps.uncharge(sp.tenant, pr)
		}
	}()
	if sp.dir != "" {
		pr.dir = filepath.Join(sp.dir, id)
		// The number first: an id is never given twice, even across a crash.
		if err := sp.saveSeq(seq); err != nil {
			return ProcessInfo{}, err
		}
	}
	out, err := NewOutputLog(pr.dir, sp.cfg.OutputCap)
	if err != nil {
		return ProcessInfo{}, err
	}
	if sp.disk != nil {
		out.SetQuota(sp.disk)
	}
	pr.out = out
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
	sb := s.Sandbox()
	if sb == nil {
		_ = pr.remove()
		return ProcessInfo{}, ErrSessionEnded
	}
	cmd := sandbox.Cmd{Command: command, Env: req.Env, PTY: req.PTY}
	if k, ok := sandbox.As[sandbox.Keeper](sb); ok && k.Keeps() && sp.dir != "" && (req.PTY == nil || keepsPTY(sb)) {
		cmd.Keep = pr.keep // it outlives this gateway: a next one takes it back
	} else {
		pr.keep = ""
	}
	// Recorded before it starts too: a gateway that dies meanwhile leaves
	// the next one a record to take the process back by (or show it ended).
	if err := pr.save(); err != nil {
		sp.cfg.Log.Warn("process_record_failed", "session", sp.id, "process", id, "err", err)
	}
	p, err := s.Start(sctx, cmd, gateway.StartOptions{Resume: true, Record: true, Source: "rest", ProcessID: id})
	if err != nil {
		_ = pr.remove()
		if cmd.Keep != "" {
			// The init may have started it and kept it while its reply
			// was lost (a timeout): it would run on with no record.
			if k, ok := sandbox.As[sandbox.Keeper](sb); ok {
				go killKept(k, cmd.Keep, sp.cfg.Log)
			}
		}
		if errors.Is(err, sandbox.ErrClosed) {
			return ProcessInfo{}, ErrSessionEnded
		}
		return ProcessInfo{}, fmt.Errorf("start process: %w", err)
	}
	pr.p = p
	if pp, ok := p.(sandbox.PIDer); ok {
		pr.info.PID = pp.PID()
	}
	if err := pr.save(); err != nil {
		sp.cfg.Log.Warn("process_record_failed", "session", sp.id, "process", id, "err", err)
	}
	sp.mu.Lock()
	sp.starting--
	started = true
	if sp.closed {
		sp.mu.Unlock()
		p.Kill()
		go func() { _, _ = p.Wait(); sandbox.Ack(p) }()
		_ = pr.remove()
		sp.ps.uncharge(sp.tenant, pr)
		if sp.dir != "" {
			_ = os.RemoveAll(sp.dir) // end removed it before this process's output made it again
		}
		return ProcessInfo{}, ErrSessionEnded
	}
	sp.procs[id] = pr
	sp.mu.Unlock()
	go pr.run()
	sp.cfg.Log.Info("process_started", "session", sp.id, "process", id, "pid", pr.info.PID, "kept", pr.keep != "")
	return pr.Info(), nil
}

// keepsPTY reports whether sb keeps processes on a terminal too.
func keepsPTY(sb sandbox.Sandbox) bool {
	k, ok := sandbox.As[sandbox.PTYKeeper](sb)
	return ok && k.KeepsPTY()
}

// killKept ends kept process key, if the sandbox keeps one: a start that
// failed may have left it running with no record.
func killKept(k sandbox.Keeper, key string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p, err := k.Reattach(ctx, key)
	if err != nil {
		if !errors.Is(err, sandbox.ErrNotKept) {
			log.Warn("process_orphan_kill_failed", "keep", key, "err", err)
		}
		return
	}
	log.Warn("process_orphan_killed", "keep", key)
	p.Kill()
	_ = p.Stdin().Close()
	for _, r := range []io.ReadCloser{p.Stdout(), p.Stderr()} {
		if r != nil {
			go func() { _, _ = io.Copy(io.Discard, r) }()
		}
	}
	_, _ = p.Wait()
	sandbox.Ack(p)
	for _, r := range []io.ReadCloser{p.Stdout(), p.Stderr()} {
		if r != nil {
			_ = r.Close()
		}
	}
}

// reserve charges pr's output cap to the session's tenant, first
// forgetting the tenant's oldest finished processes (in any of its
// sessions) when the tenant's bound needs it.
func (sp *sessionProcs) reserve(pr *Process) error {
	for {
		if sp.ps.charge(sp.tenant, pr, sp.cfg.OutputCap, sp.cfg.TenantOutputBytes) {
			return nil
		}
		old := sp.ps.dropOldestFinished(sp.tenant)
		if old == nil {
			return refusal(fmt.Errorf("%w (%d bytes per tenant, %d per process)", ErrOutputLimit, sp.cfg.TenantOutputBytes, sp.cfg.OutputCap),
				"process_output_limit", "; wait for a running process to end, or end a session")
		}
		old.discard()
	}
}

// dropOldestFinished takes the finished process of tenant that ended
// first out of its session's list; nil when there is none.
func (ps *Processes) dropOldestFinished(tenant string) *Process {
	ps.mu.Lock()
	var mine []*sessionProcs
	for _, sp := range ps.sessions {
		if sp.tenant == tenant {
			mine = append(mine, sp)
		}
	}
	ps.mu.Unlock()
	for {
		var from *sessionProcs
		var oldest *Process
		for _, sp := range mine {
			sp.mu.Lock()
			if len(sp.finished) > 0 {
				if p := sp.finished[0]; oldest == nil || p.endedAtTime().Before(oldest.endedAtTime()) {
					from, oldest = sp, p
				}
			}
			sp.mu.Unlock()
		}
		if from == nil {
			return nil
		}
		from.mu.Lock()
		if len(from.finished) > 0 && from.finished[0] == oldest {
			from.finished = from.finished[1:]
			delete(from.procs, oldest.info.ProcessID)
			from.mu.Unlock()
			return oldest
		}
		from.mu.Unlock() // it changed meanwhile: look again
	}
}

// endedAtTime is when the process ended (zero while it runs).
func (pr *Process) endedAtTime() time.Time {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.endedAt
}

// charge sets pr's charge to n when its tenant's total stays within limit
// (limit <= 0: always); it reports whether it did.
func (ps *Processes) charge(tenant string, pr *Process, n, limit int64) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	total := ps.charged[tenant] - pr.charge + n
	if limit > 0 && n > pr.charge && total > limit {
		return false
	}
	if ps.charged == nil {
		ps.charged = map[string]int64{}
	}
	ps.charged[tenant], pr.charge = total, n
	if total == 0 {
		delete(ps.charged, tenant)
	}
	return true
}

// uncharge drops pr's charge.
func (ps *Processes) uncharge(tenant string, pr *Process) { ps.charge(tenant, pr, 0, 0) }

// Charged is the output the tenant's processes count against its bound
// now.
func (ps *Processes) Charged(tenant string) int64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.charged[tenant]
}

// discard frees a process dropped from its session's list: its output,
// its record and its charge.
func (pr *Process) discard() {
	if err := pr.remove(); err != nil {
		pr.sp.cfg.Log.Warn("process_output_remove_failed", "session", pr.sp.id, "process", pr.info.ProcessID, "err", err)
	}
	pr.sp.ps.uncharge(pr.sp.tenant, pr)
}

// remove removes the process's output and record (and its directory).
func (pr *Process) remove() error {
	var errs []error
	pr.saveMu.Lock()
	pr.dropped = true
	pr.saveMu.Unlock()
	if pr.dir != "" {
		if err := os.Remove(filepath.Join(pr.dir, recordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if pr.out != nil {
		errs = append(errs, pr.out.Remove())
	} else if pr.dir != "" {
		if err := os.Remove(pr.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// session returns s's processes, registering them to end with s, and
// taking back what a gateway before a restart left of them (restore).
func (ps *Processes) session(s *gateway.Session, cfg ProcessConfig) (*sessionProcs, error) {
	ps.mu.Lock()
	if sp, ok := ps.sessions[s.ID]; ok {
		ps.mu.Unlock()
		return sp, nil
	}
	cfg = cfg.withDefaults()
	sp := &sessionProcs{ps: ps, id: s.ID, tenant: s.Tenant, cfg: cfg, procs: map[string]*Process{}, seq: ps.lastSeq[s.ID],
		s: s, gone: make(chan struct{})}
	if cfg.StateDir != "" {
		if !sandbox.ValidID(s.ID) {
			ps.mu.Unlock()
			return nil, fmt.Errorf("session id %q cannot name a directory", s.ID)
		}
		sp.dir = filepath.Join(cfg.StateDir, s.ID)
		sp.disk = newSessionDisk(s)
	}
	remove, ok := s.AddConn(func() { ps.end(sp, s.Live()) })
	if !ok {
		ps.mu.Unlock()
		return nil, ErrSessionEnded
	}
	sp.remove = remove
	offCk, offFork := s.OnCheckpoint(sp.letGo), s.OnForkCheckpoint(sp.letGo)
	sp.offCheckpoint = func() { offCk(); offFork() }
	if ps.sessions == nil {
		ps.sessions = map[string]*sessionProcs{}
	}
	ps.sessions[s.ID] = sp
	// Held while the processes are taken back, so that no call sees the
	// session's list half made: restores are quick (a connection to the
	// init each).
	sp.mu.Lock()
	ps.mu.Unlock()
	defer sp.mu.Unlock()
	if sp.dir != "" {
		sp.restore(s)
	}
	return sp, nil
}

// end kills a session's processes and frees their output: the session
// ended, or stopped (then its process numbers go on after the resume).
func (ps *Processes) end(sp *sessionProcs, stopped bool) {
	sp.mu.Lock()
	if !sp.closed && sp.gone != nil {
		close(sp.gone)
		sp.offCheckpoint()
	}
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
		p.discard()
		p.mu.Lock()
		proc := p.p
		p.mu.Unlock()
		if proc != nil {
			proc.Kill()
		}
	}
	if sp.dir != "" && !stopped {
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
				pr.capture(stream, buf[:n])
			}
			if err != nil {
				return
			}
		}
	}
	pr.mu.Lock()
	proc := pr.p
	pr.mu.Unlock()
	pr.armLimit(proc)
	stdout, stderr := proc.Stdout(), proc.Stderr()
	pumps.Add(1)
	go pump(stdout, Stdout)
	if stderr != nil {
		pumps.Add(1)
		go pump(stderr, Stderr)
	}
	exit, err := proc.Wait()
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
	end := pr.out.End() // all it read is stored
	pr.mu.Lock()
	released := pr.released
	pr.ending = !released // from here a pause does not let go of it
	if released && pr.relDone != nil && !pr.relStored {
		pr.relEnd, pr.relStored = end, true
		close(pr.relDone)
	}
	pr.mu.Unlock()
	if released {
		// Let go of for a pause by checkpoint: not its end. Its output
		// waits in its pipes, and its exit with the init.
		go pr.takeBack()
		return
	}
	if err != nil {
		exit = sandbox.Exit{Signal: "KILL"}
	}
	// Its output is all in: from here it counts what it keeps, before a
	// client can see it ended (one that starts another at once, as the
	// tenant's bound asks, must find the room freed).
	pr.sp.settle(pr)
	pr.mu.Lock()
	pr.holdLimitLocked()
	pr.running, pr.exit, pr.endedAt = false, exit, time.Now().UTC()
	pr.stdinClosed = true
	pr.mu.Unlock()
	pr.out.Close()
	if err := pr.save(); err != nil {
		pr.sp.cfg.Log.Warn("process_record_failed", "session", pr.sp.id, "process", pr.info.ProcessID, "err", err)
	} else {
		// Only now may a keeping sandbox forget the process: a gateway
		// that died before this leaves the exit, and the output not yet
		// stored, to the next one.
		sandbox.Ack(proc)
	}
	// Filed before Done: a caller woken by Done lists the process among
	// the finished, in the order they ended (and the oldest beyond the cap
	// already dropped).
	pr.sp.finish(pr)
	close(pr.done)
}

// capture keeps p, written by stream, in the process's output. When the
// session's disk quota has no room (or its workspace grew past what is
// left), the output of the session's finished processes is dropped
// first, oldest first; when that is not enough, the output is
// truncated: what it kept stays, and what the process writes from then
// on is read and not kept (the process runs on). A failing disk loses
// output too, not the process.
func (pr *Process) capture(stream Stream, p []byte) {
	sp := pr.sp
	if sp.disk != nil {
		sp.disk.refresh()
		// The workspace's files grew into what output keeps: the output
		// of finished processes goes first.
		for sp.disk.over() && sp.dropFinishedOutput() {
		}
	}
	for {
		n, err := pr.out.write(stream, p)
		p = p[n:]
		if !errors.Is(err, ErrNoRoom) {
			return
		}
		if sp.dropFinishedOutput() {
			continue
		}
		pr.out.Truncate(TruncatedDiskFull)
		_, _ = pr.out.write(stream, p) // counted as discarded
		sp.cfg.Log.Warn("process_output_truncated", "session", sp.id, "process", pr.info.ProcessID,
			"reason", TruncatedDiskFull, "kept", pr.out.End())
		if err := pr.save(); err != nil {
			sp.cfg.Log.Warn("process_record_failed", "session", sp.id, "process", pr.info.ProcessID, "err", err)
		}
		return
	}
}

// dropFinishedOutput drops the output kept by the session's finished
// process that ended first and still keeps some, freeing its room in the
// session's disk quota (and its tenant's bound); the process stays
// listed, its output read as dropped. False when no finished process
// keeps output.
func (sp *sessionProcs) dropFinishedOutput() bool {
	sp.mu.Lock()
	var old *Process
	for _, p := range sp.finished {
		if p.out.Stored() > 0 {
			old = p
			break
		}
	}
	sp.mu.Unlock()
	if old == nil {
		return false
	}
	freed := old.out.DropKept()
	sp.ps.charge(sp.tenant, old, 0, 0)
	if err := old.save(); err != nil {
		sp.cfg.Log.Warn("process_record_failed", "session", sp.id, "process", old.info.ProcessID, "err", err)
	}
	sp.cfg.Log.Info("process_output_dropped", "session", sp.id, "process", old.info.ProcessID, "reason", "disk_quota", "bytes", freed)
	return true
}

// settle charges pr, whose output is all in, what it keeps rather than
// what it might, unless its session has let it go.
func (sp *sessionProcs) settle(pr *Process) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.closed && sp.procs[pr.info.ProcessID] == pr {
		sp.ps.charge(sp.tenant, pr, pr.out.Stored(), 0)
	}
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
	// Finished, it counts what it keeps, no longer what it might.
	sp.ps.charge(sp.tenant, pr, pr.out.Stored(), 0)
	var drop []*Process
	for len(sp.finished) > sp.cfg.MaxFinished {
		drop = append(drop, sp.finished[0])
		delete(sp.procs, sp.finished[0].info.ProcessID)
		sp.finished = sp.finished[1:]
	}
	sp.mu.Unlock()
	for _, d := range drop {
		d.discard()
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
	info.OutputTruncated, info.OutputDiscardedBytes = pr.out.Truncated()
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
	err := pr.onProc(context.Background(), func(p sandbox.Process) error { return p.Signal(sig) })
	if err != nil {
		if !pr.isRunning() || errors.Is(err, syscall.ESRCH) {
			return ErrProcessExited
		}
		if _, ok := gateway.AsError(err); ok {
			return err
		}
		return fmt.Errorf("signal process: %w", err)
	}
	return nil
}

// PTY reports whether the process runs on a pseudo-terminal
// (StartRequest.PTY).
func (pr *Process) PTY() bool { return pr.pty }

// Resize sets the size of the process's terminal; an error for a process
// without one, ErrProcessExited once it ended.
func (pr *Process) Resize(w sandbox.Window) error {
	if !pr.pty {
		return newClientError("the process has no terminal", gateway.KindInvalid, "invalid_field", "the process has no terminal to resize")
	}
	if !pr.isRunning() {
		return ErrProcessExited
	}
	err := pr.onProc(context.Background(), func(p sandbox.Process) error { return p.Resize(w) })
	if err != nil {
		if !pr.isRunning() {
			return ErrProcessExited
		}
		if _, ok := gateway.AsError(err); ok {
			return err
		}
		return fmt.Errorf("resize terminal: %w", err)
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
	// A process let go of for a pause is waited for (proc) before its
	// input's lock is taken, not under it: a write waiting for the take
	// back would hold up every other write, and make the next pause a
	// freeze (release cannot let go of it).
	var p sandbox.Process
	for {
		pr.mu.Lock()
		running, closed := pr.running, pr.stdinClosed
		pr.mu.Unlock()
		switch {
		case !running:
			return 0, ErrProcessExited
		case closed:
			return 0, ErrStdinClosed
		}
		if _, err := pr.proc(ctx); err != nil {
			return 0, err
		}
		pr.stdinMu.Lock()
		pr.mu.Lock()
		released := pr.released
		p = pr.p
		pr.mu.Unlock()
		if !released {
			break
		}
		pr.stdinMu.Unlock() // let go of again meanwhile: wait again
	}
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
	w := p.Stdin()
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
		if err := pr.save(); err != nil { // a next gateway knows it too
			pr.sp.cfg.Log.Warn("process_record_failed", "session", pr.sp.id, "process", pr.info.ProcessID, "err", err)
		}
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

// recordFile is a process's record in its directory, so that a gateway
// after a restart knows it again.
const recordFile = "process.json"

// sessionFile is a session's record in its directory: its tenant and the
// last process number given.
const sessionFile = "session.json"

// processRecord is what process.json holds.
type processRecord struct {
	Info ProcessInfo `json:"info"`
	// Keep is the key a keeping sandbox knows it by ("" for one that
	// ends with the gateway).
	Keep string `json:"keep,omitempty"`
	// StdinClosed says the client closed its input (eof).
	StdinClosed bool `json:"stdinClosed,omitempty"`
	// PTY says it runs on a terminal (StartRequest.PTY).
	PTY bool `json:"pty,omitempty"`
	// OutputTruncated and OutputDiscarded: the output stopped being
	// kept (OutputLog.Truncate), and what was not kept since.
	OutputTruncated string `json:"outputTruncated,omitempty"`
	OutputDiscarded int64  `json:"outputDiscarded,omitempty"`
	// OutputEnd is the output's end offset when it was saved: a
	// finished process whose output was dropped (DropKept) keeps its
	// offsets.
	OutputEnd int64         `json:"outputEnd,omitempty"`
	Ended     bool          `json:"ended,omitempty"`
	Exit      *sandbox.Exit `json:"exit,omitempty"`
	EndedAt   time.Time     `json:"endedAt,omitzero"`
	// TimeLeftMs is what is left of a handed-over command's timeout, in
	// running time (Process.limitLeft; 0: none).
	TimeLeftMs int64 `json:"timeLeftMs,omitempty"`
}

type sessionRecord struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
}

// save writes the process's record (nothing in memory).
func (pr *Process) save() error {
	if pr.dir == "" {
		return nil
	}
	pr.saveMu.Lock()
	defer pr.saveMu.Unlock()
	if pr.dropped {
		return nil
	}
	rec := processRecord{Info: pr.info, Keep: pr.keep, PTY: pr.pty}
	if pr.out != nil {
		rec.OutputTruncated, rec.OutputDiscarded = pr.out.Truncated()
		rec.OutputEnd = pr.out.End()
	}
	pr.mu.Lock()
	rec.StdinClosed = pr.stdinClosed
	if left := pr.limitNowLocked(); left > 0 {
		rec.TimeLeftMs = max(left.Milliseconds(), 1)
	}
	if !pr.running {
		exit := pr.exit
		rec.Ended, rec.Exit, rec.EndedAt = true, &exit, pr.endedAt
	}
	pr.mu.Unlock()
	return writeJSONFile(filepath.Join(pr.dir, recordFile), rec)
}

// saveSeq records the session's last process number.
func (sp *sessionProcs) saveSeq(seq int) error {
	if err := os.MkdirAll(sp.dir, 0o700); err != nil {
		return fmt.Errorf("process state: %w", err)
	}
	sp.seqMu.Lock()
	defer sp.seqMu.Unlock()
	if seq <= sp.savedSeq {
		return nil
	}
	if err := writeJSONFile(filepath.Join(sp.dir, sessionFile), sessionRecord{Tenant: sp.tenant, Seq: seq}); err != nil {
		return err
	}
	sp.savedSeq = seq
	return nil
}

// writeJSONFile replaces path with v as JSON, atomically.
func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("process state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("process state: %w", err)
	}
	return nil
}

// restore takes back what a gateway before a restart left in the
// session's directory: its process numbers, its finished processes with
// their output, and its running ones, re-attached through the sandbox
// (sandbox.Keeper) with their output going on at the offset it had. A
// running process the sandbox did not keep (the workdir driver, or an
// init that predates keeping) ended with that gateway: it is shown
// killed. sp.mu is held.
func (sp *sessionProcs) restore(s *gateway.Session) {
	var srec sessionRecord
	if b, err := os.ReadFile(filepath.Join(sp.dir, sessionFile)); err == nil && json.Unmarshal(b, &srec) == nil {
		sp.seq = max(sp.seq, srec.Seq)
		sp.savedSeq = srec.Seq
	}
	entries, err := os.ReadDir(sp.dir)
	if err != nil {
		return
	}
	var keeper sandbox.Keeper
	if sb := s.Sandbox(); sb != nil {
		keeper, _ = sandbox.As[sandbox.Keeper](sb)
	}
	var finished []*Process
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		pr, err := sp.restoreOne(filepath.Join(sp.dir, e.Name()), keeper)
		if errors.Is(err, errReattachLater) {
			// It may well run on: its record stays, and it is taken back
			// later.
			sp.cfg.Log.Warn("process_reattach_deferred", "session", sp.id, "process", e.Name(), "err", err)
			if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "p")); err == nil {
				sp.seq = max(sp.seq, n)
			}
			go sp.reattachLater(filepath.Join(sp.dir, e.Name()), keeper, reattachRetry)
			continue
		}
		if err != nil {
			sp.cfg.Log.Warn("process_restore_failed", "session", sp.id, "process", e.Name(), "err", err)
			_ = os.RemoveAll(filepath.Join(sp.dir, e.Name()))
			continue
		}
		if n, err := strconv.Atoi(strings.TrimPrefix(pr.info.ProcessID, "p")); err == nil {
			sp.seq = max(sp.seq, n)
		}
		sp.procs[pr.info.ProcessID] = pr
		if sp.disk != nil {
			pr.out.SetQuota(sp.disk)
		}
		if pr.running {
			sp.ps.charge(sp.tenant, pr, sp.cfg.OutputCap, 0)
			if pr.released {
				go pr.takeBack()
				continue
			}
			go pr.run()
			sp.cfg.Log.Info("process_reattached", "session", sp.id, "process", pr.info.ProcessID, "offset", pr.out.End())
		} else {
			sp.ps.charge(sp.tenant, pr, pr.out.Stored(), 0)
			finished = append(finished, pr)
		}
	}
	slices.SortFunc(finished, func(a, b *Process) int { return a.endedAt.Compare(b.endedAt) })
	sp.finished = finished
	for len(sp.finished) > sp.cfg.MaxFinished {
		old := sp.finished[0]
		sp.finished = sp.finished[1:]
		delete(sp.procs, old.info.ProcessID)
		old.discard()
	}
}

// errReattachLater: a kept process could not be taken back for a reason
// other than its being gone (sandbox.ErrNotKept); it may run on.
var errReattachLater = errors.New("the kept process could not be taken back now")

// reattachRetry is the first wait before a deferred reattach is tried
// again; it doubles up to a minute.
const reattachRetry = 5 * time.Second

// reattachLater retries restoreOne for dir, which errReattachLater
// deferred, until it is taken back, found gone, or the session ends.
func (sp *sessionProcs) reattachLater(dir string, keeper sandbox.Keeper, delay time.Duration) {
	for ; ; delay = min(2*delay, time.Minute) {
		time.Sleep(delay)
		sp.mu.Lock()
		if sp.closed {
			sp.mu.Unlock()
			return
		}
		pr, err := sp.restoreOne(dir, keeper)
		switch {
		case errors.Is(err, errReattachLater):
			sp.mu.Unlock()
			if errors.Is(err, sandbox.ErrPaused) {
				// Its session is paused (the try failed at once): try
				// again every reattachRetry, to take it back soon after
				// the resume, however long the pause.
				delay = reattachRetry / 2
			}
			continue
		case err != nil:
			sp.cfg.Log.Warn("process_restore_failed", "session", sp.id, "process", filepath.Base(dir), "err", err)
			_ = os.RemoveAll(dir)
			sp.mu.Unlock()
			return
		}
		if sp.disk != nil {
			pr.out.SetQuota(sp.disk)
		}
		switch {
		case pr.running:
			sp.procs[pr.info.ProcessID] = pr
			sp.ps.charge(sp.tenant, pr, sp.cfg.OutputCap, 0)
			if pr.released {
				go pr.takeBack()
				break
			}
			go pr.run()
			sp.cfg.Log.Info("process_reattached", "session", sp.id, "process", pr.info.ProcessID, "offset", pr.out.End())
		default:
			sp.procs[pr.info.ProcessID] = pr
			sp.ps.charge(sp.tenant, pr, pr.out.Stored(), 0)
			sp.finished = append(sp.finished, pr)
			for len(sp.finished) > sp.cfg.MaxFinished {
				old := sp.finished[0]
				sp.finished = sp.finished[1:]
				delete(sp.procs, old.info.ProcessID)
				old.discard()
			}
		}
		sp.mu.Unlock()
		return
	}
}

// restoreOne reads one process's directory back. A record that
// contradicts itself is refused as corrupt.
func (sp *sessionProcs) restoreOne(dir string, keeper sandbox.Keeper) (*Process, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return nil, fmt.Errorf("no record (a start cut short): %w", err)
	}
	var rec processRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("process record: %w", err)
	}
	if rec.Info.ProcessID != filepath.Base(dir) {
		return nil, fmt.Errorf("process record names %q", rec.Info.ProcessID)
	}
	if rec.Keep != "" && rec.Keep != "process/"+rec.Info.ProcessID {
		return nil, fmt.Errorf("corrupt process record: it keeps %q", rec.Keep)
	}
	if rec.Ended && rec.Exit == nil {
		return nil, errors.New("corrupt process record: ended with no exit")
	}
	out, err := OpenOutputLog(dir, sp.cfg.OutputCap)
	if err != nil {
		return nil, err
	}
	pr := &Process{sp: sp, out: out, dir: dir, keep: rec.Keep, pty: rec.PTY, info: rec.Info, done: make(chan struct{}),
		limitLeft: time.Duration(max(rec.TimeLeftMs, 0)) * time.Millisecond}
	if rec.OutputTruncated != "" {
		out.restoreTruncated(rec.OutputTruncated, rec.OutputDiscarded)
	}
	out.restoreEnd(rec.OutputEnd)
	if rec.Ended {
		pr.exit, pr.endedAt, pr.stdinClosed = *rec.Exit, rec.EndedAt, true
		out.Close()
		close(pr.done)
		return pr, nil
	}
	var p sandbox.Process
	err = sandbox.ErrNotKept
	if keeper != nil && rec.Keep != "" {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		p, err = keeper.Reattach(ctx, rec.Keep)
		cancel()
	}
	if errors.Is(err, sandbox.ErrPaused) && sp.s != nil {
		// Its session is paused (by checkpoint, its init gone until the
		// resume): listed as running, it is taken back once the session
		// runs again (takeBack).
		pr.running, pr.stdinClosed, pr.released, pr.back = true, rec.StdinClosed, true, make(chan struct{})
		// What the gateway before read of it is all stored: a fork of
		// the paused session copies that (checkpointEnds).
		pr.relDone, pr.relEnd, pr.relStored = make(chan struct{}), out.End(), true
		close(pr.relDone)
		return pr, nil
	}
	if err != nil && !errors.Is(err, sandbox.ErrNotKept) {
		out.Close()
		return nil, fmt.Errorf("%w: %w", errReattachLater, err)
	}
	if err != nil {
		// It ended with the gateway before this one.
		sp.cfg.Log.Warn("process_lost", "session", sp.id, "process", rec.Info.ProcessID, "err", err)
		pr.exit, pr.endedAt, pr.stdinClosed = sandbox.Exit{Signal: "KILL"}, time.Now().UTC(), true
		out.Close()
		close(pr.done)
		if err := pr.save(); err != nil {
			sp.cfg.Log.Warn("process_record_failed", "session", sp.id, "process", rec.Info.ProcessID, "err", err)
		}
		return pr, nil
	}
	pr.p, pr.running, pr.stdinClosed = p, true, rec.StdinClosed
	return pr, nil
}

// Restore takes back, at a gateway's start, the processes a gateway
// before it left under cfg.StateDir: each directory's session is looked
// up (session(id, tenant); nil when it is gone or not this gateway's) and
// its processes restored; the directories of sessions gone (known(id)
// false) are removed.
func (ps *Processes) Restore(cfg ProcessConfig, known func(id string) bool, session func(id, tenant string) *gateway.Session) {
	if cfg.StateDir == "" {
		return
	}
	entries, err := os.ReadDir(cfg.StateDir)
	if err != nil {
		return
	}
	log := cfg.withDefaults().Log
	for _, e := range entries {
		dir := filepath.Join(cfg.StateDir, e.Name())
		var srec sessionRecord
		b, err := os.ReadFile(filepath.Join(dir, sessionFile))
		if err == nil {
			err = json.Unmarshal(b, &srec)
		}
		if e.IsDir() && sandbox.ValidID(e.Name()) && known(e.Name()) && errors.Is(err, os.ErrNotExist) {
			continue // no processes, only what else the session keeps here (kernels)
		}
		var s *gateway.Session
		if err == nil && e.IsDir() && sandbox.ValidID(e.Name()) {
			s = session(e.Name(), srec.Tenant)
		}
		if s == nil || !s.Live() {
			if err := os.RemoveAll(dir); err != nil {
				log.Warn("process_output_remove_failed", "session", e.Name(), "err", err)
			}
			continue
		}
		if _, err := ps.session(s, cfg); err != nil {
			log.Warn("process_restore_failed", "session", e.Name(), "err", err)
		}
	}
}

// Fork gives session dst, a fork of session src, src's background
// processes: dst's sandbox holds copies of src's kept processes, under the
// same keys, so their records and the output kept so far are copied and
// taken back as after a gateway restart; each goes on with the output its
// copy makes. Without cfg.StateDir (processes not kept) dst has none.
func (ps *Processes) Fork(cfg ProcessConfig, src string, dst *gateway.Session) error {
	if cfg.StateDir == "" || !sandbox.ValidID(src) || !sandbox.ValidID(dst.ID) {
		return nil
	}
	from, to := filepath.Join(cfg.StateDir, src), filepath.Join(cfg.StateDir, dst.ID)
	if _, err := os.Stat(filepath.Join(from, sessionFile)); err != nil {
		return nil // src never had a background process
	}
	// A process let go of for the checkpoint has the output it had then
	// (checkpointEnds).
	ends := ps.checkpointEnds(src)
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		end, cut := ends[e.Name()]
		switch {
		case e.Name() == sessionFile:
			if err := copyFile(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return err
			}
		case e.IsDir() && cut:
			if err := copyProcessAt(filepath.Join(from, e.Name()), filepath.Join(to, e.Name()), end); err != nil {
				return err
			}
		case e.IsDir():
			if err := copyDir(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return err
			}
		}
	}
	_, err = ps.session(dst, cfg)
	return err
}

// copyDir copies the regular files of directory from into a new
// directory to.
func copyDir(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.Mkdir(to, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := copyFile(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyProcessAt copies process directory from into a new directory to
// as the process was when its output ended at end and it ran (a fork's
// checkpoint): its output up to end, and its record saying so.
func copyProcessAt(from, to string, end int64) error {
	b, err := os.ReadFile(filepath.Join(from, recordFile))
	if err != nil {
		return err
	}
	var rec processRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("process record: %w", err)
	}
	// It ran at the checkpoint, its output where it was then: what the
	// source saw since (its end too) is not the fork's.
	rec.OutputEnd = min(rec.OutputEnd, end)
	rec.Ended, rec.Exit, rec.EndedAt = false, nil, time.Time{}
	if err := os.Mkdir(to, 0o700); err != nil {
		return err
	}
	if err := writeJSONFile(filepath.Join(to, recordFile), rec); err != nil {
		return err
	}
	return copyOutputUpTo(from, to, end)
}

// copyFile copies file from to a new file to (0600).
func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// tenantOf is s's tenant, when s is a gateway session.
func tenantOf(s Session) string {
	if gs, ok := s.(*gateway.Session); ok {
		return gs.Tenant
	}
	return ""
}

// recorded lists the names that records of kind (a file name prefix:
// "shell-", "kernel-") carry in session id's directory under dir.
func recorded(dir, id, kind string) []string {
	if dir == "" || !sandbox.ValidID(id) {
		return nil
	}
	entries, _ := os.ReadDir(filepath.Join(dir, id))
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutPrefix(e.Name(), kind); ok && e.Type().IsRegular() && !strings.HasSuffix(name, ".tmp") {
			names = append(names, name)
		}
	}
	return names
}

// RecordedTenant is the tenant that session id's records under dir name
// ("" when none does).
func RecordedTenant(dir, id string) string {
	if dir == "" || !sandbox.ValidID(id) {
		return ""
	}
	var rec struct {
		Tenant string `json:"tenant"`
	}
	sdir := filepath.Join(dir, id)
	files := []string{sessionFile}
	for _, kind := range []string{"shell-", "kernel-"} {
		for _, name := range recorded(dir, id, kind) {
			files = append(files, kind+name)
		}
	}
	for _, f := range files {
		if b, err := os.ReadFile(filepath.Join(sdir, f)); err == nil && json.Unmarshal(b, &rec) == nil && rec.Tenant != "" {
			return rec.Tenant
		}
	}
	return ""
}
