//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// Limits are what the configuration says, and the disk limits are
// filesystems that run out, fallocate included.
func TestLinuxLimits(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	limits := sandbox.Limits{MemoryBytes: 96 << 20, Pids: 40, CPUs: 0.5, TmpBytes: 8 << 20, WorkspaceBytes: 48 << 20}
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: limits})
	id := "sbx-limits"
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())

	for file, want := range map[string]string{
		"memory/sandgate/" + id + "/procs/memory.limit_in_bytes": "100663296",
		"pids/sandgate/" + id + "/procs/pids.max":                "40",
		"cpu/sandgate/" + id + "/procs/cpu.cfs_quota_us":         "50000",
	} {
		b, err := os.ReadFile("/sys/fs/cgroup/" + file)
		if err != nil {
			t.Logf("%s: %v (not cgroup v1 here)", file, err)
			continue
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	tests := []struct{ name, cmd string }{
		{"workspace write", "head -c 64m /dev/zero > /workspace/big"},
		{"workspace fallocate", "rm -f /workspace/big; fallocate -l 64m /workspace/big"},
		{"tmp write", "head -c 16m /dev/zero > /tmp/big"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, exit := runIn(t, sb, tt.cmd)
			if exit.Code == 0 || !strings.Contains(stderr, "No space left on device") {
				t.Fatalf("%q: exit %+v, stderr %q; want ENOSPC", tt.cmd, exit, stderr)
			}
		})
	}
	out, _, _ := runIn(t, sb, "rm -f /workspace/big /tmp/big; df -k /workspace /tmp | tail -n +2 | awk '{print $2}'")
	t.Logf("workspace and /tmp sizes (KiB): %q", out)
	out, _, _ = runIn(t, sb, "sh -c 'for i in $(seq 60); do sleep 30 >/dev/null 2>&1 & done' 2>/dev/null; ps -eo args | grep -c '^sleep 30'")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n == 0 || n >= 40 {
		t.Errorf("%d of 60 sleeps run under a pids limit of 40", n)
	}
}

// Destroy kills what runs, makes Start fail, and can be called again.
func TestLinuxDestroy(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-destroy"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "echo up; exec sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(p.Stdout(), buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan sandbox.Exit, 1)
	go func() {
		e, _ := p.Wait()
		done <- e
	}()
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if e.Signal != "KILL" {
			t.Fatalf("command ended %+v, want KILL", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after Destroy")
	}
	p.Stdout().Close()
	p.Stderr().Close()
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if _, err := sb.Start(context.Background(), sandbox.Cmd{Command: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Start after Destroy: %v, want ErrClosed", err)
	}
	// Kill of a running command: SIGHUP to its group.
	sb2, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-destroy2"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Destroy(context.Background())
	p, err = sb2.Start(context.Background(), sandbox.Cmd{Command: "sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if e, err := p.Wait(); err != nil || e.Signal != "HUP" {
		t.Fatalf("after Kill: %+v %v, want HUP", e, err)
	}
	p.Stdout().Close()
	p.Stderr().Close()
}

// With KeepOrphans, a new driver on the same data dir finds the sandboxes
// of the previous one running and adopts them: files, background
// processes and the control socket are all there.
func TestLinuxAdoptAfterRestart(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	old := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := old.Create(context.Background(), sandbox.Spec{ID: "sbx-adopt"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, e := runIn(t, sb, "echo kept > /workspace/f; echo tmp > /tmp/f; sleep 100006 >/dev/null 2>&1 &"); e.Code != 0 {
		t.Fatal(e)
	}
	// The old gateway lets go of it, as when it stops keeping sandboxes.
	if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(context.Background(), sandbox.Cmd{Command: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Start after Detach: %v, want ErrClosed", err)
	}

	d := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	ids, err := d.List(context.Background())
	if err != nil || len(ids) != 1 || ids[0] != "sbx-adopt" {
		t.Fatalf("List = %v, %v", ids, err)
	}
	if _, err := d.Adopt(context.Background(), "sbx-nope"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Adopt of a missing sandbox: %v", err)
	}
	ad, err := d.Adopt(context.Background(), "sbx-adopt")
	if err != nil {
		t.Fatal(err)
	}
	out, _, _ := runIn(t, ad, "cat /workspace/f /tmp/f; ps -eo args | grep -c '^sleep 100006'")
	if out != "kept\ntmp\n1\n" {
		t.Fatalf("adopted sandbox: %q", out)
	}
	// A new sandbox does not take the adopted one's uids.
	sb2, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-adopt2"})
	if err != nil {
		t.Fatal(err)
	}
	out2, _, _ := runIn(t, sb2, "ps -eo args | grep -c '^sleep 100006'")
	if out2 != "0\n" {
		t.Fatalf("new sandbox sees the adopted one's processes: %q", out2)
	}
	if ad.(interface{ HostUID() int }).HostUID() == sb2.(interface{ HostUID() int }).HostUID() {
		t.Fatal("new sandbox shares the adopted one's uids")
	}
	pid := ad.(interface{ InitPID() int }).InitPID()
	for _, s := range []sandbox.Sandbox{ad, sb2} {
		if err := s.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if alive(pid) {
		t.Fatalf("adopted init %d still runs after Destroy", pid)
	}
}

// Without KeepOrphans, Open reaps what a previous run left: its inits,
// cgroups, mounts and directories.
func TestLinuxOpenReapsOrphans(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	old := openLinux(t, sandbox.Config{DataDir: dataDir})
	var pids []int
	for _, id := range []string{"sbx-orphan1", "sbx-orphan2"} {
		sb, err := old.Create(context.Background(), sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		runIn(t, sb, "setsid sleep 100008 >/dev/null 2>&1 &")
		pids = append(pids, sb.(interface{ InitPID() int }).InitPID())
	}
	// One whose state file is lost: its cgroups still lead to its init.
	if err := os.Remove(filepath.Join(dataDir, "sandboxes", "sbx-orphan2", "state.json")); err != nil {
		t.Fatal(err)
	}
	// A half-made sandbox: a directory with a mounted workspace, no state.
	half := filepath.Join(dataDir, "sandboxes", "sbx-half")
	if err := os.MkdirAll(filepath.Join(half, "workspace"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", filepath.Join(half, "workspace"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	openLinux(t, sandbox.Config{DataDir: dataDir})
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("orphan init %d survived the new Open", pid)
		}
	}
	if leaks := leaksUnder(dataDir); len(leaks) > 0 {
		t.Fatalf("after reaping: %v", leaks)
	}
	for _, id := range []string{"sbx-orphan1", "sbx-orphan2", "sbx-half"} {
		if cg := cgroupsOf(id); len(cg) > 0 {
			t.Errorf("after reaping: cgroups %v", cg)
		}
	}
}

// The linux driver plugs into the gateway's restart handling.
var _ sandbox.Reattacher = (*linuxns.Driver)(nil)

// A sandbox whose data dir is deleted from under it (its control socket
// with it) can never be reached again: its init ends it.
func TestLinuxUnreachableSandboxEndsItself(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	d.SetSocketCheck(100 * time.Millisecond)
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-lost"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	pid := sb.(interface{ InitPID() int }).InitPID()
	if err := os.Remove(filepath.Join(dataDir, "sandboxes", "sbx-lost", "control.sock")); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return !alive(pid) }) {
		t.Fatal("the init lives on without a control socket")
	}
}

// Sandboxes made and destroyed at the same time do not trip over each
// other (loop devices, uid ranges, cgroups).
func TestLinuxConcurrentCreate(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			id := "sbx-par-" + strconv.Itoa(i)
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
			if err != nil {
				errs <- err
				return
			}
			defer sb.Destroy(context.Background())
			p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "hostname; id -u"})
			if err != nil {
				errs <- err
				return
			}
			p.Stdin().Close()
			go io.Copy(io.Discard, p.Stderr())
			out, _ := io.ReadAll(p.Stdout())
			if _, err := p.Wait(); err != nil {
				errs <- err
				return
			}
			if want := sandbox.ShortID(id) + "\n1000\n"; string(out) != want {
				errs <- fmt.Errorf("%s: %q, want %q", id, out, want)
				return
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// Where no ext4 image can be made, the workspace is a size-limited tmpfs.
func TestLinuxTmpfsWorkspaceFallback(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 8 << 20}})
	d.UseTmpfsWorkspaces()
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-tmpfs-ws"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	out, stderr, e := runIn(t, sb, "stat -f -c %T /workspace; stat -c %u /workspace; touch /workspace/ok && head -c 16m /dev/zero > /workspace/big")
	if out != "tmpfs\n1000\n" || e.Code == 0 || !strings.Contains(stderr, "No space left") {
		t.Fatalf("tmpfs workspace: %q %q %+v", out, stderr, e)
	}
}

// On cgroup v2 the init is cloned straight into its cgroup.
func TestLinuxCgroupV2Plumbing(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	var v2 string
	for _, m := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st syscall.Statfs_t
		if syscall.Statfs(m, &st) == nil && st.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
			v2 = m
			break
		}
	}
	if v2 == "" {
		t.Skip("no cgroup v2 mount")
	}
	if _, err := os.Stat(v2 + "/sandgate"); os.IsNotExist(err) {
		t.Cleanup(func() { _ = os.Remove(v2 + "/sandgate") })
	}
	if err := d.UseCgroupV2(v2); err != nil {
		t.Skip(err)
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-v2"})
	if err != nil {
		t.Fatal(err)
	}
	pid := sb.(interface{ InitPID() int }).InitPID()
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if !strings.Contains(string(b), "0::/sandgate/sbx-v2\n") {
		t.Errorf("init's cgroups:\n%s", b)
	}
	out, _, _ := runIn(t, sb, "grep '^0::' /proc/self/cgroup")
	if out != "0::/\n" {
		t.Errorf("command sees its cgroup as %q", out)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v2 + "/sandgate/sbx-v2"); !os.IsNotExist(err) {
		t.Errorf("v2 cgroup left: %v", err)
	}
}

// One sandbox cannot take every terminal of the host: its devpts stops at
// 64, and what it holds is released with it.
func TestLinuxTerminalsCapped(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-ptys"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	const script = `python3 -c '
import errno, os
fds = []
try:
    while True:
        fds.append(os.openpty())
except OSError as e:
    print(len(fds), errno.errorcode[e.errno])
'`
	out, stderr, exit := runIn(t, sb, script)
	if exit.Code != 0 || strings.TrimSpace(out) != "64 ENOSPC" {
		t.Fatalf("opening terminals until refused: %q %q %+v", out, stderr, exit)
	}
}

// A session's own limits (Spec.Limits) replace the driver's: a 256 MiB
// sandbox cannot hold 400 MiB, a 1024 MiB one can; pids and CPUs follow
// the spec too, and what the spec leaves zero is the driver's.
func TestLinuxPerSessionLimits(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{MemoryBytes: 512 << 20, Pids: 64}})
	// tail keeps the one 400 MiB line in memory.
	const alloc = "head -c 400m /dev/zero | tail | wc -c"
	for _, tc := range []struct {
		id       string
		limits   sandbox.Limits
		killed   bool
		cgroupV1 map[string]string
	}{
		{"sbx-mem256", sandbox.Limits{MemoryBytes: 256 << 20, Pids: 100, CPUs: 2}, true, map[string]string{
			"memory.limit_in_bytes": "268435456", "pids.max": "100", "cpu.cfs_quota_us": "200000",
		}},
		{"sbx-mem1024", sandbox.Limits{MemoryBytes: 1024 << 20}, false, map[string]string{
			"memory.limit_in_bytes": "1073741824", "pids.max": "64", "cpu.cfs_quota_us": "100000",
		}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: tc.id, Limits: tc.limits})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			for file, want := range tc.cgroupV1 {
				ctrl, _, _ := strings.Cut(file, ".")
				b, err := os.ReadFile("/sys/fs/cgroup/" + ctrl + "/sandgate/" + tc.id + "/procs/" + file)
				if err != nil {
					t.Logf("%s: %v (not cgroup v1 here)", file, err)
					continue
				}
				if got := strings.TrimSpace(string(b)); got != want {
					t.Errorf("%s = %s, want %s", file, got, want)
				}
			}
			stdout, stderr, exit := runIn(t, sb, alloc)
			if tc.killed {
				if exit.Code == 0 && strings.TrimSpace(stdout) == strconv.Itoa(400<<20) {
					t.Fatalf("400 MiB fit in a 256 MiB sandbox: %q", stdout)
				}
				if out, _, _ := runIn(t, sb, "echo alive"); out != "alive\n" {
					t.Fatalf("sandbox after the OOM kill: %q", out)
				}
				return
			}
			if exit.Code != 0 || strings.TrimSpace(stdout) != strconv.Itoa(400<<20) {
				t.Fatalf("400 MiB in a 1024 MiB sandbox: exit %+v stdout %q stderr %q", exit, stdout, stderr)
			}
		})
	}
}

// Halt ends every process of the sandbox at once (the init, and a
// command running in it, are gone before Destroy), makes Start fail, and
// leaves the release to Destroy, which then leaves nothing behind.
func TestLinuxHalt(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-halt"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "echo up; exec sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(p.Stdout(), buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan sandbox.Exit, 1)
	go func() {
		e, _ := p.Wait()
		done <- e
	}()
	init := sb.(interface{ InitPID() int }).InitPID()
	sb.(sandbox.Halter).Halt()
	select {
	case <-sb.(sandbox.Ender).Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox did not end after Halt")
	}
	if alive(init) {
		t.Fatalf("the init (pid %d) is still alive after Halt", init)
	}
	select {
	case e := <-done:
		if e.Signal != "KILL" {
			t.Fatalf("command ended %+v, want KILL", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the command's Wait did not return after Halt")
	}
	p.Stdout().Close()
	p.Stderr().Close()
	if _, err := sb.Start(context.Background(), sandbox.Cmd{Command: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Start after Halt: %v, want ErrClosed", err)
	}
	if leaks := leaksUnder(dataDir); len(leaks) == 0 {
		t.Fatal("Halt released the sandbox's mounts and directories; that is Destroy's")
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy after Halt: %v", err)
	}
}

// A Halt that comes while a Resume boots a new init (the gateway deletes
// a session whose resume is under way) ends that init too: the Resume
// fails or returns, and no process of the sandbox runs on until Destroy.
func TestLinuxHaltDuringResume(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-halt-resume"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	st := sb.(sandbox.Stopper)
	if err := st.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.BeforeLaunch(func(id string) {
		if id == "sbx-halt-resume" {
			sb.(sandbox.Halter).Halt()
		}
	})
	err = st.Resume(context.Background())
	d.BeforeLaunch(nil)
	t.Logf("Resume with a Halt under way: %v", err)
	if pid := sb.(interface{ InitPID() int }).InitPID(); pid != 0 {
		for i := 0; alive(pid); i++ {
			if i == 1000 {
				t.Fatalf("the init (pid %d) a Resume booted runs on after a Halt", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := sb.Start(context.Background(), sandbox.Cmd{Command: "true"}); err == nil {
		t.Fatal("Start after Halt succeeded")
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy after Halt: %v", err)
	}
}

// A sandbox halted whose release never came (the gateway went down with
// the release deferred) is removed whole by the next gateway's Remove.
func TestLinuxHaltedThenRemoved(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-halt-rm"})
	if err != nil {
		t.Fatal(err)
	}
	sb.(sandbox.Halter).Halt()
	select {
	case <-sb.(sandbox.Ender).Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox did not end after Halt")
	}
	if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	d2 := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	if err := d2.Remove(context.Background(), "sbx-halt-rm"); err != nil {
		t.Fatalf("Remove of a halted sandbox: %v", err)
	}
}
