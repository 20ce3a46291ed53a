package dataplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
)

// A persistent shell's command that times out is killed with its shell's
// whole tree, the last of it (sandbox.KillGrace later) by what tags that
// tree. The next shell restores its predecessor's exported variables:
// that must not carry the old tree's tag to the next command, which the
// late kill would then end (CI: `basename $PWD` right after a timeout
// was SIGKILLed, exit 137, on the workdir driver).
func TestShellCommandAfterTimeoutOutlivesTheKill(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			var shells dataplane.Shells
			sh := func(cmd string, timeout time.Duration) dataplane.Result {
				t.Helper()
				r := req(cmd)
				r.Timeout = timeout
				res, err := shells.Run(context.Background(), s.ID, s, "a", r)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			if res := sh("export V=kept", 10*time.Second); code(res) != 0 {
				t.Fatalf("export: %+v", res)
			}
			if res := sh("sleep 1007", 300*time.Millisecond); !res.TimedOut {
				t.Fatalf("not timed out: %+v", res)
			}
			// Past the kill's grace after the timeout.
			res := sh("sleep 3 && echo $V alive", 20*time.Second)
			if code(res) != 0 || strings.TrimSpace(res.Stdout.Text) != "kept alive" {
				t.Fatalf("the command after a timeout: exit %d signal %q stdout %q stderr %q", code(res), res.ExitSignal, res.Stdout.Text, res.Stderr.Text)
			}
		})
	}
}
