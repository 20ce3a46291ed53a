package egress

import (
	"errors"
	"fmt"
	"testing"
)

func TestNames(t *testing.T) {
	n := newNames()
	a, err := n.addrFor("a.test", nil)
	if err != nil || !NamePrefix.Contains(a) || a.IsLoopback() || a.String() != "198.18.1.0" {
		t.Fatalf("a.test at %v, %v", a, err)
	}
	if again, _ := n.addrFor("a.test", nil); again != a {
		t.Errorf("a.test moved from %v to %v", a, again)
	}
	b, _ := n.addrFor("b.test", nil)
	if b == a {
		t.Error("two names share an address")
	}
	if name, ok := n.nameAt(b); !ok || name != "b.test" {
		t.Errorf("%v stands for %q", b, name)
	}
	if _, ok := n.nameAt(b.Next()); ok {
		t.Error("an address never given stands for a name")
	}
	for i := len(n.byName); i < MaxNames; i++ {
		if _, err := n.addrFor(fmt.Sprintf("n%d.test", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.addrFor("one-too-many.test", nil); !errors.Is(err, errNamesFull) {
		t.Errorf("past MaxNames: %v", err)
	}
	if _, err := n.addrFor("a.test", nil); err != nil {
		t.Errorf("a known name past MaxNames: %v", err)
	}
}
