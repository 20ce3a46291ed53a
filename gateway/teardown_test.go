package gateway_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// slowTeardownDriver hands out real workdir sandboxes whose Destroy waits for
// open to be closed, as a slow teardown (many mounts, a loop device) does.
type slowTeardownDriver struct {
	inner *workdir.Driver
	open  chan struct{}
}

func (d slowTeardownDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.inner.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return slowTeardownSandbox{sb, d.open}, nil
}

type slowTeardownSandbox struct {
	sandbox.Sandbox
	open chan struct{}
}

func (s slowTeardownSandbox) Destroy(ctx context.Context) error {
	<-s.open
	return s.Sandbox.Destroy(ctx)
}

// With a teardown queue, Delete answers once the session is unreachable,
// before its sandbox is released; a Delete past the queue's bound
// releases its own before it answers; the tombstone says deleted; and
// Shutdown waits for the releases under way.
func TestAsyncTeardown(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	m := gateway.NewManager(gateway.Config{TeardownQueue: 1}, slowTeardownDriver{wd, open}, discardLog())
	p := gateway.Principal{Tenant: "a"}
	s1, _ := mustCreate(t, m, p, gateway.CreateParams{})
	s2, _ := mustCreate(t, m, p, gateway.CreateParams{})
	ctx := context.Background()
	if err := m.Delete(ctx, p, s1.ID); err != nil { // answers with its Destroy still blocked
		t.Fatal(err)
	}
	if !exists(s1.Sandbox().Workdir()) {
		t.Fatal("the sandbox was released before Delete answered, with its Destroy blocked")
	}
	_, err = m.Get(ctx, p, s1.ID)
	wantCode(t, err, gateway.KindGone, "session_gone")
	if ge, ok := errors.AsType[*gateway.GoneError](err); !ok || ge.Tombstone.Reason != gateway.GoneDeleted {
		t.Errorf("tombstone of a deleted session: %v", err)
	}
	if _, total := m.List(ctx, p, 10, 0); total != 1 {
		t.Fatalf("listed %d sessions, want 1", total)
	}
	// The queue (1) is full: this Delete waits for its own release.
	done := make(chan error, 1)
	go func() { done <- m.Delete(ctx, p, s2.ID) }()
	select {
	case err := <-done:
		t.Fatalf("Delete past the queue's bound answered (%v) before its sandbox was released", err)
	case <-time.After(50 * time.Millisecond):
	}
	shut := make(chan struct{})
	go func() { defer close(shut); m.Shutdown(ctx, false) }()
	select {
	case <-shut:
		t.Fatal("Shutdown did not wait for the release under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(open)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-shut
	for _, s := range []*gateway.Session{s1, s2} {
		if exists(s.Sandbox().Workdir()) {
			t.Errorf("sandbox of %s left after Shutdown", s.ID)
		}
	}
}

// gateStore is a real MemStore whose Delete of one record waits until the
// test lets it go, as a slow disk or a cluster store without quorum does.
type gateStore struct {
	*gateway.MemStore
	id      string
	entered chan struct{}
	release chan struct{}
}

func (s *gateStore) Delete(id string) error {
	if id == s.id {
		close(s.entered)
		<-s.release
	}
	return s.MemStore.Delete(id)
}

// A Delete that has taken its session out of the manager when Shutdown
// begins (so Shutdown neither ends it nor waits for it) releases its
// sandbox before it answers: a release left to the background then would
// be cut short by the process's exit.
func TestTeardownRacingShutdown(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	st := &gateStore{MemStore: gateway.NewMemStore(), entered: make(chan struct{}), release: make(chan struct{})}
	m := gateway.NewManager(gateway.Config{TeardownQueue: 4, Store: st}, slowTeardownDriver{wd, open}, discardLog())
	p := gateway.Principal{Tenant: "a"}
	s, _ := mustCreate(t, m, p, gateway.CreateParams{})
	st.id = s.ID
	ctx := context.Background()
	deleted := make(chan error, 1)
	go func() { deleted <- m.Delete(ctx, p, s.ID) }()
	<-st.entered
	m.Shutdown(ctx, false) // s is no longer the manager's: nothing to wait for
	close(st.release)
	select {
	case err := <-deleted:
		t.Fatalf("Delete answered (%v) after Shutdown with its sandbox's release still to come", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(open)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if exists(s.Sandbox().Workdir()) {
		t.Error("sandbox left after the Delete answered")
	}
}

// burstDriver hands out real workdir sandboxes that record their Halt and
// Destroy; a Create waits while hold is set, as a create under way does.
type burstDriver struct {
	inner   *workdir.Driver
	hold    atomic.Pointer[chan struct{}]
	entered chan struct{}
}

func (d *burstDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if h := d.hold.Load(); h != nil {
		d.entered <- struct{}{}
		<-*h
	}
	sb, err := d.inner.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &burstSandbox{Sandbox: sb, destroyed: make(chan struct{})}, nil
}

type burstSandbox struct {
	sandbox.Sandbox
	halted    atomic.Bool
	once      sync.Once
	destroyed chan struct{}
}

func (s *burstSandbox) Halt() { s.halted.Store(true) }

func (s *burstSandbox) Destroy(ctx context.Context) error {
	err := s.Sandbox.Destroy(ctx)
	s.once.Do(func() { close(s.destroyed) })
	return err
}

// burstOf is session s's sandbox, under the session's wrapper.
func burstOf(s *gateway.Session) *burstSandbox {
	return s.Sandbox().(interface{ Unwrap() sandbox.Sandbox }).Unwrap().(*burstSandbox)
}

func isDestroyed(s *gateway.Session) bool {
	select {
	case <-burstOf(s).destroyed:
		return true
	default:
		return false
	}
}

// While a create is under way, a deleted session's processes end at once
// (Halt) but its sandbox's release waits; past three quarters of the
// teardown queue the oldest go; the rest go once the creates pause, or
// when Shutdown begins.
func TestTeardownDeferredDuringCreates(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d := &burstDriver{inner: wd, entered: make(chan struct{}, 1)}
	m := gateway.NewManager(gateway.Config{TeardownQueue: 4}, d, discardLog())
	p := gateway.Principal{Tenant: "a"}
	ctx := context.Background()
	var ss []*gateway.Session
	for range 6 {
		s, _ := mustCreate(t, m, p, gateway.CreateParams{})
		ss = append(ss, s)
	}
	// A create under way.
	hold := make(chan struct{})
	d.hold.Store(&hold)
	created := make(chan error, 1)
	go func() {
		_, _, err := m.Create(ctx, p, gateway.CreateParams{})
		created <- err
	}()
	<-d.entered
	d.hold.Store(nil)
	for _, s := range ss[:4] {
		if err := m.Delete(ctx, p, s.ID); err != nil {
			t.Fatal(err)
		}
		if !burstOf(s).halted.Load() {
			t.Fatalf("Delete of %s answered before its sandbox was halted", s.ID)
		}
	}
	// Four queued, over three quarters of 4: the oldest goes.
	select {
	case <-burstOf(ss[0]).destroyed:
	case <-time.After(10 * time.Second):
		t.Fatal("the oldest deferred release did not start past three quarters of the queue")
	}
	time.Sleep(100 * time.Millisecond) // five times teardownQuiet
	for _, s := range ss[1:4] {
		if isDestroyed(s) {
			t.Fatalf("the sandbox of %s was released while a create was under way", s.ID)
		}
		if !exists(s.Sandbox().Workdir()) {
			t.Fatalf("the sandbox of %s is gone while a create was under way", s.ID)
		}
	}
	if deferred, _ := m.Teardowns(); deferred != 3 {
		t.Errorf("Teardowns reports %d deferred, want 3", deferred)
	}
	// The create ends: after a pause, the rest go.
	close(hold)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	for _, s := range ss[1:4] {
		select {
		case <-burstOf(s).destroyed:
		case <-time.After(10 * time.Second):
			t.Fatalf("the sandbox of %s was not released once the creates paused", s.ID)
		}
	}
	// Shutdown starts a release deferred behind a create under way, and
	// waits for it.
	hold = make(chan struct{})
	d.hold.Store(&hold)
	go func() {
		_, _, err := m.Create(ctx, p, gateway.CreateParams{})
		created <- err
	}()
	<-d.entered
	d.hold.Store(nil)
	if err := m.Delete(ctx, p, ss[4].ID); err != nil {
		t.Fatal(err)
	}
	shut := make(chan struct{})
	go func() { defer close(shut); m.Shutdown(ctx, false) }()
	select {
	case <-shut:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return with a create under way")
	}
	if !isDestroyed(ss[4]) {
		t.Error("Shutdown returned before the deferred release")
	}
	close(hold)
	<-created // fails or not, after Shutdown: its sandbox is destroyed either way
	for _, s := range ss {
		if exists(s.Sandbox().Workdir()) {
			t.Errorf("sandbox of %s left after Shutdown", s.ID)
		}
	}
}

// haltForwardSandbox is a real workdir sandbox whose Destroy waits for
// open to be closed (a release deferred or slow); its Halt is the
// driver's own, when the driver has one.
type haltForwardSandbox struct {
	sandbox.Sandbox
	open chan struct{}
}

func (s haltForwardSandbox) Halt() {
	if h, ok := s.Sandbox.(sandbox.Halter); ok {
		h.Halt()
	}
}

func (s haltForwardSandbox) Destroy(ctx context.Context) error {
	<-s.open
	return s.Sandbox.Destroy(ctx)
}

type haltForwardDriver struct {
	inner *workdir.Driver
	open  chan struct{}
}

func (d haltForwardDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.inner.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return haltForwardSandbox{sb, d.open}, nil
}

// A deleted workdir session's processes end when its Delete answers,
// while the release of its sandbox is still to come: they are host
// processes (the host's network, ports and files), and a release deferred
// behind a burst of creates must not leave them running meanwhile.
func TestTeardownHaltsWorkdirProcesses(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	m := gateway.NewManager(gateway.Config{TeardownQueue: 4}, haltForwardDriver{wd, open}, discardLog())
	p := gateway.Principal{Tenant: "a"}
	s, _ := mustCreate(t, m, p, gateway.CreateParams{})
	ctx := context.Background()
	proc, err := s.Sandbox().Start(ctx, sandbox.Cmd{Command: "echo up; exec sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(proc.Stdout(), buf); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(ctx, p, s.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan sandbox.Exit, 1)
	go func() {
		e, _ := proc.Wait()
		done <- e
	}()
	var exit *sandbox.Exit
	select {
	case e := <-done:
		exit = &e
		if e.Signal != "KILL" {
			t.Errorf("the command ended %+v, want KILL", e)
		}
	case <-time.After(10 * time.Second):
		t.Error("the command of a deleted session still runs while its sandbox's release waits")
	}
	if _, err := s.Sandbox().Start(ctx, sandbox.Cmd{Command: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Start in a deleted session's sandbox: %v, want ErrClosed", err)
	}
	if !exists(s.Sandbox().Workdir()) {
		t.Error("the sandbox was released with its Destroy blocked")
	}
	close(open)
	m.Shutdown(ctx, false)
	if exit == nil {
		<-done
	}
	if exists(s.Sandbox().Workdir()) {
		t.Error("sandbox left after Shutdown")
	}
}

// A tenant's refused creates (an invalid TTL, answered before anything is
// built) do not hold other sessions' releases back: only a create that
// builds does. Before, every create counted, so one tenant sending invalid
// creates kept every release waiting its full 2 s (maxDefer).
func TestTeardownNotHeldByRefusedCreates(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d := &burstDriver{inner: wd, entered: make(chan struct{}, 1)}
	m := gateway.NewManager(gateway.Config{TeardownQueue: 64}, d, discardLog())
	defer m.Shutdown(context.Background(), false)
	ctx := context.Background()
	s, _ := mustCreate(t, m, gateway.Principal{Tenant: "a"}, gateway.CreateParams{})
	stop := make(chan struct{})
	spam := make(chan int)
	go func() {
		n := 0
		defer func() { spam <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := m.Create(ctx, gateway.Principal{Tenant: "b"}, gateway.CreateParams{TTL: -1}); err == nil {
				t.Error("a create with ttl -1 was accepted")
				return
			}
			n++
		}
	}()
	start := time.Now()
	if err := m.Delete(ctx, gateway.Principal{Tenant: "a"}, s.ID); err != nil {
		t.Fatal(err)
	}
	// Well under the 2 s a deferred release may wait: refused creates
	// are no burst.
	select {
	case <-burstOf(s).destroyed:
	case <-time.After(1500 * time.Millisecond):
		t.Error("a release waited behind another tenant's refused creates")
	}
	close(stop)
	n := <-spam
	t.Logf("released %v after the delete, %d refused creates meanwhile", time.Since(start).Round(time.Millisecond), n)
}
