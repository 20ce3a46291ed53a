package sshd

import "testing"

func TestParseStartups(t *testing.T) {
	for in, want := range map[string]Startups{"10:30:100": {10, 30, 100}, "5": {5, 100, 5}, "1:0:1": {1, 0, 1}} {
		got, err := ParseStartups(in)
		if err != nil || got != want {
			t.Errorf("ParseStartups(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "10:30", "0:30:100", "10:101:100", "100:30:10", "-1"} {
		if _, err := ParseStartups(in); err == nil {
			t.Errorf("ParseStartups(%q) succeeded", in)
		}
	}
}

func TestStartupsDropEarlyThenAll(t *testing.T) {
	s := startups{limit: Startups{Start: 10, Rate: 30, Full: 20}}
	ok := func() bool {
		tk, _ := s.admit("")
		return tk != nil
	}
	var held []*ticket
	for i := range 10 {
		tk, _ := s.admit("")
		if tk == nil {
			t.Fatalf("startup %d dropped below start", i)
		}
		held = append(held, tk)
	}
	// Between start and full some are dropped, some admitted.
	admitted, dropped := 0, 0
	for range 1000 {
		if tk, _ := s.admit(""); tk != nil {
			admitted++
			tk.release()
			tk.release() // once only
		} else {
			dropped++
		}
	}
	if admitted == 0 || dropped < 200 {
		t.Errorf("at start: %d admitted, %d dropped of 1000; want about 30%% dropped", admitted, dropped)
	}
	for s.inAuth() < 20 {
		if tk, _ := s.admit(""); tk != nil {
			held = append(held, tk)
		}
	}
	for range 100 {
		if ok() {
			t.Fatal("a startup admitted at full")
		}
	}
	held[0].release()
	if s.inAuth() != 19 {
		t.Fatalf("inAuth = %d", s.inAuth())
	}
}

// A principal's budget is its own: past it that principal is dropped,
// while others still get in, up to the global bound.
func TestStartupsPerPrincipal(t *testing.T) {
	s := startups{limit: Startups{Start: 10, Rate: 100, Full: 10}, perPrincipal: 3}
	var a []*ticket
	for range 3 {
		tk, why := s.admit("a")
		if tk == nil {
			t.Fatalf("a dropped (%d) within its budget", why)
		}
		a = append(a, tk)
	}
	if tk, why := s.admit("a"); tk != nil || why != droppedPrincipal {
		t.Fatalf("a past its budget: %v %d", tk, why)
	}
	for i := range 3 {
		if tk, _ := s.admit("b"); tk == nil {
			t.Fatalf("b's tunnel %d dropped while a is at its budget", i)
		}
	}
	a[0].release()
	a[0].release()
	if tk, _ := s.admit("a"); tk == nil {
		t.Fatal("a dropped after one of its tunnels went")
	}
	// The global bound still holds: 6 in, 4 more fit.
	for _, p := range []string{"c", "c", "c", "d"} {
		if tk, _ := s.admit(p); tk == nil {
			t.Fatal("dropped below the global bound")
		}
	}
	if tk, why := s.admit("e"); tk != nil || why != droppedFull {
		t.Fatalf("past the global bound: %v %d", tk, why)
	}
}
