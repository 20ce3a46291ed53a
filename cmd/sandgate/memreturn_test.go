package main

import "testing"

func TestShouldReturn(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		allocated, free, live uint64
		want                  bool
	}{
		{0, 4 * mib, 8 * mib, true},          // quiet, 4 MiB over a small heap
		{0, 4*mib - 1, 8 * mib, false},       // under the floor
		{20 * mib, 64 * mib, 8 * mib, false}, // busy: the runtime paces it
		{0, 20 * mib, 100 * mib, false},      // a quarter of a large live heap not reached
		{0, 25 * mib, 100 * mib, true},       // reached
	} {
		if got := shouldReturn(c.allocated, c.free, c.live); got != c.want {
			t.Errorf("shouldReturn(allocated %d, free %d, live %d) = %v, want %v", c.allocated, c.free, c.live, got, c.want)
		}
	}
}
