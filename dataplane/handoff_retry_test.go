package dataplane_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// freezer is a workdir sandbox that pauses as a sandbox whose checkpoint
// is held by a command under way does (a freeze), and whose next pause
// would be a checkpoint: a pause tries to hand its commands under way
// over (gateway handOff).
type freezer struct {
	sandbox.Sandbox
	mu     sync.Mutex
	paused bool
	tries  atomic.Int32
}

func (f *freezer) CanCheckpointPause() bool { return true }
func (f *freezer) Pause(context.Context) (sandbox.PauseReport, error) {
	f.mu.Lock()
	f.paused = true
	f.mu.Unlock()
	return sandbox.PauseReport{Method: "freeze", ResidentBytes: -1}, nil
}
func (f *freezer) Unpause(context.Context) error {
	f.mu.Lock()
	f.paused = false
	f.mu.Unlock()
	return nil
}
func (f *freezer) Paused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paused
}
func (f *freezer) Unwrap() sandbox.Sandbox { return f.Sandbox }

// Start's processes cannot be kept (an init that predates "keep", or
// one at its ctl.MaxKept): KeepAs refuses, changing nothing.
func (f *freezer) Start(ctx context.Context, cmd sandbox.Cmd) (sandbox.Process, error) {
	p, err := f.Sandbox.Start(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return &unkeepable{Process: p, tries: &f.tries}, nil
}

type unkeepable struct {
	sandbox.Process
	tries *atomic.Int32
}

func (u *unkeepable) KeepAs(context.Context, string) error {
	u.tries.Add(1)
	return errors.New("keep: the init cannot keep it")
}

type freezerDriver struct{ *workdir.Driver }

func (d freezerDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &freezer{Sandbox: sb}, nil
}

// TestHandoffRefusedTwice: a REST command under way that a pause could
// not hand over (the sandbox could not keep it: an init that predates
// "keep", or one at ctl.MaxKept; or the process API refused it) runs
// on through the pause (a freeze), and the next pause tries again: the
// command is not broken by the second try (the merged code closed a
// channel twice there: a panic), and it ends with its own exit.
func TestHandoffRefusedTwice(t *testing.T) {
	dir := t.TempDir()
	d, err := workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{}, freezerDriver{d}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	m.SetAdopter(func(_ *gateway.Session, h gateway.Handoff) (string, error) {
		if err := h.Keep("process/p1"); err != nil {
			return "", err
		}
		return "p1", nil
	})
	p := gateway.Principal{Tenant: "t", Method: "api_key"}
	s, _, err := m.Create(context.Background(), p, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := sandbox.As[*freezer](s.Sandbox())
	if f == nil {
		t.Fatal("not the test's sandbox")
	}
	tries := &f.tries
	release := filepath.Join(dir, "go")
	type ran struct {
		res dataplane.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := dataplane.Run(context.Background(), s, dataplane.Request{
			Command: "while [ ! -e " + release + " ]; do sleep 0.02; done; echo out; exit 4",
			Timeout: time.Minute, MaxOutputBytes: 1 << 20})
		done <- ran{res, err}
	}()
	for i := 0; tries.Load() < 2; i++ {
		if i == 2000 {
			t.Fatalf("the pauses did not try to hand the command over twice (%d)", tries.Load())
		}
		res, err := m.Pause(context.Background(), p, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Handed) != 0 {
			t.Fatalf("a refused command was handed over: %+v", res.Handed)
		}
		if _, err := m.Unpause(context.Background(), p, s.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.ExitCode == nil || *r.res.ExitCode != 4 || string(r.res.Stdout.Bytes()) != "out\n" {
		t.Errorf("the command after two refused hand-overs: %+v %v", r.res, r.err)
	}
}
