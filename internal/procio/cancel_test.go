package procio

import (
	"context"
	"sync"
	"testing"
	"time"
)

// After stop returns, the deadline is never set again, however close the
// cancel comes to the stop: the last deadline set is the caller's.
func TestDeadlineOnCancelStopWaits(t *testing.T) {
	for i := range 1000 {
		var mu sync.Mutex
		var last time.Time
		set := func(d time.Time) error {
			if d.IsZero() {
				mu.Lock()
				last = d
				mu.Unlock()
				return nil
			}
			time.Sleep(time.Duration(i%3) * time.Microsecond) // widen the window
			mu.Lock()
			last = d
			mu.Unlock()
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		stop := DeadlineOnCancel(ctx, set)
		if i%2 == 0 {
			cancel() // f starts (in a goroutine of its own) before stop
		} else {
			go cancel() // a race between the two
		}
		stop()
		_ = set(time.Time{})               // the caller clears it
		time.Sleep(200 * time.Microsecond) // time for a late set to land
		stop()                             // again: no effect
		mu.Lock()
		got := last
		mu.Unlock()
		if !got.IsZero() {
			t.Fatalf("run %d: the deadline was set after stop returned and the caller cleared it", i)
		}
		cancel()
	}
}

// A cancel before stop sets the deadline to about now.
func TestDeadlineOnCancelSets(t *testing.T) {
	got := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	stop := DeadlineOnCancel(ctx, func(d time.Time) error { got <- d; return nil })
	defer stop()
	t0 := time.Now()
	cancel()
	select {
	case d := <-got:
		if d.Before(t0) || time.Since(d) > 5*time.Second {
			t.Fatalf("deadline %v, want about now", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no deadline after the cancel")
	}
}
