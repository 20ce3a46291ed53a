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
	for i := range 10 {
		if ok, _ := s.admit(); !ok {
			t.Fatalf("startup %d dropped below start", i)
		}
	}
	// Between start and full some are dropped, some admitted.
	admitted, dropped := 0, 0
	for range 1000 {
		if ok, _ := s.admit(); ok {
			admitted++
			s.release()
		} else {
			dropped++
		}
	}
	if admitted == 0 || dropped < 200 {
		t.Errorf("at start: %d admitted, %d dropped of 1000; want about 30%% dropped", admitted, dropped)
	}
	for s.inAuth() < 20 {
		s.admit()
	}
	for range 100 {
		if ok, _ := s.admit(); ok {
			t.Fatal("a startup admitted at full")
		}
	}
	s.release()
	if s.inAuth() != 19 {
		t.Fatalf("inAuth = %d", s.inAuth())
	}
}
