package main

import (
	"slices"
	"testing"
)

func TestParseServerTiming(t *testing.T) {
	steps, names := parseServerTiming("check;dur=0.250, init.root;dur=1.5, bad, x;desc=y, init.root;dur=0.5, total;dur=12")
	if want := []string{"check", "init.root", "total"}; !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	for name, want := range map[string]float64{"check": 0.00025, "init.root": 0.002, "total": 0.012} {
		if got := steps[name]; got < want*0.999 || got > want*1.001 {
			t.Errorf("%s: %v s, want %v", name, got, want)
		}
	}
}
