package main

import (
	"reflect"
	"testing"
)

// Row e6 runs under --rows e, alone, and not under another e-row.
func TestWantRowE6(t *testing.T) {
	for rows, want := range map[string]bool{"e": true, "e6": true, "e6c": true, "e5": false, "1,2": false} {
		c, err := parseFlags([]string{"--rows", rows})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.wantRow("e6") && wantAnyE(c); got != want {
			t.Errorf("--rows %s: e6 runs %v, want %v", rows, got, want)
		}
	}
}

// rotate runs every host n times and moves the first host each round.
func TestRotate(t *testing.T) {
	var order []string
	s, err := rotate([]string{"a", "b", "c"}, 3, func(h string) (float64, error) {
		order = append(order, h)
		return float64(len(order)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c", "b", "c", "a", "c", "a", "b"}; !reflect.DeepEqual(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if want := []float64{1, 6, 8}; !reflect.DeepEqual(s["a"], want) {
		t.Errorf("a's samples %v, want %v", s["a"], want)
	}
}
