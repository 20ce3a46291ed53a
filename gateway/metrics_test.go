package gateway_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// recMetrics records what the manager reports.
type recMetrics struct {
	mu       sync.Mutex
	created  []time.Duration
	sources  []string
	deleted  int
	expired  []string
	retries  []bool
	commands []string
}

func (r *recMetrics) SessionCreated(d time.Duration, source string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = append(r.created, d)
	r.sources = append(r.sources, source)
}

func (r *recMetrics) SessionDeleted() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleted++
}

func (r *recMetrics) SessionExpired(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expired = append(r.expired, reason)
}

func (r *recMetrics) TeardownRetried(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retries = append(r.retries, ok)
}

func (r *recMetrics) CommandDone(source string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.commands = append(r.commands, source)
}

func (r *recMetrics) snapshot() recMetrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	return recMetrics{created: append([]time.Duration(nil), r.created...), sources: append([]string(nil), r.sources...), deleted: r.deleted,
		expired: append([]string(nil), r.expired...), retries: append([]bool(nil), r.retries...),
		commands: append([]string(nil), r.commands...)}
}

func TestManagerMetrics(t *testing.T) {
	rec := &recMetrics{}
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Metrics: rec, Now: clock.Now})
	a, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 60})
	b, _ := mustCreate(t, m, bob, gateway.CreateParams{TTL: 3600})
	// A replay makes nothing, and counts nothing.
	k := gateway.CreateParams{TTL: 3600, IdempotencyKey: "k1"}
	c, _ := mustCreate(t, m, bob, k)
	if _, _, err := m.Create(context.Background(), bob, k); err != nil {
		t.Fatal(err)
	}
	if got := m.SessionsByStatus(); got[gateway.StatusRunning] != 3 || len(got) != 1 {
		t.Errorf("SessionsByStatus = %v, want 3 running", got)
	}
	if got := output(t, b, "echo hi"); got != "hi\n" {
		t.Fatalf("output %q", got)
	}
	b.RecordCommand(context.Background(), gateway.CommandRecord{Command: "x", Source: "rest", DurationMs: 5})
	if err := m.Delete(context.Background(), bob, c.ID); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	m.Reap(context.Background())
	if _, err := m.Get(context.Background(), alice, a.ID); err == nil {
		t.Fatal("session past its TTL not reaped")
	}
	got := rec.snapshot()
	if len(got.created) != 3 {
		t.Errorf("%d creates counted, want 3", len(got.created))
	}
	if want := []string{"cold", "cold", "cold"}; !slices.Equal(got.sources, want) {
		t.Errorf("sandbox sources %v, want %v (no warm pool)", got.sources, want)
	}
	for _, d := range got.created {
		if d <= 0 {
			t.Errorf("create latency %v", d)
		}
	}
	if got.deleted != 1 {
		t.Errorf("%d deletes counted, want 1", got.deleted)
	}
	if len(got.expired) != 1 || got.expired[0] != "ttl" {
		t.Errorf("expiries %v, want [ttl]", got.expired)
	}
	if len(got.commands) != 2 || got.commands[0] != "ssh" || got.commands[1] != "rest" {
		t.Errorf("commands %v, want [ssh rest]", got.commands)
	}
	if st := m.SessionsByStatus(); st[gateway.StatusRunning] != 1 {
		t.Errorf("SessionsByStatus = %v, want 1 running", st)
	}
}

func TestManagerMetricsTeardownRetry(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recMetrics{}
	m := gateway.NewManager(gateway.Config{ReapInterval: 10 * time.Millisecond, Metrics: rec}, stuckDriver{wd}, discardLog())
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r := rec.snapshot().retries; len(r) > 0 {
			if len(r) != 1 || !r[0] {
				t.Fatalf("retries %v, want one that worked", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no teardown retry reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := rec.snapshot().deleted; got != 0 {
		t.Errorf("a failed delete counted as a delete: %d", got)
	}
}
