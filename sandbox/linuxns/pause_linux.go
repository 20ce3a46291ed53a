//go:build linux

package linuxns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// A paused sandbox (sandbox.Pauser) is a running one whose cgroups are
// frozen: every process stays where it was, with its memory, open files,
// pipes, terminals and listening sockets, and takes no CPU. The state
// file says Paused, so that a gateway restart adopts it frozen (Adopt
// does not thaw it, nor dial its init). Unpause thaws it. A sandbox that
// can be checkpointed is paused by checkpoint instead
// (pause_checkpoint_linux.go); a freeze is what is left when it cannot.

// notKept is what a freeze does not keep across a pause, for the pause's
// answer.
var notKept = []string{
	"connections from outside the sandbox (SSH channels, REST streams, forwarded ports, egress connections) are closed by the gateway at pause",
}

// residentNote is the line the answer adds on a host without swap.
const residentNote = "memory: the paused processes' memory stays resident (a freeze frees their CPU; without swap on the host the kernel cannot reclaim anonymous memory)"

// Paused implements sandbox.Pauser.
func (s *linuxSandbox) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Paused
}

// PauseMethod says how the sandbox is paused: "checkpoint" (its
// processes are in its images), "freeze", or "" when it is not paused.
func (s *linuxSandbox) PauseMethod() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.st.Paused:
		return ""
	case s.st.PauseImages != "":
		return "checkpoint"
	}
	return "freeze"
}

// Pause implements sandbox.Pauser: the state file says Paused first (a
// gateway that dies half-way adopts the sandbox paused, and the next
// Unpause thaws whatever was frozen), then the cgroups are frozen and
// the kernel is asked to reclaim what it can of their memory.
func (s *linuxSandbox) Pause(ctx context.Context) (sandbox.PauseReport, error) {
	rep := sandbox.PauseReport{Method: "freeze", ResidentBytes: -1, NotKept: slices.Clone(notKept)}
	if !swapOn() {
		rep.NotKept = append([]string{residentNote}, rep.NotKept...)
	}
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	closed, stopped, paused, cgs := s.closed, s.st.Stopped, s.st.Paused, slices.Clone(s.st.Cgroups)
	byCheckpoint := s.st.PauseImages != ""
	s.mu.Unlock()
	switch {
	case closed:
		return rep, sandbox.ErrClosed
	case stopped:
		return rep, sandbox.ErrStopped
	case paused:
		if byCheckpoint { // the answer of the pause that made it so
			rep.Method, rep.NotKept = "checkpoint", slices.Clone(checkpointNotKept)
		}
		rep.ResidentBytes = resident(cgs)
		return rep, nil
	}
	if s.d.cfg.Checkpoint && !s.d.cfg.PauseFreeze {
		err := s.pauseCheckpoint(ctx, &rep)
		switch {
		case err == nil:
			return rep, nil
		case errors.Is(err, errSandboxLost), errors.Is(err, errLazyFailed):
			s.d.log.Error("sandbox_pause_failed", "sandbox", s.st.ID, "method", "checkpoint", "err", err)
			return rep, fmt.Errorf("pause sandbox: %w", err)
		}
		// What CRIU cannot do, a freeze does: the answer says why. CRIU's
		// own lines (host paths, inode numbers) go to the log only.
		s.d.log.Warn("sandbox_pause_checkpoint_failed", "sandbox", s.st.ID, "fallback", "freeze", "err", err)
		rep.NotKept = append(rep.NotKept, "memory: not checkpointed, so the pause is a freeze: "+pauseFallbackReason(err))
	}
	dir := s.d.dir(s.st.ID)
	if err := s.setPaused(dir, true); err != nil {
		return rep, fmt.Errorf("pause sandbox: %w", err)
	}
	start := time.Now()
	if _, err := cgroup.Freeze(ctx, cgs); err != nil {
		return rep, errors.Join(fmt.Errorf("pause sandbox: %w", err), s.setPaused(dir, false))
	}
	reclaim(cgs)
	rep.ResidentBytes = resident(cgs)
	s.d.log.Info("sandbox_paused", "sandbox", s.st.ID, "method", rep.Method, "resident_bytes", rep.ResidentBytes,
		"ms", time.Since(start).Milliseconds())
	return rep, nil
}

// pauseFallbackReason is what a pause's answer says of a checkpoint that
// did not happen: the driver's own reason where the sandbox cannot be
// checkpointed (sandbox.ErrNoCheckpoint), a fixed sentence where CRIU
// failed, whose error lines name host paths and inodes and are logged.
func pauseFallbackReason(err error) string {
	if errors.Is(err, errNoRedump) { // joined with its undo's error, which names the gateway's files
		return errNoRedump.Error()
	}
	if errors.Is(err, sandbox.ErrNoCheckpoint) {
		return err.Error()
	}
	return "the checkpoint failed (the gateway's log has CRIU's error, as sandbox_pause_checkpoint_failed)"
}

// Unpause implements sandbox.Pauser: it thaws the cgroups, then the state
// file no longer says Paused.
func (s *linuxSandbox) Unpause(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	closed, paused, cgs := s.closed, s.st.Paused, slices.Clone(s.st.Cgroups)
	s.mu.Unlock()
	if closed {
		return sandbox.ErrClosed
	}
	if !paused {
		return nil
	}
	s.mu.Lock()
	byCheckpoint := s.st.PauseImages != ""
	s.mu.Unlock()
	if byCheckpoint {
		if err := s.unpauseCheckpoint(ctx); err != nil {
			return fmt.Errorf("unpause sandbox: %w", err)
		}
		return nil
	}
	start := time.Now()
	if err := s.thawRetrying(func() error { _, err := cgroup.Thaw(cgs); return err }); err != nil {
		return fmt.Errorf("unpause sandbox: %w", err)
	}
	if err := s.setPaused(s.d.dir(s.st.ID), false); err != nil {
		return fmt.Errorf("unpause sandbox: %w", err)
	}
	s.d.log.Info("sandbox_unpaused", "sandbox", s.st.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// setPaused records paused in the state file (s.life is held).
func (s *linuxSandbox) setPaused(dir string, paused bool) error {
	s.mu.Lock()
	was := s.st.Paused
	s.st.Paused = paused
	s.mu.Unlock()
	if err := s.st.save(dir); err != nil {
		s.mu.Lock()
		s.st.Paused = was
		s.mu.Unlock()
		return err
	}
	return nil
}

// reclaim asks the kernel to reclaim the memory of the frozen cgroups
// cgs: v2's memory.reclaim, v1's memory.force_empty (which, with tasks
// in the cgroup, reclaims what it can and leaves the rest). Page cache
// goes; anonymous memory goes only to swap. Best effort: the answer is
// what resident then says. The files are opened, never created: on v1
// an attempt to create memory.reclaim fails with EACCES, not ENOENT.
func reclaim(cgs []string) {
	for _, dir := range cgs {
		if filepath.Base(dir) == "procs" {
			continue
		}
		err := writeExisting(filepath.Join(dir, "memory.reclaim"), "1G")
		if err == nil || !errors.Is(err, os.ErrNotExist) {
			continue
		}
		_ = writeExisting(filepath.Join(dir, "memory.force_empty"), "0")
	}
}

// writeExisting writes v to the file at path, which must exist.
func writeExisting(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	return errors.Join(err, f.Close())
}

// swapOn reports whether the host has swap: without it a pause cannot
// move anonymous memory out (/proc/meminfo's SwapTotal).
func swapOn() bool {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SwapTotal:"); ok {
			f := strings.Fields(v)
			return len(f) > 0 && f[0] != "0"
		}
	}
	return false
}

// Once a sandbox's processes have ended, the kernel frees some of what
// its cgroups were charged lazily (slab objects after an RCU grace
// period, such as the pipes' and files' of the processes, and the memory
// cgroup's per-CPU charge caches): right at the end the count can be
// twice what it is a moment later (1.06 against 0.55 MiB, measured),
// longer on a loaded host. residentSettled reads it until it holds still
// for settleSteady, at most settleMax: the answer says what stays held.
const (
	settleStep   = 5 * time.Millisecond
	settleSteady = 15 * time.Millisecond
	settleMax    = 150 * time.Millisecond
)

// residentSettled is resident once the count settles (see settleMax),
// for cgroups cgs with no process left in them, and what it was at first.
func residentSettled(cgs []string) (r, first int64) {
	r = resident(cgs)
	first = r
	steady := time.Duration(0)
	for end := time.Now().Add(settleMax); r > 0 && steady < settleSteady && time.Now().Before(end); {
		time.Sleep(settleStep)
		n := resident(cgs)
		if n == r {
			steady += settleStep
		} else {
			steady = 0
		}
		r = n
	}
	return r, first
}

// resident is the memory the cgroups cgs hold (-1: unknown).
func resident(cgs []string) int64 {
	if u := cgroup.ReadUsage(cgs); u.MemoryBytes != nil {
		return *u.MemoryBytes
	}
	return -1
}
