package sshd

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/droplog"
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

// DefaultStartupsPerPrincipal is the default budget of one principal
// (tenant) among the tunnels in authentication: a tunnel authenticates in
// milliseconds, so a principal that holds this many at once is stalling
// them, and must not take the global bound from everyone else.
const DefaultStartupsPerPrincipal = 32

// startups counts the tunnels in authentication, in all and per principal,
// and decides who enters.
type startups struct {
	limit        Startups
	perPrincipal int // 0: no budget per principal

	mu  sync.Mutex
	n   int
	per map[string]int // by principal; absent when zero

	// drops logs the tunnels dropped by the global bound, perDrops those
	// past a principal's budget, each in bursts (droplog).
	drops, perDrops *droplog.Counter
}

// Why a tunnel was not admitted.
const (
	admitted = iota
	droppedFull
	droppedPrincipal
)

// ticket is one tunnel's place among those in authentication, taken at
// its CONNECT: its handshake deadline counts from then.
type ticket struct {
	s         *startups
	principal string
	start     time.Time
	once      sync.Once
}

// release uncounts the tunnel, once: when it authenticated or went away.
func (t *ticket) release() {
	t.once.Do(func() {
		s := t.s
		s.mu.Lock()
		defer s.mu.Unlock()
		s.n--
		if t.principal != "" {
			if s.per[t.principal]--; s.per[t.principal] <= 0 {
				delete(s.per, t.principal)
			}
		}
	})
}

// admit takes a place for one more tunnel of principal ("": none known)
// if the principal's budget and the global bound allow it, and counts
// the drop (for the log) when they do not.
func (s *startups) admit(principal string) (*ticket, int) {
	s.mu.Lock()
	why := s.decideLocked(principal)
	if why == admitted {
		s.n++
		if principal != "" {
			if s.per == nil {
				s.per = map[string]int{}
			}
			s.per[principal]++
		}
	}
	s.mu.Unlock()
	switch why {
	case droppedFull:
		if s.drops != nil {
			s.drops.Drop(1)
		}
		return nil, why
	case droppedPrincipal:
		if s.perDrops != nil {
			s.perDrops.Drop(1)
		}
		return nil, why
	}
	return &ticket{s: s, principal: principal, start: time.Now()}, admitted
}

func (s *startups) decideLocked(principal string) int {
	if principal != "" && s.perPrincipal > 0 && s.per[principal] >= s.perPrincipal {
		return droppedPrincipal
	}
	l := s.limit
	switch {
	case s.n >= l.Full:
		return droppedFull
	case s.n >= l.Start:
		p := l.Rate
		if l.Full > l.Start {
			p += (100 - l.Rate) * (s.n - l.Start) / (l.Full - l.Start)
		}
		if rand.IntN(100) < p {
			return droppedFull
		}
	}
	return admitted
}

// inAuth reports how many tunnels are in authentication.
func (s *startups) inAuth() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
