package dataplane

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// lifeHeldSession is a gateway session whose process starts, once armed,
// wait for gate, as a start waits for the session's lifecycle lock while
// a pause holds it (gateway.Manager.pause calls the OnCheckpoint hooks,
// kernel.letGo among them, with it held). entered is closed when one
// waits.
type lifeHeldSession struct {
	*gateway.Session
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (s *lifeHeldSession) Start(ctx context.Context, cmd sandbox.Cmd, o gateway.StartOptions) (sandbox.Process, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.gate
	}
	return s.Session.Start(ctx, cmd, o)
}

// TestKernelLetGoCallRestarting: a pause that asks a kernel call to let
// go of its interpreter while that call is not where it can hear the ask
// (here: it kills an interpreter that ignored its interrupt and starts
// another, which waits for the session's lifecycle lock the pause holds)
// does not wait for it without end: letGo answers false (the pause is a
// freeze) within its bound. On the merged code the pause and the call
// waited for each other for ever, the session's lifecycle lock held.
func TestKernelLetGoCallRestarting(t *testing.T) {
	m := gateway.NewManager(gateway.Config{}, mustWorkdir(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	gs, _, err := m.Create(context.Background(), gateway.Principal{Tenant: "t", Method: "api_key"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	s := &lifeHeldSession{Session: gs, entered: make(chan struct{}), gate: make(chan struct{})}
	k := &Kernels{}
	x, err := k.get(gs.ID, s, "main")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.close)
	if res, err := x.run(context.Background(), PythonRequest{Code: "1", Timeout: time.Minute, MaxOutputBytes: 1 << 10}); err != nil || res.Error != nil {
		t.Fatalf("first cell: %+v %v", res, err)
	}
	s.armed.Store(true)
	ran := make(chan error, 1)
	go func() {
		_, err := x.run(context.Background(), PythonRequest{Timeout: 100 * time.Millisecond, MaxOutputBytes: 1 << 10,
			Code: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"})
		ran <- err
	}()
	select {
	case <-s.entered: // the call restarts its interpreter, its ask unheard
	case <-time.After(time.Minute):
		t.Fatal("the call never restarted its interpreter")
	}
	letGo := make(chan bool, 1)
	go func() { letGo <- x.letGo() }()
	select {
	case ok := <-letGo:
		if ok {
			t.Error("letGo reports that it let go of a kernel whose call restarts it")
		}
	case <-time.After(time.Minute):
		close(s.gate)
		t.Fatal("letGo waits for a call that cannot hear it: a pause holding the session's lifecycle lock never ends")
	}
	close(s.gate)
	if err := <-ran; err != nil {
		t.Fatalf("the restarting call: %v", err)
	}
}
