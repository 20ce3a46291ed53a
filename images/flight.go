package images

import (
	"context"
	"sync"
)

// flights shares one run of a function among concurrent callers with the
// same key, like singleflight, except for cancellation: the run has a
// context of its own that is cancelled only when every caller waiting for
// it has given up, so one impatient caller does not fail the others. The
// last caller to give up waits for the cancelled run to return.
type flights[T any] struct {
	mu sync.Mutex
	m  map[string]*flight[T]
}

type flight[T any] struct {
	done    chan struct{}
	val     T
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do runs fn once for all concurrent callers of key and returns its result;
// shared reports whether this caller joined a run another started.
func (g *flights[T]) do(ctx context.Context, key string, fn func(context.Context) (T, error)) (v T, err error, shared bool) {
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[string]*flight[T])
	}
	f, shared := g.m[key]
	if !shared {
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight[T]{done: make(chan struct{}), cancel: cancel}
		g.m[key] = f
		go func() {
			defer cancel()
			val, err := fn(runCtx)
			g.mu.Lock()
			f.val, f.err = val, err
			if g.m[key] == f {
				delete(g.m, key)
			}
			g.mu.Unlock()
			close(f.done)
		}()
	}
	f.waiters++
	g.mu.Unlock()

	select {
	case <-f.done:
		g.mu.Lock()
		f.waiters--
		g.mu.Unlock()
		return f.val, f.err, shared
	case <-ctx.Done():
		g.mu.Lock()
		f.waiters--
		last := f.waiters == 0
		if last {
			// Nobody wants the result: stop the run, let a new caller
			// start afresh, and wait for the run to clean up, so the
			// caller returns with nothing of it left behind.
			f.cancel()
			if g.m[key] == f {
				delete(g.m, key)
			}
		}
		g.mu.Unlock()
		if last {
			<-f.done
			if f.err == nil {
				return f.val, nil, shared // it finished all the same
			}
		}
		var zero T
		return zero, context.Cause(ctx), shared
	}
}
