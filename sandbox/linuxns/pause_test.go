//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// frozenState is the v1 freezer state of sandbox id ("" without one).
func frozenState(id string) string {
	b, _ := os.ReadFile("/sys/fs/cgroup/freezer/sandgate/" + id + "/freezer.state")
	if len(b) == 0 {
		b, _ = os.ReadFile("/sys/fs/cgroup/sandgate/" + id + "/cgroup.freeze")
	}
	return strings.TrimSpace(string(b))
}

// Pause freezes every process of a sandbox where it is; a new driver
// adopts it paused (still frozen, its init not dialled), Unpause lets it
// run on where it was, and Destroy of a paused sandbox leaves nothing.
func TestLinuxPauseUnpause(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	id := "sbx-pause-default"
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_ = sb.Destroy(context.Background())
		}
	})
	// A counter that runs on: it moves while running, not while paused.
	if _, stderr, e := runIn(t, sb, "(i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done) >/dev/null 2>&1 &"); e.Code != 0 {
		t.Fatalf("setup: %+v %s", e, stderr)
	}
	pa := sb.(sandbox.Pauser)
	rep, err := pa.Pause(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !pa.Paused() || rep.Method != "freeze" || len(rep.NotKept) == 0 || rep.ResidentBytes <= 0 {
		t.Errorf("Paused() = %v, report %+v", pa.Paused(), rep)
	}
	if s := frozenState(id); s != "FROZEN" && s != "1" {
		t.Errorf("freezer state %q after Pause", s)
	}
	if _, err := pa.Pause(context.Background()); err != nil {
		t.Errorf("second Pause: %v", err)
	}
	// Its init is frozen: a start or a reattach fails at once, with
	// ErrPaused, and never waits on it (a gateway restarting with paused
	// sessions re-attaches their kept processes; it must not hang there).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p, err := sb.Start(ctx, sandbox.Cmd{Command: "true"}); !errors.Is(err, sandbox.ErrPaused) {
		if p != nil {
			p.Kill()
		}
		t.Errorf("Start on a paused sandbox: %v, want ErrPaused", err)
	}
	if _, err := sb.(sandbox.Keeper).Reattach(ctx, "process/none"); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Reattach on a paused sandbox: %v, want ErrPaused", err)
	}
	// A snapshot's freeze and thaw leave a paused sandbox frozen.
	thaw, err := sb.(sandbox.Freezer).Freeze(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	if s := frozenState(id); s != "FROZEN" && s != "1" {
		t.Errorf("a snapshot's thaw woke the paused sandbox: %q", s)
	}

	// Across a driver restart: adopted paused, still frozen.
	if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	destroyed = true
	d2 := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	ad, err := d2.Adopt(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ad.Destroy(context.Background()) })
	if !ad.(sandbox.Pauser).Paused() {
		t.Error("adopted sandbox is not paused")
	}
	if s := frozenState(id); s != "FROZEN" && s != "1" {
		t.Errorf("Adopt thawed the paused sandbox: %q", s)
	}
	if err := ad.(sandbox.Pauser).Unpause(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ad.(sandbox.Pauser).Paused() {
		t.Error("Paused() after Unpause")
	}
	out1, _, _ := runIn(t, ad, "cat /tmp/n; sleep 0.5; cat /tmp/n")
	if f := strings.Fields(out1); len(f) != 2 || f[0] == f[1] {
		t.Errorf("the counter does not run on after Unpause: %q", out1)
	}
	// Destroy of a paused sandbox (checkNoLeaks: nothing left).
	if _, err := ad.(sandbox.Pauser).Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := ad.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A sandbox adopted paused from an init without the seccomp filter is
// listed as unfiltered (/readyz), as one adopted running is.
func TestLinuxAdoptPausedUnfiltered(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	d.DisableSeccomp()
	id := "sbx-pause-unfiltered"
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.(sandbox.Pauser).Pause(context.Background()); err != nil {
		_ = sb.Destroy(context.Background())
		t.Fatal(err)
	}
	if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	d2 := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	ad, err := d2.Adopt(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ad.Destroy(context.Background()) }()
	if !ad.(sandbox.Pauser).Paused() {
		t.Error("adopted sandbox is not paused")
	}
	if un, _ := d2.Seccomp()["unfiltered"].([]string); !slices.Contains(un, id) {
		t.Errorf("unfiltered %v: the paused sandbox without seccomp is not listed", un)
	}
}

// hostHasSwap reports whether /proc/swaps lists a swap area.
func hostHasSwap() bool {
	b, err := os.ReadFile("/proc/swaps")
	return err == nil && len(strings.Split(strings.TrimSpace(string(b)), "\n")) > 1
}

// With swap on the host, a pause moves the frozen processes' memory out:
// a process holding 64 MiB leaves a few hundred KiB of the kernel's own
// (page tables, stacks) resident, and after Unpause it finds its memory
// intact. Before, the reclaim tried to create memory.reclaim on v1,
// failed with EACCES, and never reached memory.force_empty: 64 MiB stayed.
func TestLinuxPauseSwapsOut(t *testing.T) {
	requireLinux(t)
	if !hostHasSwap() {
		if os.Getenv("CI") == "true" {
			t.Fatal("no swap on this host: .ci/run turns a swap file on")
		}
		t.Skip("no swap on this host")
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-pause-swap"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	const hold = `
import signal, time
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = 7
def report(*_):
    open("/tmp/sum", "w").write(str(sum(b[::4096])))
signal.signal(signal.SIGUSR1, report)
import os
open("/tmp/pid", "w").write(str(os.getpid()))
os.rename("/tmp/pid", "/tmp/ready")
while True:
    time.sleep(3600)
`
	if _, stderr, e := runIn(t, sb, "cat > /tmp/hold.py <<'PY'\n"+hold+"PY\n(python3 /tmp/hold.py >/dev/null 2>&1 &) ; for i in $(seq 200); do [ -e /tmp/ready ] && exit 0; sleep 0.05; done; exit 1"); e.Code != 0 {
		t.Fatalf("setup: %+v %s", e, stderr)
	}
	pa := sb.(sandbox.Pauser)
	rep, err := pa.Pause(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("resident after the pause: %d KiB; not kept: %q", rep.ResidentBytes>>10, rep.NotKept)
	if rep.ResidentBytes < 0 || rep.ResidentBytes > 8<<20 {
		t.Errorf("resident after the pause: %d bytes, want under 8 MiB of the 64 MiB held", rep.ResidentBytes)
	}
	for _, n := range rep.NotKept {
		if strings.HasPrefix(n, "memory:") {
			t.Errorf("with swap, the answer still says %q", n)
		}
	}
	if err := pa.Unpause(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, stderr, e := runIn(t, sb, "kill -USR1 $(cat /tmp/ready); for i in $(seq 200); do [ -s /tmp/sum ] && break; sleep 0.05; done; cat /tmp/sum")
	if e.Code != 0 || strings.TrimSpace(out) != "114688" {
		t.Errorf("after Unpause the process's memory sums to %q (%+v %s), want 114688", out, e, stderr)
	}
}
