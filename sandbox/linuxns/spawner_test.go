//go:build linux

package linuxns_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// With the small init, a sandbox's init is started by the spawn server
// (`sandbox-spawner`), not forked from the gateway: its parent is the
// server, it is born in its user namespace with the sandbox's id map, it
// runs commands, and once destroyed it is gone (reaped by the kernel, no
// zombie), leaving nothing behind.
func TestLinuxSpawnServerStartsInits(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	var log bytes.Buffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Log: slog.New(slog.NewTextHandler(&log, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			spawnerLog, _ := os.ReadFile(filepath.Join(dataDir, "sandboxes", ".spawner.log"))
			t.Logf("driver log:\n%s\nspawner log:\n%s", log.String(), spawnerLog)
		}
	}()
	for i := range 3 {
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-spawned-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		pid := sb.(interface{ InitPID() int }).InitPID()
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		ppid, _ := strconv.Atoi(fields[1])
		if ppid == os.Getpid() {
			t.Errorf("the init (pid %d) is the gateway's own child, want the spawn server's", pid)
		} else if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(ppid) + "/cmdline"); !strings.Contains(string(cmdline), "sandbox-spawner") {
			t.Errorf("the init's parent %d runs %q, want the spawn server", ppid, cmdline)
		}
		uidMap, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/uid_map")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(uidMap)); len(f) != 3 || f[0] != "0" || f[1] == "0" || f[2] != "65536" {
			t.Errorf("the init's uid map: %q, want 0 <its range> 65536", uidMap)
		}
		if out, _, e := runIn(t, sb, "id -u"); e.Code != 0 || strings.TrimSpace(out) == "0" {
			t.Errorf("id -u: %q %+v", out, e)
		}
		// The server ignores SIGCHLD (the kernel reaps its children); the
		// init must not (it reaps its commands for their exit codes), nor
		// its commands, which would inherit an ignored one across exec.
		status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		out, _, e := runIn(t, sb, "grep SigIgn /proc/self/status; sh -c 'exit 3'; echo $?")
		for name, s := range map[string]string{"the init": string(status), "a command": out} {
			for _, l := range strings.Split(s, "\n") {
				if hex, ok := strings.CutPrefix(l, "SigIgn:"); ok {
					if mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64); err != nil || mask&(1<<(uint(unix.SIGCHLD)-1)) != 0 {
						t.Errorf("%s ignores SIGCHLD (SigIgn %s, %v)", name, strings.TrimSpace(hex), err)
					}
				}
			}
		}
		if e.Code != 0 || !strings.HasSuffix(strings.TrimSpace(out), "3") {
			t.Errorf("a child's exit code in a command: %q %+v", out, e)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := os.Stat("/proc/" + strconv.Itoa(pid))
			if os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
				t.Fatalf("the destroyed sandbox's init %d is still there: %s", pid, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	checkNoLeaks(t, dataDir)
}

// newWithSpawner makes a driver on dataDir with the small init init, and
// returns it with the pid of the spawn server it started.
func newWithSpawner(t *testing.T, dataDir string, init []byte) (*linuxns.Driver, int) {
	t.Helper()
	before := ourChildren(t)
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir}, init)
	if err != nil {
		t.Fatal(err)
	}
	for pid := range ourChildren(t) {
		if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); before[pid] == "" && strings.Contains(string(cmdline), "sandbox-spawner") {
			return d, pid
		}
	}
	t.Fatal("no spawn server started")
	return nil, 0
}

// ourChildren returns the pids whose parent is this process, with their
// state (R, S, Z...), zombies included.
func ourChildren(t *testing.T) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			out[pid] = f[0]
		}
	}
	return out
}

// A driver that fails to start (here: --checkpoint without CRIU) leaves
// no spawn server behind: no one could ever use or end it (the gateway
// falls back to the workdir driver and runs on).
func TestLinuxFailedNewLeavesNoSpawnServer(t *testing.T) {
	requireLinux(t)
	init := smallInit(t)
	before := ourChildren(t)
	_, err := linuxns.NewWithInit(sandbox.Config{DataDir: t.TempDir(), Checkpoint: true, CRIU: "/nonexistent/criu"}, init)
	if err == nil {
		t.Fatal("New without CRIU succeeded")
	}
	for pid, state := range ourChildren(t) {
		if _, ok := before[pid]; !ok {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			t.Errorf("the failed New left child %d (state %s, %q)", pid, state, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
}

// A spawn server that dies is reaped (no zombie held by the gateway for
// as long as it runs), and the driver goes on forking inits itself.
func TestLinuxSpawnServerDeathReaped(t *testing.T) {
	requireLinux(t)
	init := smallInit(t)
	dataDir := t.TempDir()
	d, server := newWithSpawner(t, dataDir, init)
	if err := unix.Kill(server, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(server)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed spawn server %d is still there (state %q)", server, ourChildren(t)[server])
		}
		time.Sleep(20 * time.Millisecond)
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-after-spawner"})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, e := runIn(t, sb, "echo ok"); e.Code != 0 || strings.TrimSpace(out) != "ok" {
		t.Errorf("a command after the server died: %q %+v", out, e)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, dataDir)
}

// A spawn server that stops answering (stopped, wedged) costs one create
// a few seconds at most: the driver gives up on it, ends it, and forks
// that init and the next ones itself, rather than have every create wait
// for its deadline and fail.
func TestLinuxSpawnServerStuck(t *testing.T) {
	requireLinux(t)
	init := smallInit(t)
	dataDir := t.TempDir()
	d, server := newWithSpawner(t, dataDir, init)
	if err := unix.Kill(server, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer unix.Kill(server, unix.SIGCONT)
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-stuck-spawner-" + strconv.Itoa(i)})
		cancel()
		if err != nil {
			t.Fatalf("create %d with the server stopped: %v", i, err)
		}
		if out, _, e := runIn(t, sb, "echo ok"); e.Code != 0 || strings.TrimSpace(out) != "ok" {
			t.Errorf("a command: %q %+v", out, e)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(server)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stuck spawn server %d is still there (state %q)", server, ourChildren(t)[server])
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkNoLeaks(t, dataDir)
}

// A Driver no one holds any more ends its spawn server, even a stuck one,
// without blocking the runtime's cleanups on it.
func TestLinuxDroppedDriverEndsSpawnServer(t *testing.T) {
	requireLinux(t)
	init := smallInit(t)
	server := func() int {
		_, pid := newWithSpawner(t, t.TempDir(), init) // the driver dropped at once
		return pid
	}()
	// Stopped: it cannot read its socket's end, so only being killed ends it.
	if err := unix.Kill(server, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer unix.Kill(server, unix.SIGCONT)
	deadline := time.Now().Add(20 * time.Second)
	for {
		runtime.GC()
		if _, err := os.Stat("/proc/" + strconv.Itoa(server)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dropped driver's spawn server %d is still there (state %q)", server, ourChildren(t)[server])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A create whose own deadline passes while the spawn server works does
// not end the server (it was not stuck: the create was short of time),
// and the next create is the server's again.
func TestLinuxSpawnServerOutlivesCreateDeadline(t *testing.T) {
	requireLinux(t)
	init := smallInit(t)
	dataDir := t.TempDir()
	d, server := newWithSpawner(t, dataDir, init)
	for i := range 3 {
		// Stopped for the create's whole deadline: slow, as far as the
		// driver can tell, but within what a create allows.
		if err := unix.Kill(server, unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		if sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-short-" + strconv.Itoa(i)}); err == nil {
			_ = sb.Destroy(context.Background())
		}
		cancel()
		if err := unix.Kill(server, unix.SIGCONT); err != nil {
			t.Fatalf("create %d, short of time: the spawn server is gone (%v)", i, err)
		}
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-after-short"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	pid := sb.(interface{ InitPID() int }).InitPID()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	if ppid := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[1]; ppid != strconv.Itoa(server) {
		t.Errorf("the init's parent is %s, want the spawn server %d (ended by a create short of time?)", ppid, server)
	}
}
