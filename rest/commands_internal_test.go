package rest

import "testing"

// TestAwaitCommandEndedBeforeStop: a command that has ended when the end of
// the gateway's drain is seen is answered as ended, never 503
// shutting_down (select alone picked at random between the two).
func TestAwaitCommandEndedBeforeStop(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	for i := range 1000 {
		done := make(chan int, 1)
		done <- 7
		v, why := awaitCommand(done, nil, stop)
		if why != commandEnded || v != 7 {
			t.Fatalf("round %d: an ended command was seen as %d (value %d)", i, why, v)
		}
	}
	done := make(chan int, 1)
	if _, why := awaitCommand(done, nil, stop); why != commandStopped {
		t.Fatalf("a running command at the drain's end: %d, want stopped", why)
	}
	gone := make(chan struct{})
	close(gone)
	if _, why := awaitCommand(done, gone, nil); why != commandGone {
		t.Fatalf("a client that left: %d, want gone", why)
	}
}
