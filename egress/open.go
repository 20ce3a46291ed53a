package egress

// destination is an upstream destination by name.
type destination struct {
	host string
	port uint16
}

// opened counts t's destination among the session's open tunnels until
// the returned func is called (OpenTo).
func (s *Session) opened(t *tunnel) (closed func()) {
	k := destination{t.host, t.port}
	s.mu.Lock()
	if s.open == nil {
		s.open = map[destination]int{}
	}
	s.open[k]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.open[k]--; s.open[k] <= 0 {
			delete(s.open, k)
		}
		s.mu.Unlock()
	}
}

// OpenTo reports whether the session has an open tunnel (a CONNECT or a
// transparent connection, allowed and dialled, not yet ended) to a
// destination hosts allows. The gateway's SSH agent asks it before it
// signs with a key pinned to hosts.
func (s *Session) OpenTo(hosts List) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.open {
		if hosts.Allows(k.host, k.port) {
			return true
		}
	}
	return false
}
