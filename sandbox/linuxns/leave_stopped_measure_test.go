//go:build linux

package linuxns_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// TestRestorePhasesMeasure logs the steps of 8 restores (a fork's) of a
// sandbox with a Python server holding 32 MiB and a sleep: criu's run,
// the check of the stopped tree (confined), the continue, and the whole
// restore (sandbox_restored). It only runs when SANDGATE_MEASURE=1:
//
//	SANDGATE_MEASURE=1 go test -count=1 -run TestRestorePhasesMeasure -v ./sandbox/linuxns/
func TestRestorePhasesMeasure(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	requireLinux(t)
	var logs lockedBuffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: t.TempDir(), Checkpoint: true, CRIU: criuForTest(t),
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-measure-src"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(ctx)
	mustRun(t, src, varServer)
	setVar(t, src, "kept")
	mustRun(t, src, "nohup sleep 1051 >/dev/null 2>&1 &")
	for i := range 8 {
		ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		f, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-measure-" + strconv.Itoa(i)})
		ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		_ = f.Destroy(ctx)
	}
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, "sandbox_restored") {
			t.Log(line[strings.Index(line, "msg="):])
		}
	}
}
