//go:build linux

package linuxns_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// shellLoop is a bash that keeps its cd and export, running each line
// written to /tmp/cmd (a FIFO) and writing what it prints to
// /workspace/shell.out.
const shellLoop = `mkfifo /tmp/cmd
nohup bash -c 'cd /etc; export FOO=bar-$$; exec 3<>/tmp/cmd; while read -r l <&3; do eval "$l" >> /workspace/shell.out 2>&1; done' >/dev/null 2>&1 &
echo started`

// pids lists the pids, inside the sandbox, of its python3 and bash.
func pids(t *testing.T, sb sandbox.Sandbox) string {
	t.Helper()
	return mustRun(t, sb, "pgrep -f '[H]TTPServer|[e]xport FOO' | sort -n | tr '\\n' ' '")
}

// A checkpointable sandbox pauses by checkpoint: its processes end, its
// memory is free (little left in its cgroups), its images are in its
// own dir, 0600; Unpause restores it in place with the same pids, the
// server's memory and socket on its loopback, the shell's cd and export;
// a new driver (a gateway restart) adopts it paused and restores it; it
// can pause again after a restore; Stop and Destroy delete the images.
func TestLinuxPauseCheckpoint(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	init := smallInit(t)
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, init)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_ = sb.Destroy(ctx)
		}
	})
	mustRun(t, sb, varServer)
	mustRun(t, sb, shellLoop)
	setVar(t, sb, "before-pause")
	before := pids(t, sb)
	images := filepath.Join(dataDir, "sandboxes", id, "pause")

	pa := sb.(sandbox.Pauser)
	rep, err := pa.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Method != "checkpoint" || !pa.Paused() {
		t.Fatalf("pause: %+v, paused %v", rep, pa.Paused())
	}
	// The server holds 32 MiB: a few MiB left means it was freed (bench
	// row 15a measures the < 1 MiB target).
	if rep.ResidentBytes < 0 || rep.ResidentBytes >= 8<<20 {
		t.Errorf("resident after the pause: %d bytes, want a few KiB", rep.ResidentBytes)
	}
	t.Logf("pause: %+v", rep)
	if procs := procsInCgroupOf(id); len(procs) != 0 {
		t.Errorf("processes left after the pause: %v", procs)
	}
	checkImages(t, images)
	// Pausing it again answers as the pause that made it so.
	if again, err := pa.Pause(ctx); err != nil || again.Method != "checkpoint" || strings.Join(again.NotKept, "\n") != strings.Join(rep.NotKept, "\n") {
		t.Errorf("a second pause: %+v %v, want the first's method and notKept (%+v)", again, err, rep)
	}
	if _, err := sb.Start(ctx, sandbox.Cmd{Command: "true"}); err == nil {
		t.Error("Start on a sandbox paused by checkpoint succeeded")
	}
	// A fork of it is restored from its images; it stays paused.
	ck, err := sb.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fork, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-pause-ck-fork"})
	if err != nil {
		ck.Close()
		t.Fatal(err)
	}
	if v := getVar(t, fork); v != "before-pause" {
		t.Errorf("fork of the paused sandbox: variable %q", v)
	}
	if err := errors.Join(fork.Destroy(ctx), ck.Close()); err != nil {
		t.Fatal(err)
	}
	if !pa.Paused() {
		t.Error("the fork resumed its paused source")
	}
	checkImages(t, images)

	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if pa.Paused() {
		t.Error("Paused() after Unpause")
	}
	checkResumedImagesGone(t, images)
	if after := pids(t, sb); after != before {
		t.Errorf("pids %q after the restore, %q before", after, before)
	}
	if v := getVar(t, sb); v != "before-pause" {
		t.Errorf("server's variable %q after the restore", v)
	}
	mustRun(t, sb, `echo 'echo "$PWD $FOO"' > /tmp/cmd; for i in $(seq 100); do [ -s /workspace/shell.out ] && break; sleep 0.05; done`)
	if out := mustRun(t, sb, "cat /workspace/shell.out"); !strings.HasPrefix(out, "/etc bar-") {
		t.Errorf("shell state after the restore: %q, want /etc bar-<pid>", out)
	}

	// A restored sandbox is checkpointed again: its second pause is a
	// checkpoint too, and the resume finds the processes as they were.
	setVar(t, sb, "second")
	before = pids(t, sb)
	rep2, err := pa.Pause(ctx)
	if err != nil || rep2.Method != "checkpoint" {
		t.Fatalf("second pause (of a restored sandbox): %+v %v", rep2, err)
	}
	if rep2.ResidentBytes < 0 || rep2.ResidentBytes >= 8<<20 {
		t.Errorf("resident after the second pause: %d bytes, want a few KiB", rep2.ResidentBytes)
	}
	if procs := procsInCgroupOf(id); len(procs) != 0 {
		t.Errorf("processes left after the second pause: %v", procs)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	checkResumedImagesGone(t, images)
	if v := getVar(t, sb); v != "second" {
		t.Errorf("server's variable %q after a second pause by checkpoint", v)
	}
	if after := pids(t, sb); after != before {
		t.Errorf("pids %q after the second restore, %q before", after, before)
	}
	if err := sb.(sandbox.Stopper).Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.(sandbox.Stopper).Resume(ctx); err != nil {
		t.Fatal(err)
	}

	// Across a driver restart: adopted paused by checkpoint, restored by
	// the new driver.
	mustRun(t, sb, varServer)
	setVar(t, sb, "second")
	before = pids(t, sb)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause after a stop and a resume: %+v %v", rep, err)
	}
	if err := sb.(sandbox.Detacher).Detach(ctx); err != nil {
		t.Fatal(err)
	}
	destroyed = true
	d2, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, KeepOrphans: true}, init)
	if err != nil {
		t.Fatal(err)
	}
	ad, err := d2.Adopt(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	adDestroyed := false
	t.Cleanup(func() {
		if !adDestroyed {
			_ = ad.Destroy(ctx)
		}
	})
	apa := ad.(sandbox.Pauser)
	if !apa.Paused() {
		t.Fatal("adopted sandbox is not paused")
	}
	if err := apa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getVar(t, ad); v != "second" {
		t.Errorf("server's variable %q after a restore by a new driver", v)
	}
	checkResumedImagesGone(t, images)
	if after := pids(t, ad); after != before {
		t.Errorf("pids %q after the second restore, %q before", after, before)
	}

	// A sandbox the new driver restored is paused by checkpoint again,
	// and across another restart: a third driver adopts and restores it.
	setVar(t, ad, "third")
	if rep, err := apa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause of a sandbox a new driver restored: %+v %v", rep, err)
	}
	if err := ad.(sandbox.Detacher).Detach(ctx); err != nil {
		t.Fatal(err)
	}
	adDestroyed = true
	d3, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, KeepOrphans: true}, init)
	if err != nil {
		t.Fatal(err)
	}
	if ad, err = d3.Adopt(ctx, id); err != nil {
		t.Fatal(err)
	}
	adDestroyed = false
	apa = ad.(sandbox.Pauser)
	if !apa.Paused() {
		t.Fatal("sandbox adopted by a third driver is not paused")
	}
	if err := apa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getVar(t, ad); v != "third" {
		t.Errorf("server's variable %q after a pause of a restored sandbox and a restart", v)
	}
	checkResumedImagesGone(t, images)
	if after := pids(t, ad); after != before {
		t.Errorf("pids %q after the third restore, %q before", after, before)
	}

	// Stop of a sandbox paused by checkpoint deletes its images; so does
	// Destroy.
	if err := ad.(sandbox.Stopper).Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ad.(sandbox.Stopper).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if rep, err := apa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	checkImages(t, images)
	if err := ad.(sandbox.Stopper).Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(images); !os.IsNotExist(err) {
		t.Errorf("images after Stop: %v", err)
	}
	if err := ad.(sandbox.Stopper).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if rep, err := apa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	checkImages(t, images)
	adDestroyed = true
	if err := ad.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(images); !os.IsNotExist(err) {
		t.Errorf("images after Destroy: %v", err)
	}
}

// checkResumedImagesGone checks that the images of a pause just resumed,
// which go after the resume's answer, are soon gone.
func checkResumedImagesGone(t *testing.T, images string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(images)
		if os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("images of a resumed pause still there: %v", err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkImages checks that a pause's images are there: a 0700 dir of
// 0600 files.
func checkImages(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("pause images: %v", err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("images dir mode %v", fi.Mode())
	}
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n++
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("image %s mode %v", e.Name(), fi.Mode())
			}
		}
	}
	if n == 0 {
		t.Error("no images")
	}
}

// A sandbox whose gateway holds a connection to one of its processes (a
// command under way), or paused while MaxPauseDumps others dump, is
// paused by a freeze, and the answer says why.
func TestLinuxPauseCheckpointFallsBack(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-pause-ck-fb"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	pa := sb.(sandbox.Pauser)
	// MaxPauseDumps dumps under way: a freeze, which says so.
	release := d.HoldPauseDumps()
	rep, err := pa.Pause(ctx)
	release()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Method != "freeze" || !strings.Contains(strings.Join(rep.NotKept, "\n"), "sessions already") {
		t.Errorf("pause with every dump slot taken: %+v", rep)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(ctx, sandbox.Cmd{Command: "exec sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	rep, err = pa.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Method != "freeze" || !strings.Contains(strings.Join(rep.NotKept, "\n"), "open connection") {
		t.Errorf("pause with a command under way: %+v", rep)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, sb, "echo ok"); out != "ok\n" {
		t.Errorf("after the unpause: %q", out)
	}
}

// A dump that fails leaves the sandbox running as it was, paused by a
// freeze, and the answer carries CRIU's error.
func TestLinuxPauseCheckpointDumpFails(t *testing.T) {
	requireLinux(t)
	real := criuForTest(t)
	fake := filepath.Join(t.TempDir(), "criu")
	script := "#!/bin/sh\n[ \"$1\" = dump ] && { echo 'Error (test): this dump is refused' >&2; exit 1; }\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: fake}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-df"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, varServer)
	setVar(t, sb, "kept")
	pa := sb.(sandbox.Pauser)
	rep, err := pa.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The answer says the checkpoint failed, never CRIU's own lines (host
	// paths and inodes): those are in the gateway's log.
	if nk := strings.Join(rep.NotKept, "\n"); rep.Method != "freeze" || !strings.Contains(nk, "the checkpoint failed") || strings.Contains(nk, "this dump is refused") {
		t.Errorf("pause with a failing dump: %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id, "pause")); !os.IsNotExist(err) {
		t.Errorf("images dir after a failed dump: %v", err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getVar(t, sb); v != "kept" {
		t.Errorf("variable %q after a failed dump and a freeze", v)
	}
}

// With PauseFreeze (serve --pause-freeze) a checkpointable sandbox is
// paused by a freeze, as without --checkpoint.
func TestLinuxPauseFreezeUnderCheckpoint(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, PauseFreeze: true}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-pause-ck-frz"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	pa := sb.(sandbox.Pauser)
	rep, err := pa.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Method != "freeze" || strings.Contains(strings.Join(rep.NotKept, "\n"), "not checkpointed") {
		t.Errorf("pause under PauseFreeze: %+v", rep)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
}

// A restore that fails leaves the sandbox paused with its images, and
// says why; the next Unpause restores it.
func TestLinuxPauseCheckpointRestoreFails(t *testing.T) {
	requireLinux(t)
	real := criuForTest(t)
	tmp := t.TempDir()
	fake, once := filepath.Join(tmp, "criu"), filepath.Join(tmp, "failed-once")
	// Its log ("restore -D <images> ..."), which goes with the images,
	// says where it stopped.
	script := "#!/bin/sh\nif [ \"$1\" = restore ] && [ ! -e " + once + " ]; then touch " + once + "; echo 'Error (test): this restore is refused' >&2; " +
		"printf '(00.001) restore: a step\\n(00.002) restore: stuck in the last step\\n' > \"$3/restore.log\"; exit 1; fi\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	var logs lockedBuffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: fake,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-rf"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, varServer)
	setVar(t, sb, "kept")
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	images := filepath.Join(dataDir, "sandboxes", id, "pause")
	if err := pa.Unpause(ctx); err == nil || !strings.Contains(err.Error(), "this restore is refused") {
		t.Errorf("failing restore: %v", err)
	}
	// CRIU's log of the failed restore is kept in the gateway's.
	if l := logs.String(); !strings.Contains(l, "criu_restore_failed") || !strings.Contains(l, "stuck in the last step") {
		t.Errorf("the gateway's log lacks the failed restore's CRIU log: %s", l)
	}
	if !pa.Paused() {
		t.Error("not paused after a failed restore")
	}
	checkImages(t, images)
	if procs := procsInCgroupOf(id); len(procs) != 0 {
		t.Errorf("processes left by the failed restore: %v", procs)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getVar(t, sb); v != "kept" {
		t.Errorf("variable %q after the second try", v)
	}
}

// A gateway that restarts while criu dumps a sandbox it pauses leaves
// that criu running: the next gateway's Adopt waits for it to end before
// it judges the sandbox (running, or paused in whole images), rather than
// adopt it running, and delete its images, under a criu that goes on to
// end its processes.
func TestLinuxAdoptWaitsForPauseDump(t *testing.T) {
	requireLinux(t)
	real := criuForTest(t)
	tmp := t.TempDir()
	fake, started := filepath.Join(tmp, "criu"), filepath.Join(tmp, "started")
	// criu itself (exec'd) holds the lock: nothing else does.
	script := "#!/bin/sh\nif [ \"$1\" = dump ]; then touch " + started + "; sleep 2; exec \"" + real + "\" \"$@\"; fi\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	init := smallInit(t)
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: fake}, init)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-adw"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	paused := make(chan error, 1)
	go func() { _, err := sb.(sandbox.Pauser).Pause(ctx); paused <- err }()
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		select {
		case err := <-paused:
			t.Fatalf("pause ended before its dump began: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The gateway that paused it is gone, as far as the next one knows.
	d2, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: fake, KeepOrphans: true}, init)
	if err != nil {
		t.Fatal(err)
	}
	ad, aerr := d2.Adopt(ctx, id)
	if pids := dumpsOf(t, filepath.Join(dataDir, "sandboxes", id, "pause")); len(pids) > 0 {
		t.Errorf("Adopt answered (%v) while criu (%v) still dumped the sandbox", aerr, pids)
	}
	if ad != nil {
		_ = ad.(sandbox.Detacher).Detach(ctx) // d's to destroy
	}
	<-paused
}

// A resume from a pause by checkpoint restores into the sandbox's own
// cgroups as they are (--manage-cgroups=soft): a limit changed while it
// was paused holds after the resume, not the one the images recorded, and
// its processes are under it.
func TestLinuxPauseCheckpointKeepsCgroupLimits(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-cg"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id, Limits: sandbox.Limits{Pids: 91}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, "nohup sleep 1008 >/dev/null 2>&1 &")
	var limits []string
	for _, p := range []string{"/sys/fs/cgroup/pids/sandgate/" + id + "/pids.max", "/sys/fs/cgroup/pids/sandgate/" + id + "/procs/pids.max",
		"/sys/fs/cgroup/sandgate/" + id + "/pids.max", "/sys/fs/cgroup/sandgate/" + id + "/procs/pids.max"} {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == "91" {
			limits = append(limits, p)
		}
	}
	if len(limits) == 0 {
		t.Fatal("no pids.max of 91 found for the sandbox")
	}
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	for _, p := range limits {
		if err := os.WriteFile(p, []byte("57"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range limits {
		if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) != "57" {
			t.Errorf("%s after the resume: %q, want the 57 set while paused", p, b)
		}
	}
	if out := mustRun(t, sb, "pgrep -x sleep | wc -l"); strings.TrimSpace(out) != "1" {
		t.Errorf("restored sleep: %q", out)
	}
	if procs := procsInCgroupOf(id); len(procs) < 2 {
		t.Errorf("processes in the sandbox's cgroups after the resume: %v", procs)
	}
}

// socketFDs counts the sockets among this process's descriptors.
func socketFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// A gateway that lets go of a sandbox paused by checkpoint (Detach, at a
// shutdown that keeps sandboxes) closes the init's sockets it held for
// the restore: the next gateway restores without them.
func TestLinuxPauseCheckpointDetachClosesHeld(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	init := smallInit(t)
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, init)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-det"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "true")
	before := socketFDs(t)
	if rep, err := sb.(sandbox.Pauser).Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if held := socketFDs(t); held <= before {
		t.Fatalf("%d sockets open while paused, %d before: none held?", held, before)
	}
	if err := sb.(sandbox.Detacher).Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if after := socketFDs(t); after > before {
		t.Errorf("%d sockets open after Detach, %d before the pause", after, before)
	}
	d2, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, KeepOrphans: true}, init)
	if err != nil {
		t.Fatal(err)
	}
	ad, err := d2.Adopt(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer ad.Destroy(ctx)
	if err := ad.(sandbox.Pauser).Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	mustRun(t, ad, "true")
}

// A pause whose dump ended the processes but whose images could not be
// completed (pause.json not written) loses the sandbox: the pause says so
// and the sandbox ends (Done), so that its session fails, rather than
// stay running, as far as the gateway knows, with no init.
func TestLinuxPauseCheckpointLostEnds(t *testing.T) {
	requireLinux(t)
	real := criuForTest(t)
	fake := filepath.Join(t.TempDir(), "criu")
	// After a real dump, a directory where pause.json goes.
	script := "#!/bin/sh\nif [ \"$1\" = dump ]; then \"" + real + "\" \"$@\" || exit $?; mkdir \"$5/pause.json\"; exit 0; fi\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: fake}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-pause-ck-lost"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, "true")
	if rep, err := sb.(sandbox.Pauser).Pause(ctx); err == nil {
		t.Fatalf("pause with no pause.json written: %+v, want an error", rep)
	}
	select {
	case <-sb.(sandbox.Ender).Done():
	case <-time.After(10 * time.Second):
		t.Error("the lost sandbox did not end")
	}
}

// A zombie (a child its parent has not reaped) is dumped and restored as
// one: the restore's confinement check passes over it (it runs nothing,
// and has no namespaces to read) rather than refuse the resume for good.
func TestLinuxPauseCheckpointZombie(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-pause-ck-zomb"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	// sleep 1010 never reaps the shell's true: a zombie under it.
	mustRun(t, sb, "nohup sh -c 'true & exec sleep 1010' >/dev/null 2>&1 &")
	deadline := time.Now().Add(10 * time.Second)
	for mustRun(t, sb, "ps -eo stat= | grep -c '^Z' || true") == "0\n" {
		if time.Now().After(deadline) {
			t.Fatal("no zombie")
		}
		time.Sleep(50 * time.Millisecond)
	}
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, sb, "pgrep -x sleep | wc -l"); strings.TrimSpace(out) != "1" {
		t.Errorf("restored sleep: %q", out)
	}
}

// A file of the workspace that a process holds open, changed while the
// sandbox is paused by checkpoint (a call that wrote to the workspace as
// the pause came), does not make the resume fail for good (CRIU's "bad
// size"): the process goes on with the file as it is now, as after a
// freeze.
func TestLinuxPauseCheckpointFileChanged(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-pause-ck-fch"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, "echo hi > /workspace/held.txt; nohup sleep 1011 < /workspace/held.txt >/dev/null 2>&1 &")
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	f, err := os.OpenFile(filepath.Join(sb.Workdir(), "held.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, werr := f.WriteString("more\n")
	if err := errors.Join(werr, f.Close()); err != nil {
		t.Fatal(err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, sb, "cat /proc/$(pgrep -x sleep)/fd/0"); out != "hi\nmore\n" {
		t.Errorf("the restored sleep's stdin reads %q", out)
	}
}

// A gateway that dies once criu has dumped a sandbox it pauses, but
// before it completed the pause (pause.json), leaves whole images: the
// next gateway adopts the sandbox paused (criu's stats-dump says the dump
// succeeded) and restores it, rather than lose it.
func TestLinuxAdoptPauseDumpedNotCompleted(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	init := smallInit(t)
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, init)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-rec"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, varServer)
	setVar(t, sb, "dumped")
	if rep, err := sb.(sandbox.Pauser).Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if err := sb.(sandbox.Detacher).Detach(ctx); err != nil {
		t.Fatal(err)
	}
	// As the images were when criu ended, before the gateway's rename.
	images := filepath.Join(dataDir, "sandboxes", id, "pause")
	if err := os.Rename(filepath.Join(images, "pause.json"), filepath.Join(images, "pause.json.pending")); err != nil {
		t.Fatal(err)
	}
	d2, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, KeepOrphans: true}, init)
	if err != nil {
		t.Fatal(err)
	}
	ad, err := d2.Adopt(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer ad.Destroy(ctx)
	pa := ad.(sandbox.Pauser)
	if !pa.Paused() {
		t.Fatal("adopted sandbox is not paused")
	}
	checkImages(t, images)
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getVar(t, ad); v != "dumped" {
		t.Errorf("variable %q after the recovered pause", v)
	}
}

// dumpsOf lists the processes that dump into images dir dir (criu, or
// the test's wrapper of it).
func dumpsOf(t *testing.T, dir string) []string {
	t.Helper()
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if slices.Contains(args, "dump") && slices.Contains(args, dir) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestLinuxPauseCheckpointRestoredCPU: a resume's restored_cpu_ms is the
// CPU its restore took in the session's cgroups, not also what the
// session took there before its pause (a resume restores into the same
// cgroups).
func TestLinuxPauseCheckpointRestoredCPU(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	var logs lockedBuffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-ck-cpu"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	// Far more CPU in the session's cgroups than a restore of it takes.
	mustRun(t, sb, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	u := cgroup.ReadUsage(cgroupsOf(id))
	if u.CPUSeconds == nil {
		t.Fatalf("no CPU counter in %v", cgroupsOf(id))
	}
	before := time.Duration(*u.CPUSeconds * float64(time.Second))
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	var restored time.Duration
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if !strings.Contains(line, "msg=sandbox_unpaused") {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "restored_cpu_ms="); ok {
				ms, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				restored = time.Duration(ms * float64(time.Millisecond))
			}
		}
	}
	if restored <= 0 {
		t.Fatalf("no restored_cpu_ms in the resume's line: %s", logs.String())
	}
	if restored >= before {
		t.Errorf("restored_cpu_ms %v counts the %v the session took before its pause", restored, before)
	}
	t.Logf("restored_cpu %v, the session's CPU before its pause %v", restored, before)
}

// TestLinuxPauseCheckpointReleasedKept: kept processes let go of just
// before a pause by checkpoint (as the gateway does, sandbox.Releaser)
// leave the init control connections whose gateway end is closed, which
// the dump may catch before the init closes its own: the image then holds
// connections with no peer, and the resume must not wait for a peer CRIU
// makes up for them (handed back with --inherit-fd, it hung until the
// timeout killed criu, at every try). Several sandboxes, each with many
// releases, so that dumps catch some; each resume must succeed. (A new
// sandbox each round: each kept process holds pipes whose size, 1 MiB, a
// restore sets again, which fails past the sandbox user's share of pipe
// memory, fs.pipe-user-pages-soft.)
func TestLinuxPauseCheckpointReleasedKept(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	caught := 0
	for r := range 6 {
		id := fmt.Sprintf("sbx-pause-ck-rel%d", r)
		sb, err := d.Create(ctx, sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		pa := sb.(sandbox.Pauser)
		for i := range 12 {
			p, err := sb.Start(ctx, sandbox.Cmd{Keep: fmt.Sprintf("k%d", i), Command: "sleep 1000"})
			if err != nil {
				_ = sb.Destroy(ctx)
				t.Fatal(err)
			}
			p.(sandbox.Releaser).Release()
		}
		if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
			_ = sb.Destroy(ctx)
			t.Fatalf("pause %d: %+v %v", r, rep, err)
		}
		var meta struct {
			Conns []uint64 `json:"conns"`
		}
		if b, err := os.ReadFile(filepath.Join(dataDir, "sandboxes", id, "pause", "pause.json")); err == nil && json.Unmarshal(b, &meta) == nil && len(meta.Conns) > 0 {
			caught++
		}
		uctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = pa.Unpause(uctx)
		cancel()
		_ = sb.Destroy(ctx)
		if err != nil {
			t.Fatalf("resume %d (connections closed by the gateway at the dump: %v): %v", r, meta.Conns, err)
		}
	}
	t.Logf("%d of 6 pauses caught connections the gateway had closed", caught)
}
