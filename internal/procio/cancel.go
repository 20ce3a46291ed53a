package procio

import (
	"context"
	"sync"
	"time"
)

// DeadlineOnCancel sets a descriptor's deadline to now, through set, once
// ctx is done, so that I/O blocked on it returns. The stop it returns
// keeps that from happening later: it returns only once the deadline will
// not be set, or has been, so a caller that clears the deadline after stop
// (set(time.Time{})) never has it set behind its back, which
// context.AfterFunc's own stop does not promise (the function may have
// started and not yet run). stop may be called more than once.
func DeadlineOnCancel(ctx context.Context, set func(time.Time) error) (stop func()) {
	done := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = set(time.Now())
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			if !stopAfter() { // f has started: wait for it
				<-done
			}
		})
	}
}
