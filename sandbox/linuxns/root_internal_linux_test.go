//go:build linux

package linuxns

import (
	"os"
	"testing"
)

// requireRoot skips a test that needs root (why: what for) when not run
// as root, and fails it in CI, which runs the linux driver's tests as
// root.
func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("needs root in CI: %s", why)
	}
	t.Skipf("needs root: %s", why)
}
