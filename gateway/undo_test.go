package gateway

import (
	"slices"
	"testing"
)

// Create's rollback: the steps run last pushed first, each once; a
// disarmed stack runs nothing, and nor does a create that pushed none.
func TestUndoRunsInReverseUnlessDisarmed(t *testing.T) {
	var ran []int
	var u undo
	for i := range 3 {
		u.push(func() { ran = append(ran, i) })
	}
	u.run()
	if !slices.Equal(ran, []int{2, 1, 0}) {
		t.Errorf("ran %v, want [2 1 0]", ran)
	}

	ran = nil
	var armed undo
	armed.push(func() { ran = append(ran, 1) })
	armed.disarm()
	armed.run()
	var none undo
	none.run()
	if len(ran) != 0 {
		t.Errorf("a disarmed stack ran %v", ran)
	}
}
