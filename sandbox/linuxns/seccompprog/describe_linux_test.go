//go:build linux

package seccompprog

import (
	"runtime"
	"slices"
	"testing"
)

func TestDescribe(t *testing.T) {
	s, err := Describe(false)
	if err != nil {
		t.Skipf("no seccomp filter on this architecture: %v", err)
	}
	for _, n := range []string{"keyctl", "mount", "unshare(CLONE_NEWUSER)", "clone3 (ENOSYS)"} {
		if !slices.Contains(s.Blocked, n) {
			t.Errorf("blocked = %v, lacks %s", s.Blocked, n)
		}
	}
	if s.UserNS {
		t.Error("user namespaces allowed by default")
	}
	// The description is true for x32: the library answers it ENOSYS
	// (TestPolicy runs the program).
	if x32 := slices.Contains(s.Blocked, "x32 ABI (ENOSYS)"); x32 != (runtime.GOARCH == "amd64") {
		t.Errorf("blocked = %v: x32 listed %v on %s", s.Blocked, x32, runtime.GOARCH)
	}
	s, _ = Describe(true)
	if !s.UserNS || slices.Contains(s.Blocked, "unshare(CLONE_NEWUSER)") || !slices.Contains(s.Blocked, "keyctl") {
		t.Errorf("with user namespaces allowed: %+v", s)
	}
}
