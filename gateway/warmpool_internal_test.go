package gateway

import (
	"context"
	"log/slog"
	"testing"
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
