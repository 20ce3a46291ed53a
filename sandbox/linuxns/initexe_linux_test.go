//go:build linux

package linuxns_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// syncBuffer is a log sink for a driver.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runsInit creates a sandbox on d, runs a command in it, and returns what
// its init's /proc/<pid>/exe names.
func runsInit(t *testing.T, d *linuxns.Driver, dataDir, id string) string {
	t.Helper()
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", sb.(interface{ InitPID() int }).InitPID()))
	if out, _, e := runIn(t, sb, "echo ok"); e.Code != 0 || out != "ok\n" {
		t.Errorf("command: %q, exit %+v", out, e)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, dataDir)
	return exe
}

// An embedded init that fails the probe (here a binary that exits at
// once, as any init would on a host that refuses to exec it) does not
// fail the driver: it warns, and sandboxes run the gateway's own binary.
func TestLinuxSmallInitFailingProbeFallsBack(t *testing.T) {
	requireLinux(t)
	bad, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Skip(err)
	}
	var logs syncBuffer
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Log: slog.New(slog.NewTextHandler(&logs, nil))}, bad)
	if err != nil {
		t.Fatalf("a failing small init failed the driver: %v", err)
	}
	if got := d.Report()["init"]; got != "self" {
		t.Errorf("report init %v, want self", got)
	}
	if !strings.Contains(logs.String(), "failed the probe") {
		t.Errorf("no warning that the small init failed the probe: %s", logs.String())
	}
	if exe := runsInit(t, d, dataDir, "sbx-init-fallback"); strings.Contains(exe, "memfd") {
		t.Errorf("the init runs %q, want the gateway's own binary", exe)
	}
}

// A small init that works runs from its sealed memfd (here the test
// binary itself, which is also a sandbox-init).
func TestLinuxSmallInitRunsFromMemfd(t *testing.T) {
	requireLinux(t)
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir}, self)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Report()["init"]; got != "embedded" {
		t.Errorf("report init %v, want embedded", got)
	}
	if exe := runsInit(t, d, dataDir, "sbx-init-memfd"); !strings.HasPrefix(exe, "/memfd:sandgate-init") {
		t.Errorf("the init runs %q, want the memfd", exe)
	}
}

// children lists the pids of this process's children.
func children(t *testing.T) []string {
	t.Helper()
	var out []string
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		out = append(out, strings.Fields(string(b))...)
	}
	return out
}

// A create that fails in the gateway after the init got its spec and
// waits for its workspace and root (ctl.Spec.Late; here an image the
// gateway refuses before it builds its root) leaves no init waiting, and
// nothing else behind.
func TestLinuxFailureAfterSpecLeavesNoInit(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	before := len(children(t))
	_, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-late-fail", Image: &sandbox.Image{Name: "test/no-layers"}})
	if err == nil || !strings.Contains(err.Error(), "layers") {
		t.Fatalf("create: %v, want the image's layers refused", err)
	}
	if !waitFor(10*time.Second, func() bool { return len(children(t)) <= before }) {
		t.Errorf("children left after the failed create: %q (had %d)", children(t), before)
	}
	checkNoLeaks(t, dataDir)
}
