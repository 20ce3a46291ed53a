package gateway_test

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// dirNames lists root's entries.
func dirNames(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func waitDirs(t *testing.T, root string, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if names := dirNames(t, root); len(names) == n {
			return names
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d sandboxes in %s, have %v", n, root, dirNames(t, root))
		}
	}
}

// TestWarmPool: creates claim the pool's sandboxes under the sandbox's own
// id; a create whose limits cannot change in a running sandbox gets a new
// one of the same id; warm sandboxes count towards no quota and are in no
// list; the pool refills after claims, and a shutdown that keeps the
// sessions' sandboxes removes the warm ones.
func TestWarmPool(t *testing.T) {
	rec := &recMetrics{}
	m, root := newManager(t, gateway.Config{WarmPool: 2, MaxSessionsPerTenant: 2, ReapInterval: time.Hour, Metrics: rec})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })

	warm := waitDirs(t, root, 2)
	p := gateway.Principal{Tenant: "a"}
	if _, total := m.List(ctx, p, 10, 0); total != 0 {
		t.Fatalf("warm sandboxes listed: %d", total)
	}
	s1, _ := mustCreate(t, m, p, gateway.CreateParams{Metadata: map[string]any{"k": "v"}, TTL: 120})
	if !slices.Contains(warm, s1.ID) {
		t.Fatalf("session %s did not claim a warm sandbox of %v", s1.ID, warm)
	}
	// workdir sandboxes cannot take limits live: the claim makes a new
	// sandbox for the warm one's id.
	mem := int64(64)
	s2, _ := mustCreate(t, m, p, gateway.CreateParams{Resources: &gateway.ResourceRequest{MemoryMiB: &mem}})
	if s2.Sandbox() == nil || !exists(s2.Sandbox().Workdir()) {
		t.Fatalf("session %s has no sandbox", s2.ID)
	}
	// The quota of 2 is the sessions': warm sandboxes take none of it.
	_, _, err := m.Create(ctx, p, gateway.CreateParams{})
	wantCode(t, err, gateway.KindQuota, "quota_exceeded")
	if _, total := m.List(ctx, p, 10, 0); total != 2 {
		t.Fatalf("listed %d sessions, want 2", total)
	}
	waitDirs(t, root, 4) // 2 sessions, the pool full again
	// The metrics tell a claim from a create that built its own sandbox.
	if got, want := rec.snapshot().sources, []string{"warm", "cold"}; !slices.Equal(got, want) {
		t.Errorf("sandbox sources %v, want %v", got, want)
	}

	cancel()
	<-ran
	m.Shutdown(context.Background(), true)
	left := dirNames(t, root)
	slices.Sort(left)
	want := []string{s1.ID, s2.ID}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("after a shutdown keeping sessions: %v, want only the sessions' %v", left, want)
	}
}

// endableDriver hands out real workdir sandboxes that end (sandbox.Ender)
// when their test closes end, as a linux sandbox whose init was killed does.
type endableDriver struct {
	inner *workdir.Driver
	mu    sync.Mutex
	ends  map[string]chan struct{}
}

func (d *endableDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.inner.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	end := make(chan struct{})
	d.mu.Lock()
	d.ends[spec.ID] = end
	d.mu.Unlock()
	return endableSandbox{sb, end, new(sync.Once)}, nil
}

// kill ends sandbox id.
func (d *endableDriver) kill(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	close(d.ends[id])
}

type endableSandbox struct {
	sandbox.Sandbox
	end  chan struct{}
	once *sync.Once
}

func (s endableSandbox) Done() <-chan struct{} { return s.end }

func (s endableSandbox) Destroy(ctx context.Context) error {
	err := s.Sandbox.Destroy(ctx)
	s.once.Do(func() {
		select {
		case <-s.end:
		default:
			close(s.end)
		}
	})
	return err
}

// A create that finds only warm sandboxes that ended while idle makes a
// sandbox of its own under a fresh id, never a dead one's: that id is its
// teardown's, which runs beside the create.
func TestWarmPoolDeadOnlyFreshID(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d := &endableDriver{inner: wd, ends: map[string]chan struct{}{}}
	m := gateway.NewManager(gateway.Config{WarmPool: 1, ReapInterval: time.Hour}, d, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); m.Run(ctx) }()
	var dead string
	for deadline := time.Now().Add(30 * time.Second); dead == ""; time.Sleep(10 * time.Millisecond) {
		d.mu.Lock()
		for id := range d.ends {
			dead = id
		}
		d.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no warm sandbox")
		}
	}
	// No refill from here on: the create alone finds the dead one.
	cancel()
	<-ran
	d.kill(dead)
	s, _ := mustCreate(t, m, gateway.Principal{Tenant: "a"}, gateway.CreateParams{})
	if s.ID == dead {
		t.Fatalf("the session took the id %s of the dead warm sandbox", dead)
	}
}

// warmSpecDriver hands out workdir sandboxes and records, per id, whether
// the create asked for a warm sandbox (sandbox.Spec.Warm).
type warmSpecDriver struct {
	*workdir.Driver
	mu   sync.Mutex
	warm map[string]bool
}

func (d *warmSpecDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.mu.Lock()
	d.warm[spec.ID] = spec.Warm
	d.mu.Unlock()
	return d.Driver.Create(ctx, spec)
}

// The pool builds its sandboxes as warm ones (sandbox.Spec.Warm: the
// linux driver gives them the least CPU weight until their claim), and
// is full again, of warm ones, after a burst that emptied it.
func TestWarmPoolSpecWarm(t *testing.T) {
	root := t.TempDir()
	wd, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	d := &warmSpecDriver{Driver: wd, warm: map[string]bool{}}
	m := gateway.NewManager(gateway.Config{WarmPool: 2, ReapInterval: time.Hour}, d, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	warm := waitDirs(t, root, 2)
	d.mu.Lock()
	for _, id := range warm {
		if !d.warm[id] {
			t.Errorf("warm sandbox %s was not built with Spec.Warm", id)
		}
	}
	d.mu.Unlock()
	p := gateway.Principal{Tenant: "a"}
	var ids []string
	for range 5 { // a burst past the pool's size
		s, _ := mustCreate(t, m, p, gateway.CreateParams{})
		ids = append(ids, s.ID)
	}
	// The sessions, and the pool full again: of warm sandboxes.
	for _, id := range waitDirs(t, root, len(ids)+2) {
		d.mu.Lock()
		w := d.warm[id]
		d.mu.Unlock()
		if !slices.Contains(ids, id) && !w {
			t.Errorf("the refilled pool's sandbox %s was not built with Spec.Warm", id)
		}
	}
}
