package dataplane_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// pausedKeeper is a workdir sandbox that keeps processes as a sandbox
// paused (by checkpoint: its init gone until the resume) does: Reattach
// answers sandbox.ErrPaused.
type pausedKeeper struct{ sandbox.Sandbox }

func (pausedKeeper) Keeps() bool { return true }
func (pausedKeeper) Reattach(context.Context, string) (sandbox.Process, error) {
	return nil, sandbox.ErrPaused
}
func (p pausedKeeper) Unwrap() sandbox.Sandbox { return p.Sandbox }

type pausedKeeperDriver struct{ *workdir.Driver }

func (d pausedKeeperDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return pausedKeeper{sb}, nil
}

// TestResumeOfKeptStatePaused: a kernel or a persistent shell whose
// interpreter or bash is kept by the sandbox (let go of for a pause by
// checkpoint, or by an earlier gateway) and which meets the sandbox
// paused again when it takes it back (sandbox.ErrPaused) does not treat
// it as lost: the call answers 409 session_paused, its record stays, and
// no new interpreter starts without the state.
func TestResumeOfKeptStatePaused(t *testing.T) {
	dir := t.TempDir()
	d, err := workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{}, pausedKeeperDriver{d}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	s, _, err := m.Create(context.Background(), gateway.Principal{Tenant: "t", Method: "api_key"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(filepath.Join(state, s.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	krec := filepath.Join(state, s.ID, "kernel-default")
	if err := os.WriteFile(krec, []byte(`{"tenant":"t","keep":"kernel/default"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	k := &dataplane.Kernels{StateDir: state}
	res, err := k.Run(context.Background(), s.ID, s, "default", dataplane.PythonRequest{Code: "1", Timeout: 20 * time.Second, MaxOutputBytes: 1 << 20})
	if !errors.Is(err, gateway.ErrPaused) {
		t.Errorf("a kernel call that meets its kept interpreter paused: %+v %v, want session_paused", res, err)
	}
	if _, err := os.Stat(krec); err != nil {
		t.Errorf("the kernel's record is gone: %v", err)
	}

	srec := filepath.Join(state, s.ID, "shell-main")
	if err := os.WriteFile(srec, []byte(`{"tenant":"t","state":"/tmp/x","keep":"shell/main"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	sh := &dataplane.Shells{StateDir: state}
	sh.Restore(s.ID, s)
	r, err := sh.Run(context.Background(), s.ID, s, "main", dataplane.Request{Command: "echo hi", Timeout: 20 * time.Second, MaxOutputBytes: 1 << 20})
	if !errors.Is(err, gateway.ErrPaused) {
		t.Errorf("a shell command that meets its kept bash paused: %+v %v, want session_paused", r, err)
	}
}
