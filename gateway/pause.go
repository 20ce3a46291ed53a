package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// A paused session (StatusPaused) keeps its processes exactly where they
// were, with their memory, but they take no CPU (sandbox.Pauser; linuxns
// freezes the sandbox's cgroups: docs/pause.md). Manager.Pause pauses
// it; Manager.Unpause, or the next use of it (a process started through
// Session.Start, a REST data-plane call, a CONNECT, a preview or a
// forwarded port: Session.Wake), lets it run again. Like a stopped one it
// counts as live, keeps its place in the quotas, and its TTL and idle
// limit still run. It stays paused across a gateway restart.

// ConnClosedPaused is the reason given to connections that a pause ends.
// It goes out before the pause is sure (under --checkpoint, before the
// dump, which the connection's processes must not hold up), so it says
// the pause is under way: one that then fails leaves the session
// running, and the next connection finds it so.
const ConnClosedPaused = "the session is being paused: this connection ends (its commands get SIGHUP, as when a connection drops); the session's other processes wait where they are, and the next connection or call resumes them"

// ErrPaused is the answer of a call that a pause ended (a REST data-plane
// call in flight when the session was paused: the context that
// AddPausedCall gives ends with it as its cause), or that met a paused
// sandbox (sandbox.ErrPaused). The next call resumes the session.
var ErrPaused = &Error{Kind: KindConflict, Code: "session_paused",
	Message: "the session was paused during the call: its processes wait where they are; call again to resume it"}

// AddPausedCall is AddPausedConn for a call in flight (a REST data-plane
// call): a pause ends the context it returns, with ErrPaused as its
// cause, so that the call ends, and answers so, instead of waiting on a
// frozen sandbox. An end or a stop of the session does not end it (the
// call then ends as the sandbox's processes do). remove unregisters it
// (the call is over); ok is false when the session has ended already.
func (s *Session) AddPausedCall(ctx context.Context) (callCtx context.Context, remove func(), ok bool) {
	callCtx, cancel := context.WithCancelCause(ctx)
	unreg, ok := s.addConn(&connEntry{close: func() { cancel(ErrPaused) }, paused: true, pauseOnly: true})
	return callCtx, func() { unreg(); cancel(nil) }, ok
}

// PausedCause reports whether ctx (AddPausedCall's) ended because the
// session was paused.
func PausedCause(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), ErrPaused)
}

// PauseNoticeWait bounds how long a pause waits for its notices
// (AddPauseNotice) before it closes the connections.
const PauseNoticeWait = 500 * time.Millisecond

// PauseResult is a pause's answer: the session, and what the pause did.
type PauseResult struct {
	Session *Session
	Report  sandbox.PauseReport
	// Handed are the commands under way that the pause handed to the
	// process API (handoff.go): they run on as background processes,
	// kept across the checkpoint.
	Handed []HandedOff
}

// Pause pauses p's session id. Pausing a paused session does nothing but
// answer. A stopped session cannot be paused (session_stopped): it has no
// process; a failed one is session_not_running.
func (m *Manager) Pause(ctx context.Context, p Principal, id string) (*PauseResult, error) {
	s, err := m.Get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.pause(ctx, s, p.Tenant, nil)
}

// errNotIdle is an idle pause's answer for a session used since the
// reaper chose it.
var errNotIdle = errors.New("the session is in use again")

// pause pauses s; by says who asked (a tenant, or "idle" for the reaper).
// still, when set, is asked once s.life is held whether the pause is
// still wanted (the reaper's: is s still idle?); if not, the pause
// answers errNotIdle and nothing is paused.
func (m *Manager) pause(ctx context.Context, s *Session, by string, still func() bool) (*PauseResult, error) {
	pa, ok := sandbox.As[sandbox.Pauser](s.sandbox)
	if !ok || s.sandbox == nil {
		return nil, Invalid("pause_unsupported", "this sandbox driver cannot pause sessions")
	}
	s.life.Lock()
	defer s.life.Unlock()
	// A call that took hold of s after the reaper chose it (Hold, then
	// Wake, which waits for s.life) keeps it running.
	if still != nil && !still() {
		return nil, errNotIdle
	}
	switch status := s.Status(); status {
	case StatusRunning, StatusPaused:
	case StatusStopped:
		return nil, &Error{Kind: KindConflict, Code: "session_stopped", Message: "the session is stopped: it has no process to pause"}
	case StatusFailed:
		return nil, errNotRunning()
	default:
		return nil, ErrNotFound // ended since the lookup
	}
	tried := false
	var handed []HandedOff
	if cp, ok := sandbox.As[sandbox.CheckpointPauser](s.sandbox); ok && cp.CanCheckpointPause() && s.Status() == StatusRunning {
		tried = true
		// The connections a pause ends go first, their processes with
		// them (an SSH shell or exec gets SIGHUP, as when a connection
		// drops), so that the dump does not find them holding the
		// sandbox (the driver waits a little for them: linuxns
		// PauseConnWait); then the kept processes are let go of. The
		// commands under way on those connections (an SSH exec) are
		// handed to the process API first: they run on, kept.
		handed = m.handOff(context.WithoutCancel(ctx), s)
		s.closeForPause()
		s.letGoForCheckpoint()
	}
	start := time.Now()
	rep, err := pa.Pause(context.WithoutCancel(ctx))
	if err == nil && tried && rep.Method != PauseCheckpoint {
		if held := s.heldCommands(); held != "" {
			rep.NotKept = append(rep.NotKept, "commands under way at the pause, which keep their connection to the gateway: "+held)
		}
	}
	if err != nil {
		m.log.Error("sandbox_pause_failed", "session", s.ID, "err", err)
		if errors.Is(err, sandbox.ErrClosed) {
			return nil, ErrNotFound
		}
		return nil, &Error{Kind: KindInternal, Code: "sandbox_failed", Message: "could not pause the sandbox", Err: err}
	}
	if !s.markPaused() { // paused already: nothing closed, nothing to record
		return &PauseResult{Session: s, Report: rep, Handed: handed}, nil
	}
	if rep.Method == PauseCheckpoint {
		// Its network namespace went with its processes: the egress
		// proxy opens again in the restored one (unpause).
		s.closeProxy()
	}
	if err := m.putManaged(s); err != nil {
		return nil, err
	}
	m.log.InfoContext(ctx, "session_paused", "session", s.ID, "tenant", s.Tenant, "by", by, "method", rep.Method,
		"resident_bytes", rep.ResidentBytes, "ms", time.Since(start).Milliseconds())
	m.auditSession(ctx, s, "paused", "", by)
	return &PauseResult{Session: s, Report: rep, Handed: handed}, nil
}

// Unpause lets p's paused session id run again. Unpausing a running
// session does nothing; a stopped one is session_stopped.
func (m *Manager) Unpause(ctx context.Context, p Principal, id string) (*Session, error) {
	s, err := m.Get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	switch s.Status() {
	case StatusRunning, StatusPaused:
	case StatusStopped:
		return nil, &Error{Kind: KindConflict, Code: "session_stopped", Message: "the session is stopped, not paused: start a process in it to start it again"}
	case StatusFailed:
		return nil, errNotRunning()
	default:
		return nil, ErrNotFound
	}
	if err := s.Wake(ctx); err != nil {
		if errors.Is(err, sandbox.ErrClosed) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	return s, nil
}

// markPaused makes a running session paused: its connections from
// outside close (AddPausedConn: the processes they talk to no longer run,
// and a client would wait forever), while its kernels, shells and
// background processes (AddConn) stay, paused with it. It reports false
// when the session was not running.
func (s *Session) markPaused() bool {
	s.mu.Lock()
	if s.status != StatusRunning {
		s.mu.Unlock()
		return false
	}
	s.status = StatusPaused
	s.mu.Unlock()
	s.closeForPause()
	return true
}

// closeForPause closes the connections a pause ends (AddPausedConn), each
// told first (AddPauseNotice).
func (s *Session) closeForPause() {
	s.mu.Lock()
	var notices, closing []*connEntry
	for e := range s.conns {
		switch {
		case e.notice:
			notices = append(notices, e)
		case e.paused:
			closing = append(closing, e)
		default:
			continue
		}
		delete(s.conns, e)
	}
	s.mu.Unlock()
	// The notices first (a client whose window is full must not hold the
	// pause up: each runs on its own, for PauseNoticeWait at most), then
	// the connections they travel on.
	done := make(chan struct{}, len(notices))
	for _, e := range notices {
		go func() { e.close(); done <- struct{}{} }()
	}
	wait := time.NewTimer(PauseNoticeWait)
	defer wait.Stop()
	for range notices {
		select {
		case <-done:
			continue
		case <-wait.C:
		}
		break
	}
	for _, e := range closing {
		e.close()
	}
}

// Resumed returns a channel closed once s runs again: at once when it
// is not paused (a pause, or a fork's checkpoint, under way is waited
// for), else at its next
// resume, or its end. A process the gateway let go of for a pause by
// checkpoint (OnCheckpoint) waits on it to be taken back.
func (s *Session) Resumed() <-chan struct{} {
	s.life.RLock()
	defer s.life.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status != StatusPaused {
		c := make(chan struct{})
		close(c)
		return c
	}
	if s.resumed == nil {
		s.resumed = make(chan struct{})
	}
	return s.resumed
}

// WhileRunning calls fn if s runs, under its lifecycle lock held to
// read (as Start does), so that no pause, stop or fork's checkpoint runs
// meanwhile; it reports whether it called fn. fn must not wait on s's
// lifecycle (a Start, a Wake). A process the gateway let go of for a
// pause by checkpoint is taken back so.
func (s *Session) WhileRunning(fn func()) bool {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.Status() != StatusRunning {
		return false
	}
	fn()
	return true
}

// wakeResumedLocked closes Resumed's channel; s.mu is held.
func (s *Session) wakeResumedLocked() {
	if s.resumed != nil {
		close(s.resumed)
		s.resumed = nil
	}
}

// Wake lets a paused session run again before it is used (a CONNECT, a
// REST data-plane call, a preview, a forwarded port): it returns at once
// for a session that is not paused. Many first calls unpause it once.
//
// It reads the status under s.life: a pause holds s.life from before its
// freeze until the status says paused, so a call that comes meanwhile
// waits for it and then resumes the session, instead of going on into a
// frozen sandbox while the status still says running.
func (s *Session) Wake(ctx context.Context) error {
	s.life.RLock()
	paused := s.Status() == StatusPaused
	s.life.RUnlock()
	if !paused {
		return nil
	}
	s.life.Lock()
	defer s.life.Unlock()
	return s.unpauseLocked(ctx)
}

// unpauseLocked unpauses s if it is paused; s.life is held to write.
func (s *Session) unpauseLocked(ctx context.Context) error {
	if s.Status() != StatusPaused {
		return nil
	}
	if s.unpause == nil {
		return sandbox.ErrStopped
	}
	return s.unpause(ctx)
}

// unpause lets paused session s run again; s.life is held. It is the
// session's unpause (own).
func (m *Manager) unpause(ctx context.Context, s *Session) error {
	pa, ok := sandbox.As[sandbox.Pauser](s.sandbox)
	if !ok {
		return sandbox.ErrStopped
	}
	start := time.Now()
	if err := pa.Unpause(ctx); err != nil {
		m.log.Error("sandbox_unpause_failed", "session", s.ID, "err", err)
		if errors.Is(err, sandbox.ErrClosed) {
			return err
		}
		return &Error{Kind: KindUnavailable, Code: "sandbox_failed", Message: "could not resume the paused session", Err: err}
	}
	s.mu.Lock()
	resumed := s.status == StatusPaused
	if resumed {
		s.status = StatusRunning
		s.wakeResumedLocked()
	}
	s.mu.Unlock()
	if !resumed {
		return sandbox.ErrClosed
	}
	if s.needsProxy() && s.egressProxy() == nil { // restored from a checkpoint: a new network namespace
		if err := m.openProxy(ctx, s); err != nil {
			m.log.Error("egress_proxy_failed", "session", s.ID, "err", err)
		}
	}
	if err := m.putManaged(s); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "session_unpaused", "session", s.ID, "tenant", s.Tenant, "ms", time.Since(start).Milliseconds())
	m.auditSession(ctx, s, "unpaused", "", "")
	return nil
}

// PauseCheckpoint is the pause method (sandbox.PauseReport.Method) of a
// sandbox checkpointed to disk, its processes ended (linuxns with
// serve --checkpoint): it has no network namespace until it is resumed.
const PauseCheckpoint = "checkpoint"

// pauseMethoder is implemented by sandboxes that say how they are paused
// ("" when not paused; linuxns).
type pauseMethoder interface{ PauseMethod() string }

// checkpointPaused reports whether s's sandbox is paused by checkpoint.
func (s *Session) checkpointPaused() bool {
	pm, ok := sandbox.As[pauseMethoder](s.sandbox)
	return ok && pm.PauseMethod() == PauseCheckpoint
}

// OnCheckpoint registers fn, which a pause that may checkpoint the
// session's sandbox calls first (s.life held): fn lets go of the kept
// processes it holds (sandbox.Releaser), to take them back by key once
// the session runs again, and reports whether it did (false: busy; it
// keeps them, and the pause is then a freeze). remove unregisters it.
// The REST data plane's kernels use it.
func (s *Session) OnCheckpoint(fn func() bool) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ckHooks == nil {
		s.ckHooks = map[*func() bool]struct{}{}
	}
	s.ckHooks[&fn] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.ckHooks, &fn)
		s.mu.Unlock()
	}
}

// OnForkCheckpoint registers fn, which a fork of the running session
// calls before its checkpoint (s.life held): fn lets go of what the
// gateway reads from the session's processes (the background processes'
// output: dataplane), so that a fork's copy of it ends where the dump's
// copy of their pipes begins, to take it back once the checkpoint is made
// (WhileRunning). remove unregisters it.
func (s *Session) OnForkCheckpoint(fn func() bool) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forkHooks == nil {
		s.forkHooks = map[*func() bool]struct{}{}
	}
	s.forkHooks[&fn] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.forkHooks, &fn)
		s.mu.Unlock()
	}
}

// letGoForFork calls the OnForkCheckpoint hooks.
func (s *Session) letGoForFork() {
	s.mu.Lock()
	hooks := make([]func() bool, 0, len(s.forkHooks))
	for fn := range s.forkHooks {
		hooks = append(hooks, *fn)
	}
	s.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
}

// letGoForCheckpoint calls the OnCheckpoint hooks.
func (s *Session) letGoForCheckpoint() {
	s.mu.Lock()
	hooks := make([]func() bool, 0, len(s.ckHooks))
	for fn := range s.ckHooks {
		hooks = append(hooks, *fn)
	}
	s.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
}

// Idle actions (Config.IdleAction): what the reaper does to a session
// idle for Config.IdleTimeout.
const (
	IdleExpire = "expire" // it expires (is deleted), the default
	IdlePause  = "pause"  // it is paused in place, and expires once paused for Config.PausedTTL
)

// canPause reports whether s's sandbox can be paused.
func (s *Session) canPause() bool {
	_, ok := sandbox.As[sandbox.Pauser](s.sandbox)
	return ok && s.sandbox != nil
}

// restorePaused makes the status of re-attached session s and its
// sandbox agree after a restart: a paused session's sandbox stays paused
// (a crash between the freeze and the record pauses it again), and a
// sandbox paused when the gateway went down makes its session paused.
// It reports whether the status changed.
func (m *Manager) restorePaused(ctx context.Context, s *Session) bool {
	pa, ok := sandbox.As[sandbox.Pauser](s.sandbox)
	if !ok {
		if s.status == StatusPaused { // a driver that cannot pause never paused it
			s.status = StatusRunning
			return true
		}
		return false
	}
	switch {
	case s.status == StatusPaused && !pa.Paused():
		if _, err := pa.Pause(ctx); err != nil {
			m.log.Error("sandbox_pause_failed", "session", s.ID, "err", err)
			s.status = StatusRunning
			return true
		}
	case s.status == StatusRunning && pa.Paused():
		s.status = StatusPaused
		m.log.Warn("session_paused", "session", s.ID, "reason", "its sandbox was paused when the gateway went down")
		return true
	}
	return false
}
