//go:build linux

package linuxns_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// MS_* bits of CRIU's mount image (flags).
const (
	msRdonly   = 0x1
	msNosuid   = 0x2
	msNodev    = 0x4
	msRelatime = 0x200000
)

// TestLinuxCheckpointRefusesTamperedMounts: CRIU, as root, makes a
// restored sandbox's mounts from the images; a mount image tampered with
// (here the images' own format edited, as an attacker who writes the
// checkpoint dir would) to add a writable bind of a host dir, or to make
// the host's /usr writable, is refused: the restore fails and its
// processes are killed. The untampered checkpoint restores.
func TestLinuxCheckpointRefusesTamperedMounts(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-mnt-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	mustRun(t, src, "mkdir /workspace/hostusr; nohup sleep 1011 >/dev/null 2>&1 &")
	for _, tc := range []struct {
		name   string
		tamper func(dir string) error
		want   string
	}{
		{"a host dir bound", func(dir string) error {
			return linuxns.AddImageBind(dir, "/usr", "/workspace/hostusr", msRelatime)
		}, "a mount at /workspace/hostusr"},
		{"the host's /usr writable", func(dir string) error {
			return linuxns.SetImageMountFlags(dir, "/usr", msRelatime)
		}, "the mount at /usr"},
	} {
		ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.tamper(linuxns.CheckpointImages(ck)); err != nil {
			ck.Close()
			t.Fatalf("%s: tamper: %v", tc.name, err)
		}
		f, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-mnt-fork"})
		ck.Close()
		if err == nil {
			out, _, _ := runIn(t, f, "grep -E ' /(usr|workspace/hostusr) ' /proc/self/mountinfo")
			_ = f.Destroy(ctx)
			t.Errorf("%s: restored; its mounts:\n%s", tc.name, out)
			continue
		}
		if !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal naming %q", tc.name, err, tc.want)
		}
		if procs := procsInCgroupOf("sbx-mnt-fork"); len(procs) != 0 {
			t.Errorf("%s: processes left by the refused restore: %v", tc.name, procs)
		}
	}
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-mnt-fork"})
	t.Logf("untampered restore: %v", time.Since(start))
	ck.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Destroy(ctx)
	if out := mustRun(t, f, "pgrep -c -x sleep; grep -c ' /workspace/hostusr ' /proc/self/mountinfo || true"); out != "1\n0\n" {
		t.Errorf("the untampered fork: %q", out)
	}
}

// TestLinuxPauseCheckpointRefusesTamperedMounts: a resume from a pause
// by checkpoint whose mount image was tampered with to add a bind of a
// host dir is refused, and the sandbox stays paused; its images as they
// were resume it.
func TestLinuxPauseCheckpointRefusesTamperedMounts(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criuForTest(t)}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "sbx-pause-mnt"
	sb, err := d.Create(ctx, sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, "mkdir /workspace/hostusr")
	mustRun(t, sb, varServer)
	setVar(t, sb, "kept")
	pa := sb.(sandbox.Pauser)
	if rep, err := pa.Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause: %+v %v", rep, err)
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
	if err := pa.Unpause(ctx); err == nil || !strings.Contains(err.Error(), "a mount at /workspace/hostusr") {
		t.Errorf("resume from tampered images: %v", err)
	}
	if !pa.Paused() {
		t.Error("not paused after a refused resume")
	}
	if procs := procsInCgroupOf(id); len(procs) != 0 {
		t.Errorf("processes left by the refused resume: %v", procs)
	}
	if err := os.WriteFile(imgs[0], orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pa.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getVar(t, sb); v != "kept" {
		t.Errorf("variable %q after the resume", v)
	}
}

// TestLinuxRestoreMountCheckCost: a running sandbox's mounts pass the
// check against a record of themselves; what the check costs a restore
// (read the init's mountinfo, compare: logged, never asserted).
func TestLinuxRestoreMountCheckCost(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criuForTest(t)}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-mnt-cost"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, "nohup sleep 1012 >/dev/null 2>&1 &")
	var all []time.Duration
	for range 50 {
		took, err := linuxns.MountCheck(sb)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, took)
	}
	slices.Sort(all)
	t.Logf("mount check of a sandbox (init, a shell, a sleep; %s mounts): median %v, max %v over %d",
		strings.TrimSpace(mustRun(t, sb, "wc -l </proc/1/mountinfo")), all[len(all)/2], all[len(all)-1], len(all))
}
