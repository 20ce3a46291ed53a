package dataplane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// TestReleasedProcessNotTakenBack: a call on a process let go of for a
// pause that is not taken back within releasedWait answers 503
// process_unavailable (to be tried again), not a 500; one whose session
// ends meanwhile answers that.
func TestReleasedProcessNotTakenBack(t *testing.T) {
	sp := &sessionProcs{gone: make(chan struct{})}
	pr := &Process{sp: sp, running: true, released: true, back: make(chan struct{})}
	_, err := pr.proc(context.Background()) // waits releasedWait (30 s)
	ge, ok := gateway.AsError(err)
	if !ok || ge.Kind != gateway.KindUnavailable || ge.Code != "process_unavailable" {
		t.Fatalf("a process not taken back: %v (%+v)", err, ge)
	}
	go func() { time.Sleep(100 * time.Millisecond); close(sp.gone) }()
	if _, err := pr.proc(context.Background()); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("its session ended: %v", err)
	}
}
