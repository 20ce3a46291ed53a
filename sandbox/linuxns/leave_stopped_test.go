//go:build linux

package linuxns_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// threadStates prints, for each process of the sandbox whose command line
// has one of the marks, the mark and the states of its threads (R, S, T…),
// sorted: "mark S S", one a line.
const threadStates = `for p in $(ls /proc | grep -E '^[0-9]+$'); do
  case "$(cat /proc/$p/comm 2>/dev/null)" in sleep|python3) ;; *) continue;; esac
  c=$(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null) || continue
  for m in $MARKS; do
    case "$c" in *"$m"*) echo "$m $(cat /proc/$p/task/*/stat 2>/dev/null | cut -d' ' -f3 | sort | tr '\n' ' ')";; esac
  done
done | sort`

// checkStoppedMarks checks that the processes marked stopped (1041,
// stopped-threads) are, each of their threads, and the others (1042,
// running-threads) not.
func checkStoppedMarks(t *testing.T, sb sandbox.Sandbox, when string) {
	t.Helper()
	out := mustRun(t, sb, "MARKS='1041 stopped-threads 1042 running-threads'\n"+threadStates)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("%s: processes %q, want the 4 marked", when, out)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 {
			t.Fatalf("%s: %q", when, l)
		}
		if strings.Contains(f[0], "threads") && len(f) < 3 {
			t.Errorf("%s: %s has one thread, want 2", when, f[0])
		}
		for _, s := range f[1:] {
			if stopped := s == "T" || s == "t"; stopped != (f[0] == "1041" || f[0] == "stopped-threads") {
				t.Errorf("%s: %s's threads in states %v", when, f[0], f[1:])
				break
			}
		}
	}
}

// TestLinuxRestoreKeepsStopped: a restore leaves every restored task
// stopped until it is checked (--leave-stopped), then continues them; but
// a process stopped in the source (kill -STOP, a shell's ^Z job) stays
// stopped in a fork and after a resume from a pause by checkpoint, each
// of its threads; the others run, each of their threads.
func TestLinuxRestoreKeepsStopped(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criuForTest(t)}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-stopped-src"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(ctx)
	threads := `import threading, time, sys; threading.Thread(target=time.sleep, args=(1e6,)).start(); time.sleep(1e6)`
	// Each stopped once it runs what it is (its threads started): the
	// shell's child, stopped before its exec, would hold runIn's pipes.
	mustRun(t, src, `nohup sleep 1041 >/dev/null 2>&1 & s=$!
nohup python3 -c '`+threads+`' stopped-threads >/dev/null 2>&1 & p=$!
nohup sleep 1042 >/dev/null 2>&1 &
nohup python3 -c '`+threads+`' running-threads >/dev/null 2>&1 & r=$!
while [ "$(cat /proc/$s/comm)" != sleep ] || [ "$(ls /proc/$p/task | wc -l)" != 2 ] || [ "$(ls /proc/$r/task | wc -l)" != 2 ]; do sleep 0.05; done
kill -STOP $s $p`)
	checkStoppedMarks(t, src, "the source")
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-stopped-fork"})
	ck.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Destroy(ctx)
	checkStoppedMarks(t, f, "the fork")
	checkStoppedMarks(t, src, "the source after the fork")
	pa := src.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	checkStoppedMarks(t, src, "the source after a pause and resume")
	// The stopped one is a process like any other: continued, it runs.
	if out := mustRun(t, f, `kill -CONT $(pgrep -xf 'sleep 1041') && sleep 0.1 && cut -d' ' -f3 /proc/$(pgrep -xf 'sleep 1041')/stat`); out != "S\n" {
		t.Errorf("the fork's stopped sleep, continued: state %q", out)
	}
}

// TestLinuxRefusedRestoreRanNothing: a resume whose check refuses what
// CRIU restored (a mount image tampered with to add a host bind) kills
// processes that never ran: a process that writes a file in the workspace
// the moment it runs (the workspace, the sandbox's own, outlives the
// refused resume: the sandbox stays paused) wrote nothing. The images as
// they were resume it, and it writes the file.
func TestLinuxRefusedRestoreRanNothing(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criuForTest(t)}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-ran-nothing"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	// Builtins only: it acts within microseconds of running.
	mustRun(t, sb, `mkdir /workspace/hostusr; nohup sh -c 'while [ ! -e /workspace/armed ]; do :; done; echo ran >/workspace/ran' >/dev/null 2>&1 &`)
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	ws := filepath.Join(dataDir, "sandboxes", id, "workspace")
	if err := os.WriteFile(filepath.Join(ws, "armed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(dataDir, "sandboxes", id, "pause")
	imgs, _ := filepath.Glob(filepath.Join(images, "mountpoints-*.img"))
	if len(imgs) != 1 {
		t.Fatalf("mount images: %v", imgs)
	}
	orig, err := os.ReadFile(imgs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := linuxns.AddImageBind(images, "/usr", "/workspace/hostusr", msRelatime); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := pa.Unpause(ctx); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("resume from tampered images: %v", err)
		}
		if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
			t.Fatalf("try %d: a process of the refused resume ran (it wrote the workspace's ran)", i)
		}
		if procs := procsInCgroupOf(id); len(procs) != 0 {
			t.Errorf("processes left by the refused resume: %v", procs)
		}
	}
	if err := os.WriteFile(imgs[0], orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the resumed process never wrote the workspace's ran")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
