//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// TestLinuxPauseCheckpointManyKept: a session with 40 kept commands let
// go of before a pause by checkpoint resumes, and each comes back. The
// gateway grows its commands' output pipes to 1 MiB; the restore
// recreates them as the sandbox's unprivileged user, whose pipes count
// against fs.pipe-user-pages-soft (64 MiB): past about 30 kept commands
// (two pipes each) CRIU's F_SETPIPE_SZ failed and every resume with it.
func TestLinuxPauseCheckpointManyKept(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-pause-ck-many"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Destroy(ctx) }()
	const kept = 40
	for i := range kept {
		p, err := sb.Start(ctx, sandbox.Cmd{Keep: fmt.Sprintf("k%d", i), Command: "sleep 1000"})
		if err != nil {
			t.Fatal(err)
		}
		p.(sandbox.Releaser).Release()
	}
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pa.Unpause(uctx); err != nil {
		t.Fatalf("resume of a session with %d kept commands: %v", kept, err)
	}
	for i := range kept {
		p, err := sb.(sandbox.Keeper).Reattach(ctx, fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatalf("kept command k%d after the resume: %v", i, err)
		}
		p.Kill()
	}
}
