package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestUIDRangeTellsNoCount: a session sees its sandbox's host uid range
// (/proc/self/uid_map, mount options); handed out lowest free first, the
// range would count the sandboxes on the host, other tenants' included
// (the first session on an empty gateway had range 1, the next 2...).
func TestUIDRangeTellsNoCount(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	var slots []int
	for range 3 {
		s := g.createSession(t)
		a := runREST(t, g, s.SessionID, map[string]any{"command": "cat /proc/self/uid_map"})
		f := strings.Fields(a.out())
		if a.code() != 0 || len(f) != 3 {
			t.Fatalf("uid_map: %+v", a)
		}
		base, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, (base-1<<30)/(1<<16))
	}
	if slices.Equal(slots, []int{1, 2, 3}) {
		t.Fatalf("the sandboxes' uid ranges are %v: they count the host's sandboxes", slots)
	}
}
