//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// TestCRIUExperiment dumps a checkpointable sandbox with CRIU
// (SANDGATE_CRIU_EXPERIMENT=path of criu). Not a regression test.
func TestCRIUExperiment(t *testing.T) {
	criu := os.Getenv("SANDGATE_CRIU_EXPERIMENT")
	if criu == "" {
		t.Skip("SANDGATE_CRIU_EXPERIMENT unset")
	}
	requireLinux(t)
	initBin := filepath.Join(t.TempDir(), "sandgate-init")
	if out, err := exec.Command("sh", "-c", "CGO_ENABLED=0 go build -trimpath -ldflags \"-s -w\" -o "+initBin+" github.com/sandgate/sandgate/cmd/sandgate-init").CombinedOutput(); err != nil {
		t.Fatalf("build init: %v %s", err, out)
	}
	blob, _ := os.ReadFile(initBin)
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true}, blob)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-criu-exp"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	if _, stderr, e := runIn(t, sb, `nohup python3 -c 'import time; x=bytearray(100<<20); x[0]=7; open("/tmp/ready","w").write("1"); time.sleep(100000)' >/dev/null 2>&1 &
nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &
sleep 1; echo hi > /workspace/f`); e.Code != 0 {
		t.Fatalf("setup: %+v %s", e, stderr)
	}
	st, _ := os.ReadFile(filepath.Join(dataDir, "sandboxes", "sbx-criu-exp", "state.json"))
	t.Logf("state %s", st)
	var pid int
	fmt.Sscanf(string(st)[strings.Index(string(st), `"pid":`)+6:], "%d", &pid)
	out, _ := exec.Command("sh", "-c", fmt.Sprintf("ps -o pid,ppid,cmd --ppid %d; ls -l /proc/%d/fd; cat /proc/%d/mountinfo", pid, pid, pid)).CombinedOutput()
	t.Logf("init %d:\n%s", pid, out)
	img := "/tmp/criu-exp/img"
	os.RemoveAll(img)
	os.MkdirAll(img, 0o700)
	args := append([]string{"dump", "-t", fmt.Sprint(pid), "-D", img, "-o", "dump.log", "-v4", "--leave-running"}, strings.Fields(os.Getenv("SANDGATE_CRIU_DUMP_ARGS"))...)
	t0 := time.Now()
	out, err = exec.Command(criu, args...).CombinedOutput()
	t.Logf("dump %v in %v: %s", err, time.Since(t0), out)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(img, "dump.log"))
		lines := strings.Split(string(b), "\n")
		t.Fatalf("dump failed; log tail:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	if os.Getenv("SANDGATE_CRIU_HOLD") != "" {
		os.WriteFile("/tmp/criu-exp/pid", []byte(fmt.Sprint(pid)), 0o600)
		for {
			if _, err := os.Stat("/tmp/criu-exp/go"); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
	}
}
