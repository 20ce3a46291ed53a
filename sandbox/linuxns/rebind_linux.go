//go:build linux

package linuxns

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// Rebind implements sandbox.Rebinder: memory, pids and CPUs change in
// the sandbox's cgroups, and TrustPEM is added to its trust store by its
// init. The sizes of /tmp and of the workspace are its filesystems', and
// the open files limit its init set from its pids for every command: a
// change of those, another image than the one the sandbox was built from
// (or none), a trust store that has its CA already, or a CA for an image
// sandbox (whose trust store the build writes) or for a checkpointable
// one with the gateway's /etc dir (whose own files it binds over it at
// its build: etcDirs) is sandbox.ErrNotLive. The files the sandbox's build wrote get the time
// of the claim (refreshTimes).
func (s *linuxSandbox) Rebind(ctx context.Context, spec sandbox.Spec) error {
	lim := spec.Limits.Or(s.d.limits)
	s.mu.Lock()
	var old sandbox.Limits
	var oldImage *sandbox.Image
	var oldTrust, etcDir bool
	ok := !s.closed && !s.st.Stopped && s.st.Boot != nil && spec.ID == s.st.ID
	if ok {
		old, oldImage, oldTrust = s.st.Boot.Limits, s.st.Boot.Image, len(s.st.Boot.TrustPEM) > 0
		etcDir = s.st.EtcDir != ""
	}
	s.mu.Unlock()
	soft := s.d.cfg.Nofile.Soft
	if !ok || !sameImage(spec.Image, oldImage) || lim.TmpBytes != old.TmpBytes || lim.WorkspaceBytes != old.WorkspaceBytes ||
		max(soft, initNofileFor(lim.Pids)) != max(soft, initNofileFor(old.Pids)) ||
		len(spec.TrustPEM) > 0 && (oldTrust || oldImage != nil || etcDir) {
		return sandbox.ErrNotLive
	}
	if err := s.claimCPU(); err != nil {
		return fmt.Errorf("rebind sandbox %s: %w", s.st.ID, err)
	}
	if err := s.refreshTimes(); err != nil {
		return fmt.Errorf("rebind sandbox %s: %w", s.st.ID, err)
	}
	sandbox.TraceOf(ctx).Mark("claim_times")
	if lim == old && len(spec.TrustPEM) == 0 {
		return nil // as built
	}
	if lim != old {
		if err := s.d.cg.SetLimits(s.st.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUs: lim.CPUs}); err != nil {
			return fmt.Errorf("rebind sandbox %s: %w", s.st.ID, err)
		}
	}
	// The init is asked without s.mu: dial reads it when the init is gone.
	if len(spec.TrustPEM) > 0 {
		if err := s.trust(ctx, spec.TrustPEM); err != nil {
			return fmt.Errorf("rebind sandbox %s: %w", s.st.ID, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Boot.Limits = lim // what a Resume builds again
	if len(spec.TrustPEM) > 0 {
		s.trustPEM, s.st.Boot.TrustPEM = spec.TrustPEM, spec.TrustPEM
	}
	return s.st.save(s.d.dir(s.st.ID))
}

// claimCPU gives a warm sandbox, claimed, the CPU weight of any running
// sandbox (cgroup.Plan.Started): it had the least while it waited.
func (s *linuxSandbox) claimCPU() error {
	s.mu.Lock()
	warm := s.warm
	s.warm = false
	s.mu.Unlock()
	if !warm {
		return nil
	}
	return s.d.cg.Started(s.st.ID)
}

// trust asks the init to add pem to the sandbox's trust store.
func (s *linuxSandbox) trust(ctx context.Context, pem []byte) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	conn, err := s.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if err := ctl.WriteFrame(conn, ctl.Request{Op: "trust", TrustPEM: string(pem)}); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	var rep ctl.Reply
	got, err := ctl.ReadFrame(conn, &rep)
	procio.CloseFDs(got)
	if err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	if rep.Op != "trusted" {
		return fmt.Errorf("trust: %s", rep.Error)
	}
	return nil
}

// sameImage reports whether a sandbox built from b (nil: the default
// root) is what a create of a asks for: the same image, by its digest.
func sameImage(a, b *sandbox.Image) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Digest == b.Digest && a.Name == b.Name
}
