package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// MaxHistory is how many commands a session remembers.
const MaxHistory = 1000

// CommandRecord is one command a session ran, over SSH exec or REST, as
// GET /v1/sessions/{id}/commands lists it.
type CommandRecord struct {
	Command    string    `json:"command"`
	Source     string    `json:"source"` // "ssh" or "rest"
	Shell      string    `json:"shell,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	DurationMs int64     `json:"durationMs"`
	// ExitCode is the exit status; nil while the command runs or when a
	// signal ended it (ExitSignal).
	ExitCode   *int   `json:"exitCode"`
	ExitSignal string `json:"exitSignal,omitempty"`
	TimedOut   bool   `json:"timedOut,omitempty"`
	BytesOut   int64  `json:"bytesOut"` // stdout and stderr together
	// ProcessID is a background process's id, for the audit trail.
	ProcessID string `json:"-"`
}

// history is a session's ring of recent commands.
type history struct {
	mu   sync.Mutex
	recs []CommandRecord // oldest first, at most MaxHistory
}

func (h *history) add(r CommandRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recs) == MaxHistory {
		copy(h.recs, h.recs[1:])
		h.recs = h.recs[:MaxHistory-1]
	}
	h.recs = append(h.recs, r)
}

// History returns the session's recent commands, oldest first.
func (s *Session) History() []CommandRecord {
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	return append([]CommandRecord(nil), s.hist.recs...)
}

// RecordCommand adds r to the session's history, records it in the audit
// trail and counts it. Every command of the history comes through here:
// those a caller records itself, and those its Start records
// (StartOptions.Record) when they end.
func (s *Session) RecordCommand(ctx context.Context, r CommandRecord) {
	s.recordCommand(ctx, r, time.Duration(r.DurationMs)*time.Millisecond)
}

// recordCommand is RecordCommand with the command's duration to the
// nanosecond, for the metrics.
func (s *Session) recordCommand(ctx context.Context, r CommandRecord, d time.Duration) {
	s.hist.add(r)
	s.reportCommand(ctx, r, d)
}

// reportCommand is the part of recordCommand after the history: the
// audit event and the metrics.
func (s *Session) reportCommand(ctx context.Context, r CommandRecord, d time.Duration) {
	s.auditCommand(ctx, r)
	if s.metrics != nil {
		s.metrics.CommandDone(r.Source, d)
	}
}

// recorded wraps a started exec so that its end is recorded.
type recorded struct {
	sandbox.Process
	s      *Session
	ctx    context.Context // the start's, for the audit (values only)
	rec    CommandRecord
	out    atomic.Int64
	stdout io.ReadCloser
	stderr io.ReadCloser
	once   sync.Once

	// With deferred (ReportLater), Wait adds the command to the history
	// only and keeps in report what its end still owes (the audit event
	// and the metrics) for the function ReportLater returned.
	deferred atomic.Bool
	report   func()
	// released says the process was let go of (Release): its Wait
	// returning is not its end.
	released atomic.Bool
	// ended says its end is in the history (Wait saw it before a
	// Release: Reattached then records it no more).
	ended atomic.Bool
}

// record returns p wrapped to record command, from source, in s's history
// when it ends.
func (s *Session) record(ctx context.Context, command string, o StartOptions, p sandbox.Process) sandbox.Process {
	r := &recorded{Process: p, s: s, ctx: context.WithoutCancel(ctx), rec: CommandRecord{Command: command, Source: o.Source,
		ProcessID: o.ProcessID, StartedAt: time.Now().UTC()}}
	r.track()
	return r
}

// heldCommandsMax bounds how many commands heldCommands names.
const heldCommandsMax = 5

// heldCommands names the recorded commands under way (a pause that could
// not checkpoint says which), "" when none: each by its source, its
// process id when it has one, its command (cut at 60 bytes) and how long
// it has run.
func (s *Session) heldCommands() string {
	s.mu.Lock()
	recs := make([]CommandRecord, 0, len(s.cmds))
	for r := range s.cmds {
		if !r.released.Load() {
			recs = append(recs, r.rec)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(recs, func(a, b CommandRecord) int { return a.StartedAt.Compare(b.StartedAt) })
	var parts []string
	for i, r := range recs {
		if i == heldCommandsMax {
			parts = append(parts, fmt.Sprintf("and %d more", len(recs)-i))
			break
		}
		cmd := r.Command
		if len(cmd) > 60 {
			cmd = cmd[:60] + "…"
		}
		what := r.Source + " command"
		if r.ProcessID != "" {
			what = r.Source + " process " + r.ProcessID
		}
		parts = append(parts, fmt.Sprintf("%s %q (running %s)", what, cmd, time.Since(r.StartedAt).Round(time.Second)))
	}
	return strings.Join(parts, "; ")
}

// Release passes a kept process's release through (sandbox.Releaser):
// the process runs on, so its end is not recorded here; Reattached wraps
// the process taken back, which records it.
func (r *recorded) Release() {
	rel, ok := r.Process.(sandbox.Releaser)
	if !ok {
		return
	}
	r.released.Store(true)
	r.untrack()
	rel.Release()
}

// KeepAs passes a hand-over through (sandbox.KeepLater): once the
// sandbox keeps the process it runs on, so its end is not recorded here
// (Wait returns sandbox.ErrHandedOff); Reattached wraps the process taken
// back, which records it.
func (r *recorded) KeepAs(ctx context.Context, key string) error {
	kl, ok := r.Process.(sandbox.KeepLater)
	if !ok {
		return errors.ErrUnsupported
	}
	if err := kl.KeepAs(ctx, key); err != nil {
		return err
	}
	r.released.Store(true)
	r.untrack()
	return nil
}

// untrack removes r from its session's commands under way.
func (r *recorded) untrack() {
	r.s.mu.Lock()
	delete(r.s.cmds, r)
	r.s.mu.Unlock()
}

// Reattached is p, a kept process taken back (sandbox.Keeper.Reattach)
// after old was let go of (sandbox.Releaser), recorded as old was: its
// end goes in the session's history once, with its whole output counted.
// It is p as it is when old was not recorded, or its end is recorded
// already (it ended just before it was let go of).
func Reattached(old, p sandbox.Process) sandbox.Process {
	o, ok := old.(*recorded)
	if !ok || !o.released.Load() || o.ended.Load() {
		return p
	}
	r := &recorded{Process: p, s: o.s, ctx: o.ctx, rec: o.rec}
	r.out.Store(o.out.Load())
	r.track()
	return r
}

// track counts r's output as it is read and adds r to its session's
// commands under way.
func (r *recorded) track() {
	r.stdout = countReader{r.Process.Stdout(), &r.out}
	if e := r.Process.Stderr(); e != nil {
		r.stderr = countReader{e, &r.out}
	}
	r.s.mu.Lock()
	if r.s.cmds == nil {
		r.s.cmds = map[*recorded]struct{}{}
	}
	r.s.cmds[r] = struct{}{}
	r.s.mu.Unlock()
}

// PID passes the wrapped process's pid through (sandbox.PIDer): the
// embedded interface does not carry the method; 0 when it has none.
func (r *recorded) PID() int {
	if p, ok := r.Process.(sandbox.PIDer); ok {
		return p.PID()
	}
	return 0
}

// Ack passes a kept process's acknowledgement through (sandbox.Acker).
func (r *recorded) Ack() { sandbox.Ack(r.Process) }

func (r *recorded) Stdout() io.ReadCloser { return r.stdout }
func (r *recorded) Stderr() io.ReadCloser { return r.stderr }

func (r *recorded) Wait() (sandbox.Exit, error) {
	exit, err := r.Process.Wait()
	if r.released.Load() || errors.Is(err, sandbox.ErrHandedOff) {
		return exit, err
	}
	r.untrack()
	r.once.Do(func() {
		r.ended.Store(true)
		rec := r.rec
		rec.DurationMs = time.Since(rec.StartedAt).Milliseconds()
		rec.BytesOut = r.out.Load()
		if err == nil {
			if exit.Signal != "" {
				rec.ExitSignal = exit.Signal
			} else {
				code := exit.Code
				rec.ExitCode = &code
			}
		}
		d := time.Since(rec.StartedAt)
		if r.deferred.Load() {
			r.s.hist.add(rec)
			r.report = func() { r.s.reportCommand(r.ctx, rec, d) }
			return
		}
		r.s.recordCommand(r.ctx, rec, d)
	})
	return exit, err
}

// ReportLater takes the audit event and the metrics of p's end off its
// Wait, for a caller that answers its client first (an SSH exec sends its
// exit status, then reports): p's Wait still adds the command to the
// session's history before it returns, and the returned function, called
// once Wait has returned, records the rest. For a process Start did not
// record (StartOptions.Record), the function does nothing. Call it before
// Wait.
func ReportLater(p sandbox.Process) (report func()) {
	r, ok := p.(*recorded)
	if !ok {
		return func() {}
	}
	r.deferred.Store(true)
	return func() {
		f := r.report // set by Wait, which has returned
		r.report = nil
		if f != nil {
			f()
		}
	}
}

type countReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// SyscallConn passes the stream's descriptor through (syscall.Conn): the
// reader of a command's output asks it how much is still buffered.
func (c countReader) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.ReadCloser.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}
