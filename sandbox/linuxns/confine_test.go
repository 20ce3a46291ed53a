//go:build linux

package linuxns_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// A restore checks what CRIU made of the images before the gateway uses
// it (a tampered image could ask for the host's namespaces, ids or
// cgroups): a fresh sandbox's processes pass; a process in the gateway's
// namespaces, a uid range not the sandbox's, cgroups not the sandbox's
// are refused.
func TestLinuxRestoreCheckConfined(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criuForTest(t)}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-confined"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	mustRun(t, sb, "nohup sleep 1006 >/dev/null 2>&1 &")
	start := time.Now()
	if err := linuxns.CheckConfined(sb, 0, 0, ""); err != nil {
		t.Fatalf("a fresh sandbox: %v", err)
	}
	t.Logf("check of a fresh sandbox (init, a shell, a sleep): %v", time.Since(start))
	host := exec.Command("sleep", "1007")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = host.Process.Kill(); _ = host.Wait() }()
	for _, tc := range []struct {
		name    string
		pid     int
		uidBase int
		id      string
		want    string
	}{
		{"a host process", host.Process.Pid, 0, "", "the gateway's"},
		{"another uid range", 0, 1 << 20, "", "uid_map"},
		{"another sandbox's cgroups", 0, 0, "sbx-other", "cgroup"},
	} {
		err := linuxns.CheckConfined(sb, tc.pid, tc.uidBase, tc.id)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}
