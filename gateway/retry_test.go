package gateway_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// stuckDriver hands out real workdir sandboxes whose first Destroy fails,
// as a busy cgroup or mount would.
type stuckDriver struct {
	inner *workdir.Driver
}

func (d stuckDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.inner.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &stuckSandbox{Sandbox: sb}, nil
}

type stuckSandbox struct {
	sandbox.Sandbox
	tries atomic.Int32
}

func (s *stuckSandbox) Destroy(ctx context.Context) error {
	if s.tries.Add(1) == 1 {
		return errors.New("device or resource busy")
	}
	return s.Sandbox.Destroy(ctx)
}

func TestManagerRetriesFailedDestroy(t *testing.T) {
	root := t.TempDir()
	wd, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{ReapInterval: 20 * time.Millisecond}, stuckDriver{wd}, discardLog())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		m.Shutdown(context.Background(), false)
	})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if err := m.Delete(context.Background(), alice, s.ID); err == nil {
		t.Fatal("delete reported success although Destroy failed")
	}
	if _, err := m.Get(context.Background(), alice, s.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("deleted session still visible: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for dirCount(t, root) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox was never destroyed on retry")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
