//go:build linux

package linuxns

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCriuLoUp: a restore passes no action script only to a criu binary
// holding patch 0005's log line (criuLoUpMark), which brings the restored
// network namespace's loopback up itself; any other criu, or one that
// cannot be read, gets the script. The answer is read once per checkpoint.
func TestCriuLoUp(t *testing.T) {
	dir := t.TempDir()
	patched := filepath.Join(dir, "patched")
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(patched, []byte("\x7fELF...pr_info: "+criuLoUpMark+"\\n..."), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, []byte("\x7fELF...empty netns..."), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want bool
	}{{patched, true}, {plain, false}, {filepath.Join(dir, "missing"), false}} {
		c := &checkpoint{}
		if got := c.criuLoUp(tc.path); got != tc.want {
			t.Errorf("criuLoUp(%s) = %v, want %v", filepath.Base(tc.path), got, tc.want)
		}
	}
	// Once per checkpoint: the binary is not read again.
	c := &checkpoint{}
	if !c.criuLoUp(patched) {
		t.Fatal("patched criu not seen")
	}
	if err := os.WriteFile(patched, []byte("replaced"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !c.criuLoUp(patched) {
		t.Error("criuLoUp read the binary again")
	}
	// The criu .ci/build-criu builds holds the mark (CI builds it).
	if home, err := os.UserHomeDir(); err == nil {
		built := filepath.Join(home, ".cache/sandgate/criu-4.2/criu")
		if _, err := os.Stat(built); err == nil {
			if !(&checkpoint{}).criuLoUp(built) {
				t.Errorf("%s lacks %q: .ci/criu-patches/0005 not applied", built, criuLoUpMark)
			}
		} else if os.Getenv("CI") == "true" {
			t.Errorf("no %s (.ci/build-criu)", built)
		}
	}
}
