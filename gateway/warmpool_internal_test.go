package gateway

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// TestWarmPoolSettleEmpty: a refill round waits for claims to pause only
// while the pool still holds sandboxes; once a burst has emptied it, the
// creates build their own and the refill starts at once (issue 41: back
// to back, the pool of 2 refilled a pair per warmMaxDelay, and most
// creates of a burst found it empty). The claim's kick is left for the
// next round rather than waited on.
func TestWarmPoolSettleEmpty(t *testing.T) {
	p := newWarmPool(2, nil, func(warm) {}, slog.New(slog.DiscardHandler))
	p.kick <- struct{}{} // a claim took the last one
	p.settle(context.Background())
	select {
	case <-p.kick:
	default:
		t.Fatal("settle waited for the claims to pause while the pool was empty")
	}
	// With sandboxes left it still waits for the burst to pause.
	p.idle = []warm{{id: "sbx-left"}}
	p.kick <- struct{}{}
	p.settle(context.Background())
	select {
	case <-p.kick:
		t.Fatal("settle did not wait for the claims to pause while the pool held a sandbox")
	default:
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
