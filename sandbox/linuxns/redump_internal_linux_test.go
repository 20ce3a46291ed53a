//go:build linux

package linuxns

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

// TestRedumpFailed: a dump of a restored sandbox that fails as a criu
// without .ci/criu-patches fails makes the driver stop dumping restored
// sandboxes (their pause is a freeze, their fork fork_unsupported), and
// says why without CRIU's lines; other failures, and sandboxes that were
// not restored, keep their error and change nothing.
func TestRedumpFailed(t *testing.T) {
	// A criu without the patches: a binary without criuPatchMark (what
	// redumpFailed reads of it).
	unpatched := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(unpatched, []byte("#!/bin/sh\necho Version: 4.2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Driver{log: slog.New(slog.DiscardHandler), cfg: sandbox.Config{CRIU: unpatched}}
	st := &sandboxState{ID: "sbx-r", Restored: true, Checkpoint: true, Image: "/x", Boot: &bootSpec{}}
	booted := *st
	booted.Restored = false
	other := errors.New("checkpoint of sbx-r: criu dump: exit status 1: Error (criu/cr-dump.c:1975): Dumping FAILED.")
	if err := d.redumpFailed(st, other); err != other || d.noRedump.Load() {
		t.Fatalf("another failure: %v (noRedump %v)", err, d.noRedump.Load())
	}
	for _, line := range []string{
		"Error (criu/namespaces.c:997): One or more namespaces doesn't belong to the target user namespace",
		"Error (criu/sk-unix.c:351): unix: Unix socket 30832159 not found",
	} {
		d.noRedump.Store(false)
		err := fmt.Errorf("checkpoint of sbx-r: criu dump: exit status 1: %s; Error (criu/cr-dump.c:1975): Dumping FAILED.", line)
		if got := d.redumpFailed(&booted, err); got != err || d.noRedump.Load() {
			t.Errorf("%q of a booted sandbox: %v (noRedump %v)", line, got, d.noRedump.Load())
		}
		got := d.redumpFailed(st, err)
		if !errors.Is(got, sandbox.ErrNoCheckpoint) || strings.Contains(got.Error(), "criu/") || !d.noRedump.Load() {
			t.Errorf("%q: %v (noRedump %v)", line, got, d.noRedump.Load())
		}
		if err := d.checkpointable(st); !errors.Is(err, sandbox.ErrNoCheckpoint) {
			t.Errorf("restored sandbox checkpointable after %q: %v", line, err)
		}
		if err := d.checkpointable(&booted); err != nil {
			t.Errorf("booted sandbox not checkpointable after %q: %v", line, err)
		}
	}
}

// TestRedumpFailedPatchedCRIU: with the criu .ci/build-criu builds, the
// lines of criuNoRedump change nothing: that criu dumps restored trees,
// and a sandbox's own processes can make it print them (a file's name, in
// CRIU's log: TestLinuxRedumpHostileFailure).
func TestRedumpFailedPatchedCRIU(t *testing.T) {
	criu := os.Getenv("SANDGATE_CRIU")
	if home, err := os.UserHomeDir(); criu == "" && err == nil {
		criu = filepath.Join(home, ".cache/sandgate/criu-4.2/criu")
	}
	if _, err := os.Stat(criu); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no criu built by .ci/build-criu: %v", err)
		}
		t.Skip("no criu built by .ci/build-criu")
	}
	if !readCRIUMarks(criu).patched {
		t.Fatalf("%s has no %q: .ci/criu-patches' 0002 no longer says it (criuPatchMark)", criu, criuPatchMark)
	}
	d := &Driver{log: slog.New(slog.DiscardHandler), cfg: sandbox.Config{CRIU: criu}}
	st := &sandboxState{ID: "sbx-r", Restored: true, Checkpoint: true, Image: "/x", Boot: &bootSpec{}}
	for _, line := range []string{
		"Error (criu/namespaces.c:997): One or more namespaces doesn't belong to the target user namespace",
		"Error (criu/sk-unix.c:351): unix: Unix socket 30832159 not found",
		"Error (criu/files-reg.c:1031): Can't dump ghost file /tmp/unix: Unix socket 1 not found of 3002368 size, increase limit",
	} {
		err := fmt.Errorf("checkpoint of sbx-r: criu dump: exit status 1: %s; Error (criu/cr-dump.c:1975): Dumping FAILED.", line)
		if got := d.redumpFailed(st, err); got != err || d.noRedump.Load() {
			t.Errorf("%q with a patched criu: %v (noRedump %v)", line, got, d.noRedump.Load())
		}
	}
}

// TestPauseFallbackReasonNoRedump: the pause's answer says why a restored
// sandbox was frozen (errNoRedump) and nothing of the undo's error joined
// to it, which names the gateway's files.
func TestPauseFallbackReasonNoRedump(t *testing.T) {
	undo := errors.New("open /var/lib/sandgate/sandboxes/sbx-r/state.json.tmp: no space left on device")
	got := pauseFallbackReason(errors.Join(errNoRedump, undo))
	if got != errNoRedump.Error() {
		t.Errorf("pause fallback reason %q, want %q", got, errNoRedump.Error())
	}
}

// TestCheckCRIUSaysUnpatched: a criu without .ci/criu-patches is said at
// start (criu_unpatched), once, with what falls back; a patched one is not.
func TestCheckCRIUSaysUnpatched(t *testing.T) {
	for _, tool := range []string{"nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s: %v", tool, err)
			}
			t.Skipf("%s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name, script string
		warned       bool
	}{
		{"unpatched", "#!/bin/sh\necho Version: 4.2\n", true},
		{"patched", "#!/bin/sh\necho Version: 4.2\n# " + criuPatchMark + "\n", false},
	} {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, []byte(c.script), 0o755); err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		d := &Driver{log: slog.New(slog.NewTextHandler(&logs, nil)), cfg: sandbox.Config{CRIU: path}}
		if err := d.checkCRIU(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := strings.Count(logs.String(), "criu_unpatched"); got != map[bool]int{true: 1, false: 0}[c.warned] {
			t.Errorf("%s criu: %d criu_unpatched lines in %q", c.name, got, logs.String())
		}
		if c.warned && !strings.Contains(logs.String(), ".ci/build-criu") {
			t.Errorf("the notice does not say how to get a patched criu: %q", logs.String())
		}
	}
}
