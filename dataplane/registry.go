package dataplane

import "sync"

// member is what a registry holds: a persistent shell or a Python kernel.
type member interface {
	comparable
	// setUnregister hands the member the function that takes its end
	// hook off the session (closing it calls that).
	setUnregister(remove func())
	// sessionEnded ends the member when its session ends, in a goroutine
	// of its own, after the registry has let it go.
	sessionEnded()
}

// registry holds every session's named members (shells or kernels): by
// session id, then name. Its zero value is ready to use.
type registry[T member] struct {
	mu sync.Mutex
	m  map[string]map[string]T
}

// get returns session id's member name, making it with mk when there is
// none: at most limit per session (errFull past it). A member made is
// let go and ended (sessionEnded, not holding up the session's end) when
// s ends; ErrSessionEnded when s already has.
func (r *registry[T]) get(id string, s FileSession, name string, limit int, errFull error, mk func() T) (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var zero T
	if x, ok := r.m[id][name]; ok {
		return x, nil
	}
	if len(r.m[id]) >= limit {
		return zero, errFull
	}
	x := mk()
	remove, ok := s.AddConn(func() {
		r.mu.Lock()
		r.removeLocked(id, name, x)
		r.mu.Unlock()
		go x.sessionEnded()
	})
	if !ok {
		return zero, ErrSessionEnded
	}
	x.setUnregister(remove)
	if r.m == nil {
		r.m = map[string]map[string]T{}
	}
	if r.m[id] == nil {
		r.m[id] = map[string]T{}
	}
	r.m[id][name] = x
	return x, nil
}

// take lets session id's member name go and returns it; ok is false when
// there is none.
func (r *registry[T]) take(id, name string) (x T, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x, ok = r.m[id][name]; ok {
		r.removeLocked(id, name, x)
	}
	return x, ok
}

func (r *registry[T]) removeLocked(id, name string, x T) {
	if cur, ok := r.m[id][name]; !ok || cur != x {
		return
	}
	delete(r.m[id], name)
	if len(r.m[id]) == 0 {
		delete(r.m, id)
	}
}
