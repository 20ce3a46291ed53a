package dataplane

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// A pause by checkpoint (docs/pause.md) cannot hand the gateway's pipes
// to a background process back after the restore: before the dump the
// gateway lets go of each running kept process (letGo, an OnCheckpoint
// hook, as kernels and shells do), which runs on, kept by the sandbox's
// init under its key, its output waiting in its pipes and its exit with
// the init. Once the session runs again, takeBack takes it back
// (sandbox.Keeper.Reattach, as after a gateway restart) and its output
// goes on at the offset it had: no byte lost or read twice.

// letGo lets go of the session's running kept processes before a pause
// that may checkpoint the sandbox. It reports false when one could not
// be let go of (not kept, a PTY, or a write to its input under way): it
// then holds the sandbox, and the pause is a freeze.
func (sp *sessionProcs) letGo() bool {
	sp.mu.Lock()
	sp.ckGen++
	gen := sp.ckGen
	procs := make([]*Process, 0, len(sp.procs))
	for _, pr := range sp.procs {
		procs = append(procs, pr)
	}
	sp.mu.Unlock()
	ok := true
	for _, pr := range procs {
		if !pr.release(gen) {
			ok = false
		}
	}
	return ok
}

// release lets go of pr if it runs, for the checkpoint letGo's call gen
// comes before: false when it cannot.
func (pr *Process) release(gen int) bool {
	if !pr.stdinMu.TryLock() {
		return false // a write to its input under way
	}
	defer pr.stdinMu.Unlock()
	pr.mu.Lock()
	if pr.running && pr.released {
		// Still let go of (not yet taken back since a pause): its
		// output, not read since, ends where it did for this checkpoint
		// too.
		pr.relGen = gen
		pr.mu.Unlock()
		return true
	}
	if !pr.running || pr.ending || pr.p == nil {
		pr.mu.Unlock()
		return true
	}
	r, ok := pr.p.(sandbox.Releaser)
	if !ok || pr.keep == "" {
		pr.mu.Unlock()
		return false
	}
	pr.released, pr.back = true, make(chan struct{})
	pr.relGen, pr.relDone, pr.relStored = gen, make(chan struct{}), false
	limited := pr.limitTimer != nil
	pr.holdLimitLocked()
	pr.mu.Unlock()
	if limited {
		// What is left of its limit outlives this gateway too.
		if err := pr.save(); err != nil {
			pr.sp.cfg.Log.Warn("process_record_failed", "session", pr.sp.id, "process", pr.info.ProcessID, "err", err)
		}
	}
	// Its readers stop (run then sees it released, and takes it back
	// once the session runs), and its control connection closes.
	r.Release()
	pr.sp.cfg.Log.Info("process_released", "session", pr.sp.id, "process", pr.info.ProcessID, "offset", pr.out.End())
	return true
}

// releasedWait bounds how long a call on a process let go of (its input,
// a signal, a resize) waits for it to be taken back once the session runs
// again.
const releasedWait = 30 * time.Second

// errNotTakenBack answers a call on a process let go of for a pause that
// was not taken back within releasedWait of the call (the sandbox's init
// did not hand it back yet): 503, to be tried again.
var errNotTakenBack = &clientError{err: errors.New("the process was not taken back after the session's pause"),
	api: gateway.Error{Kind: gateway.KindUnavailable, Code: "process_unavailable", RetryAfter: time.Second,
		Message: "the process is not yet taken back after the session's pause; try again"}}

// proc is pr's process, waiting (at most releasedWait, or until ctx
// ends) for it to be taken back when it was let go of for a pause.
func (pr *Process) proc(ctx context.Context) (sandbox.Process, error) {
	pr.mu.Lock()
	p, released, back := pr.p, pr.released, pr.back
	pr.mu.Unlock()
	if !released {
		return p, nil
	}
	t := time.NewTimer(releasedWait)
	defer t.Stop()
	select {
	case <-back:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, errNotTakenBack
	case <-pr.sp.gone:
		return nil, ErrSessionEnded
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pr.running {
		return nil, ErrProcessExited
	}
	return pr.p, nil
}

// onProc calls fn with pr's process (proc). When fn fails because the
// process was let go of meanwhile (a pause's release raced the call: its
// control connection or terminal closed under fn), it waits for the
// process to be taken back and calls fn again, rather than answer the
// failure of a process that runs on. It answers what proc answers
// (errNotTakenBack, ErrSessionEnded, ErrProcessExited) as they are.
func (pr *Process) onProc(ctx context.Context, fn func(sandbox.Process) error) error {
	for range 3 {
		p, err := pr.proc(ctx)
		if err != nil {
			return err
		}
		if p == nil {
			return ErrProcessExited
		}
		err = fn(p)
		if err == nil {
			return nil
		}
		pr.mu.Lock()
		raced := pr.released || pr.p != p
		pr.mu.Unlock()
		if !raced {
			return err
		}
	}
	return errNotTakenBack
}

// takeBack takes pr, let go of for a pause, back once its session runs
// again, and reads it on (run). A process the init no longer keeps ended
// with its processes (a failed restore): it is recorded killed.
func (pr *Process) takeBack() {
	sp := pr.sp
	delay := 100 * time.Millisecond
	for {
		select {
		case <-sp.s.Resumed():
		case <-sp.gone:
			return
		}
		select {
		case <-sp.gone: // the session ended (Resumed says so too)
			return
		default:
		}
		// Under the session's lifecycle lock (WhileRunning): no pause, and
		// no fork's checkpoint, finds the process taken back half way (a
		// connection the init just opened, which the dump cannot hold).
		var (
			p    sandbox.Process
			err  = errNotRunningNow
			done bool
		)
		sp.s.WhileRunning(func() {
			sb := sp.s.Sandbox()
			var keeper sandbox.Keeper
			if sb != nil {
				keeper, _ = sandbox.As[sandbox.Keeper](sb)
			}
			if keeper == nil {
				err = sandbox.ErrNotKept
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
			p, err = keeper.Reattach(ctx, pr.keep)
			cancel()
			if err != nil {
				return
			}
			done = true
			sp.mu.Lock()
			closed := sp.closed
			sp.mu.Unlock()
			if closed {
				p.Kill()
				return
			}
			pr.mu.Lock()
			pr.p = gateway.Reattached(pr.p, p)
			pr.released = false
			close(pr.back)
			pr.mu.Unlock()
			sp.cfg.Log.Info("process_reattached", "session", sp.id, "process", pr.info.ProcessID, "offset", pr.out.End(), "after", "pause")
			go pr.run()
		})
		switch {
		case done:
			return
		case errors.Is(err, sandbox.ErrNotKept):
			pr.lost(err)
			return
		}
		// Paused again (or under way), or the init did not answer: try
		// again.
		if !errors.Is(err, sandbox.ErrPaused) && !errors.Is(err, errNotRunningNow) {
			sp.cfg.Log.Warn("process_reattach_deferred", "session", sp.id, "process", pr.info.ProcessID, "err", err)
		}
		select {
		case <-time.After(delay):
		case <-sp.gone:
			return
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// errNotRunningNow says takeBack found the session not running (paused
// again since it resumed, or ending).
var errNotRunningNow = errors.New("the session is not running")

// lost records pr, which the init no longer keeps, killed.
func (pr *Process) lost(err error) {
	sp := pr.sp
	sp.cfg.Log.Warn("process_lost", "session", sp.id, "process", pr.info.ProcessID, "err", err)
	pr.sp.settle(pr)
	pr.mu.Lock()
	pr.running, pr.exit, pr.endedAt = false, sandbox.Exit{Signal: "KILL"}, time.Now().UTC()
	pr.stdinClosed, pr.released = true, false
	close(pr.back)
	pr.mu.Unlock()
	pr.out.Close()
	if err := pr.save(); err != nil {
		sp.cfg.Log.Warn("process_record_failed", "session", sp.id, "process", pr.info.ProcessID, "err", err)
	}
	sp.finish(pr)
	close(pr.done)
}

// checkpointEnds is, for each process of session src that the gateway let
// go of for its last checkpoint (letGo), the end of the output it had
// read then: the rest was in its pipes, which the checkpoint holds. A
// fork made from that checkpoint copies the output up to there
// (Processes.Fork), not what the source read since, and goes on with
// what its copy of the pipes holds: nothing lost, nothing twice.
func (ps *Processes) checkpointEnds(src string) map[string]int64 {
	ps.mu.Lock()
	sp := ps.sessions[src]
	ps.mu.Unlock()
	if sp == nil {
		return nil
	}
	sp.mu.Lock()
	gen := sp.ckGen
	procs := make([]*Process, 0, len(sp.procs))
	for _, pr := range sp.procs {
		procs = append(procs, pr)
	}
	sp.mu.Unlock()
	ends := map[string]int64{}
	for _, pr := range procs {
		pr.mu.Lock()
		done, relGen := pr.relDone, pr.relGen
		pr.mu.Unlock()
		if done == nil || relGen != gen || gen == 0 {
			continue // not let go of for that checkpoint: copied whole
		}
		select {
		case <-done: // run stored what it had read (within drainGrace)
		case <-time.After(drainGrace + time.Second):
			continue
		}
		pr.mu.Lock()
		ends[pr.info.ProcessID] = pr.relEnd
		pr.mu.Unlock()
	}
	return ends
}

// ErrNotAdoptable says a command under way cannot be handed to the
// session's processes: they keep no output on disk (no state dir), so
// the sandbox would keep it for no gateway to take back.
var ErrNotAdoptable = errors.New("background processes are not kept on disk: a command under way cannot be handed over")

// Adopt takes a command under way that a pause by checkpoint hands over
// (gateway.Handoff, an SSH exec) into s's background processes, as if
// it had been started by POST /processes and then let go of for the
// pause (letGo): it gets the next id, a record and an output log (from
// the pause on: what the command wrote before went to its client), the
// sandbox keeps it under that id's key (h.Keep: its stdin closed), and it
// is taken back once the session runs again (takeBack): listed, its
// output readable, signals and wait working, its end recorded. It
// answers the process id. It runs under the pause's lifecycle lock, and
// does not wait on it.
func (ps *Processes) Adopt(s *gateway.Session, cfg ProcessConfig, h gateway.Handoff) (string, error) {
	sp, err := ps.session(s, cfg)
	if err != nil {
		return "", err
	}
	if sp.dir == "" {
		return "", ErrNotAdoptable
	}
	sp.mu.Lock()
	if sp.closed {
		sp.mu.Unlock()
		return "", ErrSessionEnded
	}
	if sp.running()+sp.starting >= sp.cfg.MaxRunning {
		sp.mu.Unlock()
		return "", fmt.Errorf("%w (at most %d)", ErrTooManyProcesses, sp.cfg.MaxRunning)
	}
	sp.seq++
	sp.starting++
	id := "p" + strconv.Itoa(sp.seq)
	seq := sp.seq
	sp.mu.Unlock()
	adopted := false
	defer func() {
		if !adopted {
			sp.mu.Lock()
			sp.starting--
			sp.mu.Unlock()
		}
	}()
	pr := &Process{
		sp: sp, done: make(chan struct{}), running: true, keep: "process/" + id, pty: h.PTY,
		// Its input was closed by the hand-over (EOF); one on a terminal
		// is typed on it (WriteStdin), as its client did.
		stdinClosed: !h.PTY, dir: filepath.Join(sp.dir, id),
		info:      ProcessInfo{ProcessID: id, PID: h.PID, Command: h.Command, StartedAt: h.StartedAt.UTC()},
		limitLeft: h.TimeLeft,
	}
	if err := sp.reserve(pr); err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		_ = pr.remove()
		sp.ps.uncharge(sp.tenant, pr)
		return "", err
	}
	if err := sp.saveSeq(seq); err != nil {
		return fail(err)
	}
	out, err := NewOutputLog(pr.dir, sp.cfg.OutputCap)
	if err != nil {
		return fail(err)
	}
	if sp.disk != nil {
		out.SetQuota(sp.disk)
	}
	pr.out = out
	// Recorded before it is kept: a gateway that dies from here on leaves
	// the next one a record to take it back by.
	if err := pr.save(); err != nil {
		return fail(err)
	}
	if err := h.Keep(pr.keep); err != nil {
		return fail(err)
	}
	pr.p = h.Process
	pr.released, pr.back = true, make(chan struct{})
	sp.mu.Lock()
	sp.starting--
	adopted = true
	closed := sp.closed
	if !closed {
		sp.procs[id] = pr
	}
	sp.mu.Unlock()
	if closed { // the session ended meanwhile: its sandbox went with it
		_ = pr.remove()
		sp.ps.uncharge(sp.tenant, pr)
		return "", ErrSessionEnded
	}
	go pr.takeBack()
	sp.cfg.Log.Info("process_adopted", "session", sp.id, "process", id, "pid", pr.info.PID, "source", h.Source)
	return id, nil
}
