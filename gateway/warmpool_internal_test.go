package gateway

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// TestWarmPoolSettle: a refill's build waits for a burst of claims to
// pause only while the pool holds more than a quarter of its size; once
// the burst has taken it down to that (or emptied it), the creates would
// soon build their own, and the refill builds at once (issue 41, row 11e).
func TestWarmPoolSettle(t *testing.T) {
	for _, c := range []struct {
		size, idle int
		waits      bool
	}{{8, 0, false}, {8, 2, false}, {8, 3, true}, {64, 16, false}, {64, 17, true}, {2, 0, false}, {2, 1, true}} {
		p := newWarmPool(c.size, nil, func(warm) {}, slog.New(slog.DiscardHandler))
		p.idle = make([]warm, c.idle)
		// A claim that never pauses: settle returns only when it need
		// not wait, or when ctx ends.
		p.lastClaim = time.Now().Add(time.Hour)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		atOnce := p.settle(ctx)
		cancel()
		if atOnce == c.waits {
			t.Errorf("pool of %d holding %d in a burst of claims: waited %v, want %v", c.size, c.idle, !atOnce, c.waits)
		}
	}
	// A claim marks the burst; without one for warmQuiet, no wait.
	p := newWarmPool(8, nil, func(warm) {}, slog.New(slog.DiscardHandler))
	p.idle = []warm{{id: "a", sb: idleSandbox{}}, {id: "b", sb: idleSandbox{}}, {id: "c", sb: idleSandbox{}}, {id: "d", sb: idleSandbox{}}}
	if _, ok := p.take(); !ok {
		t.Fatal("take found no sandbox")
	}
	if p.lastClaim.IsZero() {
		t.Fatal("take did not mark the claim")
	}
	if !p.settle(context.Background()) {
		t.Fatal("settle failed with a live context")
	}
	if since := time.Since(p.lastClaim); since < warmQuiet {
		t.Errorf("settle returned %v after the claim, before the claims paused for %v", since, warmQuiet)
	}
}

// blockingCreate is a warm pool's create that waits for release, and
// counts the creates under way.
type blockingCreate struct {
	mu       sync.Mutex
	now, top int
	release  chan struct{}
}

func (b *blockingCreate) create(ctx context.Context, id string) (sandbox.Sandbox, error) {
	b.mu.Lock()
	b.now++
	b.top = max(b.top, b.now)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.now--
		b.mu.Unlock()
	}()
	select {
	case <-b.release:
		return idleSandbox{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *blockingCreate) underWay() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now
}

// idleSandbox is a warm sandbox that does nothing.
type idleSandbox struct{ sandbox.Sandbox }

func (idleSandbox) Destroy(context.Context) error { return nil }

// TestWarmPoolFillsInParallel: an empty pool builds the sandboxes it lacks
// at once, at most par (one CPU fewer than the host has) and never more
// than it lacks (issue 41: back to back, a pool refilled one sandbox at a
// time behind the creates, which then mostly built their own); an image's
// pool (admit, one fill slot for all) builds one at a time.
func TestWarmPoolFillsInParallel(t *testing.T) {
	for _, image := range []bool{false, true} {
		b := &blockingCreate{release: make(chan struct{})}
		p := newWarmPool(3, b.create, func(warm) {}, slog.New(slog.DiscardHandler))
		p.par = 2 // as on a host with 3 CPUs
		want := 2
		if image {
			p.admit, p.fill, want = func() bool { return true }, make(chan struct{}, 1), 1
		}
		ctx, cancel := context.WithCancel(context.Background())
		p.start(ctx)
		deadline := time.Now().Add(10 * time.Second)
		for b.underWay() < want && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // no more than want start meanwhile
		if got := b.underWay(); got != want {
			t.Errorf("image pool %v: %d sandboxes built at once, want %d", image, got, want)
		}
		close(b.release) // every create from now on returns at once
		for !p.fullForTest() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !p.fullForTest() {
			t.Errorf("image pool %v: not refilled to its size", image)
		}
		b.mu.Lock()
		top := b.top
		b.mu.Unlock()
		if top > want {
			t.Errorf("image pool %v: %d sandboxes built at once, want at most %d", image, top, want)
		}
		p.close(context.Background())
		cancel()
		p.wg.Wait()
	}
}

// fullForTest reports whether p holds size sandboxes, no more.
func (p *warmPool) fullForTest() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle) == p.size
}
