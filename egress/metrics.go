package egress

// Metrics receives the bytes every session's proxy carries, as they move
// (internal/metrics implements it); Config.Metrics nil counts nothing.
// Calls must be cheap and must not block.
type Metrics interface {
	// EgressBytes: in bytes came from destinations towards sandboxes,
	// out bytes went from sandboxes to destinations.
	EgressBytes(in, out int64)
}

// addIn counts n bytes from a destination towards the sandbox.
func (s *Session) addIn(n int64) {
	s.in.Add(n)
	if m := s.p.cfg.Metrics; m != nil && n > 0 {
		m.EgressBytes(n, 0)
	}
}

// addOut counts n bytes from the sandbox to a destination.
func (s *Session) addOut(n int64) {
	s.out.Add(n)
	if m := s.p.cfg.Metrics; m != nil && n > 0 {
		m.EgressBytes(0, n)
	}
}
