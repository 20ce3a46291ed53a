package droplog

import (
	"sync"
	"testing"
	"time"
)

// A burst is reported as its first drop at once, then as the true count of
// the rest when the window ends, with no later drop needed to flush it.
func TestCounterFlushesAtWindowEnd(t *testing.T) {
	var mu sync.Mutex
	var got []int
	lines := make(chan struct{}, 10)
	c := New(50*time.Millisecond, func(n int) {
		mu.Lock()
		got = append(got, n)
		mu.Unlock()
		lines <- struct{}{}
	})
	defer c.Stop()
	for range 248 {
		c.Drop(1)
	}
	<-lines // the first
	select {
	case <-lines: // the rest, at the window's end
	case <-time.After(30 * time.Second):
		t.Fatal("the rest of the burst was never reported")
	}
	mu.Lock()
	if len(got) != 2 || got[0] != 1 || got[1] != 247 {
		t.Fatalf("reported %v, want [1 247]", got)
	}
	mu.Unlock()
	// Quiet since: the window closes, and the next drop is reported at once.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		open := c.timer != nil
		c.mu.Unlock()
		if !open {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the window never closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Drop(3)
	<-lines
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 || got[2] != 3 {
		t.Fatalf("reported %v, want a third line of 3", got)
	}
}

func TestCounterStopFlushes(t *testing.T) {
	var got []int
	c := New(time.Hour, func(n int) { got = append(got, n) })
	c.Drop(1)
	c.Drop(5)
	c.Stop()
	c.Drop(7)
	if len(got) != 2 || got[0] != 1 || got[1] != 5 {
		t.Fatalf("reported %v, want [1 5]", got)
	}
}
