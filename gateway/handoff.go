package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// A pause by checkpoint ends the connections from outside (CONNECT
// tunnels, so every SSH channel), but a command under way on one (an SSH
// exec: `ssh sg make`) is not ended with it: it is handed to the REST
// process API instead (docs/pause.md). Its owner (sshd) registers it
// (AddHandoff) while it runs; the pause, before it closes the
// connections, asks the sandbox to keep each (sandbox.KeepLater: its
// stdin closed, its output from then on waiting in its pipes) through the
// Manager's Adopter (dataplane.Processes.Adopt), which lists it as a
// background process with an id and a kept output log, and takes it back
// once the session runs again: it is checkpointed and restored with the
// rest, its output and exit readable, its signals working, its end in
// the history. The pause's answer lists them (PauseResult.Handed).

// HandoffEntry is a command under way that a pause by checkpoint may
// hand to the process API (AddHandoff).
type HandoffEntry struct {
	Command   string
	Source    string // "ssh"
	StartedAt time.Time
	PTY       bool
	// Process is the command's process as Session.Start returned it.
	Process sandbox.Process
	// Begin is called before the pause asks the sandbox to keep it; Done
	// after, with its process id, or "" when it was not handed over (it
	// ended first, or could not be kept: it then ends with its
	// connection, as before). Each pause that tries it calls both once:
	// a command not handed over that runs on (a REST command, whose pause
	// then was a freeze) is tried again by the next pause, so Done("")
	// may come any number of times; Done with an id comes at most once,
	// and no pause tries the entry after it.
	Begin func()
	Done  func(processID string)
	// Deadline is when the command's timeout ends it (zero: none, as an
	// SSH exec has): handed over, it keeps what is left as running time
	// (Handoff.TimeLeft).
	Deadline time.Time

	handed bool // Done had an id; guarded by the session's mu
}

// AddHandoff registers e while its command runs; remove unregisters it
// (it ended). ok is false when the session has ended.
func (s *Session) AddHandoff(e *HandoffEntry) (remove func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !live(s.status) {
		return func() {}, false
	}
	if s.handoffs == nil {
		s.handoffs = map[*HandoffEntry]struct{}{}
	}
	s.handoffs[e] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.handoffs, e)
		s.mu.Unlock()
	}, true
}

// Handoff is what an Adopter gets of a command handed over.
type Handoff struct {
	Command   string
	Source    string
	StartedAt time.Time
	PTY       bool
	PID       int // in the sandbox, 0 when unknown
	// TimeLeft is what was left of the command's timeout at the hand-over
	// (0: none): the Adopter ends it once it has run that much longer,
	// the time its session is paused not counted.
	TimeLeft time.Duration
	// Process is the command's process, to be taken back by key (its
	// Reattached wrapper records its end in the history).
	Process sandbox.Process
	// Keep asks the sandbox to keep the command under key (its stdin
	// closed); from its success on the Adopter owns it.
	Keep func(key string) error
}

// HandedOff names a command that a pause handed to the process API.
type HandedOff struct {
	ProcessID string `json:"processId"`
	Command   string `json:"command"`
	Source    string `json:"source"`
}

// Adopter takes handed-over command h into session s's background
// processes (dataplane.Processes.Adopt): it gives it an id and an output
// log, calls h.Keep with the key it takes it back by, and answers the id.
// It runs while a pause holds the session's lifecycle lock: it must not
// wait on it.
type Adopter func(s *Session, h Handoff) (processID string, err error)

// SetAdopter sets the Manager's Adopter (nil: none; a pause by checkpoint
// then ends the commands under way with their connections).
func (m *Manager) SetAdopter(a Adopter) {
	if a == nil {
		m.adopter.Store(nil)
		return
	}
	m.adopter.Store(&a)
}

// handOff hands s's commands under way to the Adopter, before a pause
// by checkpoint closes their connections; s.life is held.
func (m *Manager) handOff(ctx context.Context, s *Session) []HandedOff {
	ad := m.adopter.Load()
	s.mu.Lock()
	entries := make([]*HandoffEntry, 0, len(s.handoffs))
	for e := range s.handoffs {
		if !e.handed {
			entries = append(entries, e)
		}
	}
	s.mu.Unlock()
	if ad == nil || len(entries) == 0 {
		return nil
	}
	var out []HandedOff
	for _, e := range entries {
		kl, ok := e.Process.(sandbox.KeepLater)
		if !ok {
			continue
		}
		e.Begin()
		h := Handoff{Command: e.Command, Source: e.Source, StartedAt: e.StartedAt, PTY: e.PTY, Process: e.Process,
			Keep: func(key string) error { return kl.KeepAs(ctx, key) }}
		if p, ok := e.Process.(sandbox.PIDer); ok {
			h.PID = p.PID()
		}
		if !e.Deadline.IsZero() {
			h.TimeLeft = max(time.Until(e.Deadline), time.Millisecond)
		}
		id, err := (*ad)(s, h)
		if err != nil {
			if !errors.Is(err, sandbox.ErrExited) {
				m.log.Warn("command_handoff_failed", "session", s.ID, "source", e.Source, "err", err)
			}
			e.Done("")
			continue
		}
		m.log.Info("command_handed_off", "session", s.ID, "source", e.Source, "process", id)
		s.mu.Lock()
		e.handed = true
		s.mu.Unlock()
		e.Done(id)
		out = append(out, HandedOff{ProcessID: id, Command: e.Command, Source: e.Source})
	}
	return out
}
