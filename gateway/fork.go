package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/sandbox"
)

// A fork copies a running session, its processes and their memory
// included: the sandbox is checkpointed once (sandbox.Checkpointer; the
// linux driver under serve --checkpoint, through CRIU) and each new
// session is restored from that checkpoint, with a copy of the workspace
// as it was then. The source runs on. Each fork is a session as a create
// makes one: its own id, password, uid range, cgroups, egress proxy and
// secret bindings, with the source's settings (docs/fork.md).

// MaxForkCount bounds the sessions one fork makes.
const MaxForkCount = 8

// MaxConcurrentForks bounds the forks under way on the gateway at once
// (each a CRIU dump of a session's memory and workspace to the data dir,
// then up to MaxForkCount restores at once); past it, a fork is refused
// (503 fork_gateway_limit).
const MaxConcurrentForks = 2

// forkRemovalWait bounds how long a fork waits for a slot that a fork
// already answered holds until its images are removed (some 10 ms).
const forkRemovalWait = 5 * time.Second

// ForkedSession is one session a fork made, and its SSH password (shown
// once, as a create's).
type ForkedSession struct {
	Session  *Session
	Password string
	// From is the source session's id.
	From string
}

// forkSource is what a fork's creates take from the source (Manager.create).
type forkSource struct {
	src *Session
	ck  sandbox.Checkpoint
}

// restore makes a fork's sandbox from the checkpoint.
func (f *forkSource) restore(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return f.ck.Restore(ctx, spec)
}

// shareCA gives s the source's egress CA, if it has one: the fork's trust
// store is the source's, restored with its /etc. The CA's key stays the
// gateway's.
func (f *forkSource) shareCA(s *Session) error {
	if f.src.egressCAPEM == nil {
		return nil
	}
	ca, err := egress.ParseCA(f.src.egressCAPEM, f.src.egressCAKey)
	if err != nil {
		return &Error{Kind: KindInternal, Code: "egress_failed", Message: "could not share the source's egress CA", Err: err}
	}
	s.egressCA, s.egressCAPEM, s.egressCAKey = ca, f.src.egressCAPEM, f.src.egressCAKey
	return nil
}

// Fork makes count new sessions of p from p's running session id, each a
// copy of it as it was at one instant: processes, memory and workspace.
// The source keeps running (a paused one is resumed first, but for one
// paused by checkpoint: forked from its images, it stays paused). Each fork
// has the source's image, resources, TTL, metadata, environment, egress
// policy and secrets; bound secrets are bound again to the fork's own
// egress proxy, never copied. The forks count towards the tenant's quota.
// When one cannot be made, those already made are deleted.
func (m *Manager) Fork(ctx context.Context, p Principal, id string, count int) ([]ForkedSession, error) {
	if count < 1 || count > MaxForkCount {
		return nil, Invalid("invalid_count", fmt.Sprintf("count must be between 1 and %d, got %d", MaxForkCount, count))
	}
	src, err := m.Get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	ckr, ok := sandbox.As[sandbox.Checkpointer](src.sandbox)
	if !ok {
		return nil, Invalid("fork_unsupported", "this gateway cannot fork sessions: it needs the linux sandbox driver and serve --checkpoint (CRIU)")
	}
	if !m.takeForkSlot(ctx) {
		return nil, &Error{Kind: KindUnavailable, Code: "fork_gateway_limit",
			Message: fmt.Sprintf("this gateway runs %d forks already, as many as it may at once; try again later", MaxConcurrentForks)}
	}
	// The slot is the fork's until its images are removed, which may be
	// after the answer (below).
	release := true
	defer func() {
		if release {
			m.forking.Add(-1)
		}
	}()
	switch src.Status() {
	case StatusStopped:
		return nil, &Error{Kind: KindConflict, Code: "session_stopped", Message: "the session is stopped: it has no process to fork; resume it first"}
	case StatusPaused:
		// One paused by checkpoint is forked from its images, and stays
		// paused; a frozen one is resumed first.
		if !src.checkpointPaused() {
			// Wake: under src.life, once, whatever else resumes it.
			if err := src.Wake(ctx); err != nil {
				return nil, err
			}
		}
	case StatusRunning:
	default:
		return nil, &Error{Kind: KindConflict, Code: "session_not_running", Message: "the session is not running"}
	}
	// The fork's trace times its steps; its creates, which run at once,
	// mark none of theirs in it.
	tr := sandbox.TraceOf(ctx)
	ctx = sandbox.WithTrace(ctx, nil)
	start := time.Now()
	// Held to write while the checkpoint is made: no stop, no start,
	// and what the gateway let go of for it (below) is taken back only
	// once it is made (Session.Resumed waits for s.life).
	src.life.Lock()
	if src.Status() == StatusRunning {
		// As a pause by checkpoint does: the background processes whose
		// output the gateway reads are let go of (OnForkCheckpoint), so
		// that the output a fork copies ends where the dump's copy of
		// their pipes begins (dataplane Processes.Fork). Kernels and
		// shells keep theirs: the dump holds their connections.
		src.letGoForFork()
	}
	ck, err := ckr.Checkpoint(ctx)
	src.life.Unlock()
	if err != nil {
		m.log.ErrorContext(ctx, "session_fork_failed", "session", src.ID, "tenant", p.Tenant, "err", err)
		switch {
		case errors.Is(err, sandbox.ErrNoCheckpoint):
			return nil, Invalid("fork_unsupported", err.Error())
		case errors.Is(err, sandbox.ErrPaused):
			return nil, ErrPaused
		}
		return nil, &Error{Kind: KindUnavailable, Code: "fork_failed", Message: "could not checkpoint the session", Err: err}
	}
	checkpointed := time.Since(start)
	// The images are deleted before the answer when the fork fails, and
	// right after it when it succeeds (a 100 MiB kernel's images take
	// some 10 ms to delete), the fork's slot held until then and Shutdown
	// waiting for it.
	closeCk := func() time.Duration {
		t := time.Now()
		if err := ck.Close(); err != nil {
			m.log.Error("checkpoint_remove_failed", "session", src.ID, "err", err)
		}
		return time.Since(t)
	}
	later := false
	defer func() {
		if !later {
			closeCk() // idempotent
		}
	}()
	cp := forkParams(src)
	from := &forkSource{src: src, ck: ck}
	// The restores run at once: each is a create of its own.
	out := make([]ForkedSession, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			s, pw, err := m.create(ctx, p, cp, from)
			if err != nil {
				errs[i] = err
				return
			}
			m.auditSession(ctx, s, "forked", "from "+src.ID, "")
			out[i] = ForkedSession{Session: s, Password: pw, From: src.ID}
		})
	}
	wg.Wait()
	created := time.Since(start) - checkpointed
	if err := errors.Join(errs...); err != nil {
		made := 0
		for _, f := range out {
			if f.Session == nil {
				continue
			}
			made++
			if derr := m.Delete(context.WithoutCancel(ctx), p, f.Session.ID); derr != nil {
				m.log.Error("session_fork_rollback_failed", "session", f.Session.ID, "err", derr)
			}
		}
		m.log.ErrorContext(ctx, "session_fork_failed", "session", src.ID, "tenant", p.Tenant, "made", made, "err", err)
		for _, e := range errs { // the first failure's own error, for its code
			if e != nil {
				return nil, e
			}
		}
	}
	tr.Add("checkpoint", checkpointed)
	tr.Add("restores", created)
	total := time.Since(start)
	logForked := func(closed time.Duration) {
		m.log.InfoContext(ctx, "session_forked", "session", src.ID, "tenant", p.Tenant, "count", count,
			"checkpoint_ms", checkpointed.Milliseconds(), "restores_ms", created.Milliseconds(), "remove_ms", closed.Milliseconds(),
			"ms", total.Milliseconds())
	}
	if !m.releaseLater() { // shutting down: before the answer
		logForked(closeCk())
		return out, nil
	}
	later, release = true, false
	m.forkMu.Lock()
	m.forkRemoving++
	m.forkMu.Unlock()
	go func() {
		defer m.released.Done()
		logForked(closeCk())
		m.forkRemoved()
	}()
	return out, nil
}

// forkRemoved frees the slot of a fork answered once its images are
// removed, and wakes the forks waiting for one (takeForkSlot).
func (m *Manager) forkRemoved() {
	m.forking.Add(-1)
	m.forkMu.Lock()
	defer m.forkMu.Unlock()
	m.forkRemoving--
	if m.forkFreed != nil {
		close(m.forkFreed)
		m.forkFreed = nil
	}
}

// takeForkSlot takes one of the MaxConcurrentForks slots; false when the
// forks under way hold them all. A slot held only for the removal of an
// answered fork's images (after its answer) is waited for, up to
// forkRemovalWait: a client is not refused for a fork it saw done.
func (m *Manager) takeForkSlot(ctx context.Context) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		m.forkMu.Lock()
		removing := m.forkRemoving
		if m.forkFreed == nil {
			m.forkFreed = make(chan struct{})
		}
		freed := m.forkFreed
		m.forkMu.Unlock()
		if m.forking.Add(1) <= MaxConcurrentForks {
			return true
		}
		m.forking.Add(-1)
		if removing == 0 {
			return false
		}
		if timer == nil {
			timer = time.NewTimer(forkRemovalWait)
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return false
		case <-timer.C:
			return false
		}
	}
}

// forkParams are the create parameters of a fork of src.
func forkParams(src *Session) CreateParams {
	snap := src.Snapshot()
	cp := CreateParams{
		TTL: snap.TTL, Image: src.Image, Metadata: maps.Clone(src.Metadata), SSHPublicKey: src.SSHPublicKey,
		Secrets: src.Secrets, Env: maps.Clone(src.Env), SecretScope: src.secretScope,
	}
	src.mu.Lock()
	cp.Egress, cp.EgressMode = append([]string(nil), src.egressAllow...), src.egressMode
	src.mu.Unlock()
	if r := src.Resources; r != nil {
		req := &ResourceRequest{}
		if r.MemoryMiB != 0 {
			req.MemoryMiB = &r.MemoryMiB
		}
		if r.CPUs != 0 {
			req.CPUs = &r.CPUs
		}
		if r.Pids != 0 {
			req.Pids = &r.Pids
		}
		if r.DiskMiB != 0 {
			req.DiskMiB = &r.DiskMiB
		}
		cp.Resources = req
	}
	return cp
}
