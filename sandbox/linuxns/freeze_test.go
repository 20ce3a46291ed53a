//go:build linux

package linuxns_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// hangGuard bounds how long a test waits for a call that used to hang on
// a frozen sandbox (or loop, for a reap): failing beats blocking the run.
// It is no speed check; the calls take milliseconds.
const hangGuard = 60 * time.Second

// lockedBuffer is a log sink that goroutines may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// freezer is sandbox id's freezer as the host shows it.
type freezer struct{ control, on, off string }

func freezerOf(t *testing.T, id string) freezer {
	t.Helper()
	for _, dir := range cgroupsOf(id) {
		if p := filepath.Join(dir, "freezer.state"); exists(p) {
			return freezer{p, "FROZEN", "THAWED"}
		}
	}
	for _, dir := range cgroupsOf(id) {
		if p := filepath.Join(dir, "cgroup.freeze"); exists(p) {
			return freezer{p, "1", "0"}
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("sandbox %s has no freezer", id)
	}
	t.Skipf("sandbox %s has no freezer on this host", id)
	return freezer{}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// frozen reports whether the kernel has frozen every task of the cgroup.
func (f freezer) frozen() bool {
	if filepath.Base(f.control) == "freezer.state" {
		b, _ := os.ReadFile(f.control)
		return strings.TrimSpace(string(b)) == "FROZEN"
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(f.control), "cgroup.events"))
	return strings.Contains(string(b), "frozen 1\n")
}

// freezeDirect freezes sandbox id through its cgroup files, as a snapshot
// does, behind the driver's back: what a gateway that died in the middle
// of a snapshot leaves.
func freezeDirect(t *testing.T, id string) freezer {
	t.Helper()
	f := freezerOf(t, id)
	if err := os.WriteFile(f.control, []byte(f.on), 0); err != nil {
		t.Fatal(err)
	}
	if !waitFor(hangGuard, f.frozen) {
		t.Fatalf("sandbox %s did not freeze", id)
	}
	return f
}

// bounded runs call, failing the test if it does not return within
// hangGuard.
func bounded(t *testing.T, what string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("%s of a frozen sandbox still runs after %s", what, hangGuard)
		return nil
	}
}

// A gateway that dies during a snapshot leaves the sandbox frozen. The
// next gateway's Adopt thaws it (and says so): commands run, and the
// background job left running goes on.
func TestLinuxAdoptThawsFrozen(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	old := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := old.Create(context.Background(), sandbox.Spec{ID: "sbx-frozen-adopt"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, e := runIn(t, sb, "sleep 100007 >/dev/null 2>&1 &"); e.Code != 0 {
		t.Fatal(e)
	}
	if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	f := freezeDirect(t, "sbx-frozen-adopt")

	var logs lockedBuffer
	d := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	ad, err := d.Adopt(context.Background(), "sbx-frozen-adopt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ad.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if f.frozen() {
		t.Fatal("the adopted sandbox is still frozen")
	}
	var out string
	if err := bounded(t, "a command", func() error {
		out, _, _ = runIn(t, ad, "echo alive; ps -eo args | grep -c '^sleep 100007'")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out != "alive\n1\n" {
		t.Fatalf("adopted sandbox: %q", out)
	}
	if !strings.Contains(logs.String(), "msg=sandbox_thawed") || !strings.Contains(logs.String(), "sandbox=sbx-frozen-adopt") {
		t.Errorf("no sandbox_thawed log line for the adopted sandbox:\n%s", logs.String())
	}
}

// A frozen sandbox (its tasks ignore SIGKILL until thawed) is destroyed,
// stopped, or reaped by a later gateway, cleanly: no error, and no
// process, cgroup, mount, loop device or directory left.
func TestLinuxRemoveFrozen(t *testing.T) {
	start := func(t *testing.T, d sandbox.Driver, id string) (sandbox.Sandbox, hostSandbox) {
		t.Helper()
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, e := runIn(t, sb, "sleep 100008 >/dev/null 2>&1 & sleep 100009 >/dev/null 2>&1 &"); e.Code != 0 {
			t.Fatal(e)
		}
		return sb, hostOf(t, "", id, sb)
	}
	t.Run("destroy", func(t *testing.T) {
		dataDir := t.TempDir()
		t.Cleanup(func() { checkNoLeaks(t, dataDir) })
		d := openLinux(t, sandbox.Config{DataDir: dataDir})
		sb, h := start(t, d, "sbx-frozen-destroy")
		freezeDirect(t, h.id)
		if err := bounded(t, "Destroy", func() error { return sb.Destroy(context.Background()) }); err != nil {
			t.Fatalf("Destroy of a frozen sandbox: %v", err)
		}
		if left := h.survivors(); len(left) > 0 {
			t.Errorf("processes survived Destroy: %+v", left)
		}
	})
	t.Run("stop", func(t *testing.T) {
		dataDir := t.TempDir()
		t.Cleanup(func() { checkNoLeaks(t, dataDir) })
		d := openLinux(t, sandbox.Config{DataDir: dataDir})
		sb, h := start(t, d, "sbx-frozen-stop")
		freezeDirect(t, h.id)
		if err := bounded(t, "Stop", func() error { return sb.(sandbox.Stopper).Stop(context.Background()) }); err != nil {
			t.Fatalf("Stop of a frozen sandbox: %v", err)
		}
		checkStopped(t, h, sb)
		if err := sb.(sandbox.Stopper).Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		if out, _, _ := runIn(t, sb, "echo resumed"); out != "resumed\n" {
			t.Errorf("resumed sandbox: %q", out)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("reap", func(t *testing.T) {
		dataDir := t.TempDir()
		t.Cleanup(func() { checkNoLeaks(t, dataDir) })
		old := openLinux(t, sandbox.Config{DataDir: dataDir})
		sb, h := start(t, old, "sbx-frozen-reap")
		if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
			t.Fatal(err)
		}
		freezeDirect(t, h.id)
		d := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
		if err := bounded(t, "Remove", func() error { return d.Remove(context.Background(), h.id) }); err != nil {
			t.Fatalf("Remove of a frozen sandbox: %v", err)
		}
		if left := h.survivors(); len(left) > 0 {
			t.Errorf("processes survived Remove: %+v", left)
		}
	})
}

// Freeze holds the sandbox's lifecycle: a Stop asked for during a
// snapshot waits for the thaw, then stops the sandbox.
func TestLinuxFreezeHoldsStop(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-freeze-stop"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	f := freezerOf(t, "sbx-freeze-stop")
	thaw, err := sb.(sandbox.Freezer).Freeze(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- sb.(sandbox.Stopper).Stop(context.Background()) }()
	// The Stop has had every chance to run; it must still be waiting.
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned during the snapshot: %v", err)
	default:
	}
	if !f.frozen() || sb.(sandbox.Stopper).Stopped() {
		t.Fatal("the sandbox changed during the snapshot")
	}
	if err := thaw(); err != nil {
		t.Fatalf("thaw: %v", err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop after the thaw: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Stop still waits after the thaw")
	}
	if !sb.(sandbox.Stopper).Stopped() {
		t.Fatal("not stopped")
	}
	// A second call of thaw (a retry) neither fails nor releases twice.
	if err := thaw(); err != nil {
		t.Errorf("second thaw: %v", err)
	}
}
