package sshd

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Startups bounds the tunnels that have not finished SSH authentication,
// as OpenSSH's MaxStartups does: from Start of them on, a new one is
// dropped with probability Rate percent, rising linearly to 100% at Full.
type Startups struct {
	Start, Rate, Full int
}

// DefaultStartups is the default bound: more than OpenSSH's 10:30:100, as
// one gateway serves many agents that connect in bursts, each tunnel
// already authorised by its bearer token.
var DefaultStartups = Startups{Start: 128, Rate: 30, Full: 512}

// String is the bound as "start:rate:full".
func (m Startups) String() string { return fmt.Sprintf("%d:%d:%d", m.Start, m.Rate, m.Full) }

// ParseStartups parses "start:rate:full", or a single number N (N:100:N,
// a hard bound).
func ParseStartups(s string) (Startups, error) {
	f := strings.Split(s, ":")
	var n []int
	for _, x := range f {
		v, err := strconv.Atoi(x)
		if err != nil || v < 0 {
			return Startups{}, fmt.Errorf("max startups %q: want start:rate:full or a number", s)
		}
		n = append(n, v)
	}
	var m Startups
	switch len(n) {
	case 1:
		m = Startups{Start: n[0], Rate: 100, Full: n[0]}
	case 3:
		m = Startups{Start: n[0], Rate: n[1], Full: n[2]}
	default:
		return Startups{}, fmt.Errorf("max startups %q: want start:rate:full or a number", s)
	}
	if m.Start < 1 || m.Rate > 100 || m.Full < m.Start {
		return Startups{}, fmt.Errorf("max startups %q: want 1 <= start <= full and rate <= 100", s)
	}
	return m, nil
}

// startups counts the tunnels in authentication and decides who enters.
type startups struct {
	limit Startups

	mu      sync.Mutex
	n       int
	dropped int // since the last warning
	warned  time.Time
}

// admit reports whether one more tunnel may start authentication, and
// counts it when it may. When it may not, warn is the number of drops to
// report now (0: a warning went out less than 10s ago).
func (s *startups) admit() (ok bool, warn int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limit
	drop := false
	switch {
	case s.n >= l.Full:
		drop = true
	case s.n >= l.Start:
		p := l.Rate
		if l.Full > l.Start {
			p += (100 - l.Rate) * (s.n - l.Start) / (l.Full - l.Start)
		}
		drop = rand.IntN(100) < p
	}
	if !drop {
		s.n++
		return true, 0
	}
	s.dropped++
	if now := time.Now(); now.Sub(s.warned) >= 10*time.Second {
		warn, s.dropped, s.warned = s.dropped, 0, now
	}
	return false, warn
}

// release uncounts a tunnel that authenticated or went away.
func (s *startups) release() {
	s.mu.Lock()
	s.n--
	s.mu.Unlock()
}

// inAuth reports how many tunnels are in authentication.
func (s *startups) inAuth() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
