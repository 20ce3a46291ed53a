package main

import (
	"strings"
	"testing"
)

// Every row the default plan runs has its own description: row 11 (a
// create's steps) and row 12 (keystroke echo) each theirs, neither
// overwritten by the other's.
func TestPlanDescribesEveryRow(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	desc := rowDescriptions(c)
	for r := range c.rows {
		if desc[r] == "" {
			t.Errorf("row %s has no description", r)
		}
	}
	if !strings.Contains(desc["11"], "warm-pool") {
		t.Errorf("row 11 (a create's steps) is described as %q", desc["11"])
	}
	if !strings.Contains(desc["12"], "keystroke") {
		t.Errorf("row 12 (keystroke echo) is described as %q", desc["12"])
	}
}
