//go:build linux

package linuxns_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// criuForTest returns a criu (4.x: Debian bookworm's 3.17 cannot run on
// newer kernels) to run checkpoints with: $SANDGATE_CRIU, else the one
// .ci/run builds. It skips without one, and fails in CI, where .ci/run
// builds it.
func criuForTest(t testing.TB) string {
	t.Helper()
	cands := []string{os.Getenv("SANDGATE_CRIU")}
	if home, err := os.UserHomeDir(); err == nil {
		cands = append(cands, filepath.Join(home, ".cache/sandgate/criu-4.2/criu"))
	}
	for _, c := range cands {
		if c == "" {
			continue
		}
		if out, err := exec.Command(c, "--version").CombinedOutput(); err == nil && strings.Contains(string(out), "Version: 4.") {
			return c
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no criu 4.x (SANDGATE_CRIU, or ~/.cache/sandgate/criu-4.2/criu, which .ci/run builds)")
	}
	t.Skip("no criu 4.x: set SANDGATE_CRIU")
	return ""
}

// smallInit builds the small init (cmd/sandgate-init) as make build does:
// a checkpointable sandbox's init must be static (no host libc mapped).
func smallInit(t testing.TB) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sandgate-init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", p, "github.com/sandgate/sandgate/cmd/sandgate-init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the small init: %v\n%s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// varServer is a Python process that holds a value in its memory and
// serves it on the sandbox's loopback: GET answers it, POST sets it.
const varServer = `nohup python3 -c '
import http.server
v = [b"from-source-" + b"x" * 10]
blob = bytearray(32 << 20)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(v[0])
    def do_POST(self):
        v[0] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8001), H).serve_forever()
' >/dev/null 2>&1 &
for i in $(seq 100); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8001")' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`

func getVar(t *testing.T, sb sandbox.Sandbox) string {
	t.Helper()
	out, stderr, e := runIn(t, sb, `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8001").read().decode())'`)
	if e.Code != 0 {
		t.Fatalf("get the variable: %+v %s", e, stderr)
	}
	return strings.TrimSpace(out)
}

func setVar(t *testing.T, sb sandbox.Sandbox, v string) {
	t.Helper()
	if _, stderr, e := runIn(t, sb, `python3 -c 'import urllib.request,sys; urllib.request.urlopen("http://127.0.0.1:8001", data=sys.argv[1].encode())' `+v); e.Code != 0 {
		t.Fatalf("set the variable: %+v %s", e, stderr)
	}
}

// TestLinuxCheckpointFork checkpoints a running sandbox once and restores
// it twice: each copy has the source's process and its memory, then its
// own, and its own workspace; the source runs on; the images are gone
// once the checkpoint is closed.
func TestLinuxCheckpointFork(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-fork-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	if _, stderr, e := runIn(t, src, "echo src > /workspace/src.txt\n"+varServer); e.Code != 0 {
		t.Fatalf("setup: %+v %s", e, stderr)
	}
	// At the checkpoint, a kept process and a command run, each with its
	// control connection open: in a fork the kept one is there for a
	// Reattach, the command is ended.
	kept, err := src.Start(ctx, sandbox.Cmd{Command: "echo kept-started; exec sleep 1000", Keep: "job/k1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kept.Kill() })
	running, err := src.Start(ctx, sandbox.Cmd{Command: "exec sleep 1001"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { running.Kill() })
	forks := forkAll(ctx, t, src, "sbx-fork-a", "sbx-fork-b")
	if left, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", ".checkpoints", "*")); len(left) != 0 {
		t.Errorf("checkpoint images left after Close: %v", left)
	}
	for i, f := range forks {
		if v := getVar(t, f); v != "from-source-xxxxxxxxxx" {
			t.Errorf("fork %d: variable %q, want the source's", i, v)
		}
		if out, stderr, _ := runIn(t, f, "cat /workspace/src.txt"); out != "src\n" {
			ls, _, _ := runIn(t, f, "ls -lan /workspace; id")
			t.Errorf("fork %d: /workspace/src.txt = %q (%s); %s", i, out, stderr, ls)
		}
	}
	for i, f := range forks {
		p, err := f.(sandbox.Keeper).Reattach(ctx, "job/k1")
		if err != nil {
			t.Errorf("fork %d: reattach the kept process: %v", i, err)
			continue
		}
		p.Kill()
		if !waitFor(10*time.Second, func() bool { _, _, e := runIn(t, f, "pgrep -f 'sleep 1001'"); return e.Code != 0 }) {
			t.Errorf("fork %d: the command in flight at the fork still runs", i)
		}
	}
	if _, _, e := runIn(t, src, "pgrep -f 'sleep 1001'"); e.Code != 0 {
		t.Errorf("source: its command in flight ended with the fork")
	}
	setVar(t, forks[0], "a")
	setVar(t, forks[1], "b")
	if _, stderr, e := runIn(t, forks[0], "echo a > /workspace/a.txt"); e.Code != 0 {
		t.Fatal(stderr)
	}
	for i, want := range []string{"a", "b"} {
		if v := getVar(t, forks[i]); v != want {
			t.Errorf("fork %d: variable %q, want %q", i, v, want)
		}
	}
	if v := getVar(t, src); v != "from-source-xxxxxxxxxx" {
		t.Errorf("source: variable %q after the forks changed theirs", v)
	}
	for name, sb := range map[string]sandbox.Sandbox{"source": src, "fork 1": forks[1]} {
		if _, _, e := runIn(t, sb, "test -e /workspace/a.txt"); e.Code == 0 {
			t.Errorf("%s sees fork 0's file", name)
		}
	}
	// A fork is checkpointed again (CRIU dumps a tree it restored): a
	// fork of a fork has its source's memory and files as they were.
	ff := forkAll(ctx, t, forks[0], "sbx-fork-a-a")[0]
	if v := getVar(t, ff); v != "a" {
		t.Errorf("fork of a fork: variable %q, want its source's %q", v, "a")
	}
	if out := mustRun(t, ff, "cat /workspace/a.txt"); out != "a\n" {
		t.Errorf("fork of a fork: /workspace/a.txt = %q", out)
	}
	setVar(t, ff, "aa")
	if v := getVar(t, forks[0]); v != "a" {
		t.Errorf("fork 0: variable %q after its fork changed its own", v)
	}
	// And a third generation.
	fff := forkAll(ctx, t, ff, "sbx-fork-a-a-a")[0]
	if v := getVar(t, fff); v != "aa" {
		t.Errorf("fork of a fork of a fork: variable %q, want %q", v, "aa")
	}
	if err := errors.Join(fff.Destroy(ctx), ff.Destroy(ctx)); err != nil {
		t.Error(err)
	}
	// A fork stops and resumes as any sandbox: a new init, on its files.
	st := forks[1].(sandbox.Stopper)
	if err := st.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, forks[1], "cat /workspace/src.txt"); out != "src\n" {
		t.Errorf("fork 1 after a stop and resume: %q", out)
	}
	// Each fork is a sandbox of its own: its own user ids on the host.
	if out, _, _ := runIn(t, forks[0], "cat /proc/self/uid_map"); strings.Fields(out)[1] == strings.Fields(mustRun(t, src, "cat /proc/self/uid_map"))[1] {
		t.Errorf("the fork maps the source's host uids: %s", out)
	}
}

// TestLinuxRedumpHostileFailure: a restored sandbox whose own processes
// make its dump fail with the very line a criu without .ci/criu-patches
// prints when it cannot dump a tree it restored ("unix: Unix socket N not
// found", here in a deleted file's name that CRIU's log quotes) does not
// stop the gateway's criu, which has the patches, from dumping the other
// restored sandboxes: a tenant cannot turn off forks of forks and pauses
// by checkpoint after a resume for everyone.
func TestLinuxRedumpHostileFailure(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-redump-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	forks := forkAll(ctx, t, src, "sbx-redump-evil", "sbx-redump-ok")
	// A deleted file held open and larger than CRIU's ghost limit (1 MiB):
	// "Can't dump ghost file /tmp/unix: Unix socket 1 not found ...".
	mustRun(t, forks[0], `f='/tmp/unix: Unix socket 1 not found'; head -c 3000000 /dev/zero >"$f" && exec 3<"$f" && rm "$f" && { nohup sleep 1000 >/dev/null 2>&1 & }`)
	ck1, err := forks[0].(sandbox.Checkpointer).Checkpoint(ctx)
	if err == nil {
		ck1.Close()
		t.Fatal("the dump of a sandbox holding a deleted 3 MB file succeeded: CRIU's ghost limit is not what the test needs")
	}
	t.Logf("the hostile sandbox's dump: %v", err)
	ck2, err := forks[1].(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatalf("another restored sandbox, after a hostile one's dump failed: %v", err)
	}
	if err := ck2.Close(); err != nil {
		t.Fatal(err)
	}
}

func mustRun(t *testing.T, sb sandbox.Sandbox, cmd string) string {
	t.Helper()
	out, stderr, e := runIn(t, sb, cmd)
	if e.Code != 0 {
		t.Fatalf("%s: %+v %s", cmd, e, stderr)
	}
	return out
}

// TestLinuxCheckpointNeedsCRIU4: serve --checkpoint refuses to start with
// a criu older than 4 (Debian bookworm's 3.17 cannot run on newer
// kernels), or none, rather than fail every fork later.
func TestLinuxCheckpointNeedsCRIU4(t *testing.T) {
	requireLinux(t)
	old := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(old, []byte("#!/bin/sh\necho 'Version: 3.17.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for crit, want := range map[string]string{old: `needs CRIU 4.x or newer: ` + old + ` is "3.17.1"`, "/nonexistent/criu": "criu"} {
		_, err := linuxns.New(sandbox.Config{DataDir: t.TempDir(), Checkpoint: true, CRIU: crit})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("criu %s: %v, want %q", crit, err, want)
		}
	}
}

// TestLinuxCheckpointLeftoversRemoved: checkpoint images a crashed gateway
// left (a sandbox's memory) are deleted when the driver starts again.
func TestLinuxCheckpointLeftoversRemoved(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	left := filepath.Join(dataDir, "sandboxes", ".checkpoints", "ck-1", "pages-1.img")
	if err := os.MkdirAll(filepath.Dir(left), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left, []byte("memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	if _, err := os.Stat(filepath.Dir(filepath.Dir(left))); !os.IsNotExist(err) {
		t.Errorf("checkpoint images left after a start: %v", err)
	}
}

// procsInCgroupOf lists the host pids whose cgroups are sandbox id's.
func procsInCgroupOf(id string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err == nil && (strings.Contains(string(b), "/sandgate/"+id+"\n") || strings.Contains(string(b), "/sandgate/"+id+"/")) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestLinuxCheckpointRestoreFailureKills: a restore whose criu fails
// after it made the processes (restore -d runs them detached; a criu
// killed by the context's deadline leaves them so too) kills them: no
// process, cgroup or directory of the fork is left.
func TestLinuxCheckpointRestoreFailureKills(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	// The real criu, which says it failed once a restore is done.
	wrapper := filepath.Join(t.TempDir(), "criu")
	script := "#!/bin/sh\n" + `"` + criu + `" "$@"; rc=$?` + "\n[ \"$1\" = restore ] && exit 1\nexit $rc\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: wrapper}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-fork-fsrc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	if _, stderr, e := runIn(t, src, "nohup sleep 1003 >/dev/null 2>&1 &"); e.Code != 0 {
		t.Fatalf("setup: %+v %s", e, stderr)
	}
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const id = "sbx-fork-fail"
	t.Cleanup(func() { // the old code's leftovers, not to burden the host
		for _, p := range procsInCgroupOf(id) {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
		for _, c := range append(cgroupsOf(id+"/procs"), cgroupsOf(id)...) {
			_ = os.Remove(c)
		}
	})
	if f, err := ck.Restore(ctx, sandbox.Spec{ID: id}); err == nil {
		_ = f.Destroy(ctx)
		t.Fatal("the restore succeeded with a criu that fails")
	} else if !strings.Contains(err.Error(), "restore of sbx-fork-fsrc") {
		t.Errorf("restore: %v", err)
	}
	if left := procsInCgroupOf(id); len(left) != 0 {
		t.Errorf("the failed restore left processes %v", left)
	}
	if left := cgroupsOf(id); len(left) != 0 {
		t.Errorf("the failed restore left cgroups %v", left)
	}
}

// TestLinuxCheckpointStageLeftoversRemoved: the restore stage a crashed
// gateway left (mounts in the host's namespace: a fork's workspace, a
// root tmpfs) is unmounted and deleted when the driver starts again, and
// what its workspace bind showed is kept.
func TestLinuxCheckpointStageLeftoversRemoved(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	stage := filepath.Join(d.RestoreStagesDir(), "s-crashed")
	ws := t.TempDir()
	kept := filepath.Join(ws, "file")
	if err := os.WriteFile(kept, []byte("fork's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(stage, "root"), filepath.Join(stage, "ws")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(stage, "init"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", filepath.Join(stage, "root"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(ws, filepath.Join(stage, "ws"), "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the old code's leftovers
		_ = syscall.Unmount(filepath.Join(stage, "ws"), syscall.MNT_DETACH)
		_ = syscall.Unmount(filepath.Join(stage, "root"), syscall.MNT_DETACH)
		_ = os.RemoveAll(d.RestoreStagesDir())
	})
	if err := os.WriteFile(filepath.Join(stage, "root", "etc"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
	if _, err := os.Stat(stage); !os.IsNotExist(err) {
		t.Errorf("restore stage left after a start: %v", err)
	}
	mi, _ := os.ReadFile("/proc/thread-self/mountinfo")
	if strings.Contains(string(mi), stage) {
		t.Errorf("restore stage's mounts left after a start")
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "fork's" {
		t.Errorf("the stage's workspace lost its file: %q %v", b, err)
	}
}

// TestLinuxCheckpointOutlivesCaller: a caller that goes away in the
// middle of a dump (a client hanging up on its fork) does not kill criu
// while it holds the source's processes: the dump completes, and the
// source runs on.
func TestLinuxCheckpointOutlivesCaller(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	tmp := t.TempDir()
	marker := filepath.Join(tmp, "dumping")
	slow := filepath.Join(tmp, "slow.sh")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\ntouch "+marker+"\nsleep 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The real criu, whose dumps wait 2 s once the processes are dumped
	// (and still held).
	wrapper := filepath.Join(tmp, "criu")
	script := "#!/bin/sh\n[ \"$1\" = dump ] && exec \"" + criu + "\" \"$@\" --action-script " + slow + "\nexec \"" + criu + "\" \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: wrapper}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	src, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-fork-gone"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(context.Background()) })
	if _, stderr, e := runIn(t, src, "nohup sleep 1004 >/dev/null 2>&1 &"); e.Code != 0 {
		t.Fatalf("setup: %+v %s", e, stderr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		waitFor(60*time.Second, func() bool { _, err := os.Stat(marker); return err == nil })
		cancel()
	}()
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	cancel()
	if err != nil {
		t.Fatalf("checkpoint whose caller went away: %v", err)
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the dump did not run the slow script: %v", err)
	}
	if out := mustRun(t, src, "pgrep -c -f 'sleep 1004'"); strings.TrimSpace(out) != "1" {
		t.Errorf("source after the dump: %q processes", out)
	}
}

// TestLinuxCheckpointForkConfined: a fork's processes, those restored and
// those it starts, are confined as any sandbox's: the seccomp filter,
// no_new_privs, no capability, the fork's own cgroups with the fork's
// limits, and the fork's host uid range (never the source's, never root).
func TestLinuxCheckpointForkConfined(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-fork-csrc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	// A process of 4 threads too: each thread of each restored task must
	// be in the fork's cgroups (a restored task joins its cgroups before
	// the restorer makes its threads: CRIU patch 0009).
	threads := `nohup python3 -c 'import threading, time
for _ in range(3): threading.Thread(target=time.sleep, args=(1006,), daemon=True).start()
time.sleep(1006)' >/dev/null 2>&1 &
for i in $(seq 100); do [ "$(ls /proc/$!/task | wc -l)" = 4 ] && exit 0; sleep 0.05; done; exit 1`
	for _, cmd := range []string{"nohup sleep 1005 >/dev/null 2>&1 &", threads} {
		if _, stderr, e := runIn(t, src, cmd); e.Code != 0 {
			t.Fatalf("setup: %+v %s", e, stderr)
		}
	}
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const id = "sbx-fork-conf"
	f, err := ck.Restore(ctx, sandbox.Spec{ID: id, Limits: sandbox.Limits{Pids: 77}})
	ck.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Destroy(ctx) })
	status := `set -e; p=%s; test -n "$p"; grep -E '^(Uid|Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb):' /proc/$p/status | tr -s ' \t' ' ' | sort`
	want := mustRun(t, src, strings.ReplaceAll(status, "%s", "self"))
	if !strings.Contains(want, "NoNewPrivs: 1\nSeccomp: 2\n") || !strings.Contains(want, "CapEff: 0000000000000000\n") {
		t.Fatalf("the source's commands: %q", want)
	}
	for what, pid := range map[string]string{"a new command": "self", "the restored process": "$(pgrep -x sleep)"} {
		if out := mustRun(t, f, strings.ReplaceAll(status, "%s", pid)); out != want {
			t.Errorf("%s in the fork: %q, want the source's %q", what, out, want)
		}
	}
	// On the host: the restored sleep is in the fork's cgroups, as the
	// fork's uid, which is neither the source's nor root.
	var srcUID, forkUID = -1, -1
	for _, p := range hostProcesses() {
		if p.args != "sleep 1005" {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid))
		switch {
		case strings.Contains(string(b), "/sandgate/"+id+"/") || strings.Contains(string(b), "/sandgate/"+id+"\n"):
			forkUID = p.uid
			if !strings.Contains(string(b), ":pids:/sandgate/"+id+"/procs\n") && strings.Contains(string(b), ":pids:") {
				t.Errorf("the fork's process is not in its commands' pids cgroup:\n%s", b)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if strings.Contains(line, ":/sandgate/") && !strings.Contains(line, "/sandgate/"+id) {
					t.Errorf("the fork's process is in a cgroup not its own: %s", line)
				}
			}
		case strings.Contains(string(b), "/sandgate/sbx-fork-csrc"):
			srcUID = p.uid
		default:
			t.Errorf("a sleep 1005 in no sandbox's cgroups: pid %d uid %d\n%s", p.pid, p.uid, b)
		}
	}
	if forkUID <= 0 || srcUID <= 0 || forkUID == srcUID {
		t.Errorf("host uids: fork %d, source %d", forkUID, srcUID)
	}
	checkTreeCgroups(t, id)
	if v1, _ := filepath.Glob("/sys/fs/cgroup/pids/sandgate/" + id + "/procs/pids.max"); len(v1) == 1 {
		if b, _ := os.ReadFile(v1[0]); strings.TrimSpace(string(b)) != "77" {
			t.Errorf("the fork's pids.max: %q, want its own limit 77", b)
		}
	}
}

// TestLinuxCheckpointRefusesForeignMount: a restore binds the host's path
// named by each of the source's mounts of a host file; a mount in the
// source's namespace that is not the host's file at that path (here one
// host root plants: the sandbox itself may not mount) is refused, never
// bound from the host into a fork.
func TestLinuxCheckpointRefusesForeignMount(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("no nsenter")
	}
	// A host dir the source does not have, at a path the source names.
	hostDir, err := os.MkdirTemp("/tmp", "sandgate-hostonly-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(hostDir) })
	if err := os.WriteFile(filepath.Join(hostDir, "secret"), []byte("host-only"), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-fork-msrc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	mustRun(t, src, "mkdir -p /workspace/d "+hostDir)
	initPid := "" // the init: the one process in the sandbox's outer cgroups
	for _, p := range hostProcesses() {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid)); strings.Contains(string(b), "/sandgate/sbx-fork-msrc\n") && initPid == "" {
			initPid = strconv.Itoa(p.pid)
		}
	}
	if initPid == "" {
		t.Fatal("no init found")
	}
	if out, err := exec.Command("nsenter", "-t", initPid, "-m", "mount", "--bind", "/workspace/d", hostDir).CombinedOutput(); err != nil {
		t.Fatalf("plant a mount: %v %s", err, out)
	}
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err == nil {
		f, rerr := ck.Restore(ctx, sandbox.Spec{ID: "sbx-fork-mnt"})
		ck.Close()
		if rerr == nil {
			out, _, _ := runIn(t, f, "cat "+hostDir+"/secret")
			_ = f.Destroy(ctx)
			t.Fatalf("a foreign mount was checkpointed; the fork reads the host's %s: %q", hostDir, out)
		}
		t.Fatalf("a foreign mount was checkpointed (the restore failed: %v)", rerr)
	}
	if !errors.Is(err, sandbox.ErrNoCheckpoint) || !strings.Contains(err.Error(), hostDir) {
		t.Errorf("checkpoint: %v", err)
	}
}

// TestLinuxCheckpointKeepsKerndat: the first criu run gives the driver
// CRIU's kerndat cache, which the host's /run (not a tmpfs here) cannot
// keep, and the next runs get it from the driver instead of probing the
// kernel again (some 25 ms each, an iptables run among them); criu's
// private /run is never the gateway's.
func TestLinuxCheckpointKeepsKerndat(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	if !d.OwnRun(criu) {
		t.Skip("this host's /run is a tmpfs: CRIU keeps its kerndat cache there itself")
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-kdat-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	// The mounts on /run the gateway sees (other tests' mounts come and
	// go elsewhere).
	mounts := func() string {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		var run []string
		for l := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[4] == "/run" {
				run = append(run, l)
			}
		}
		return strings.Join(run, "\n")
	}
	before := mounts()
	for i := range 2 {
		ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ck.Close(); err != nil {
			t.Fatal(err)
		}
		k := d.Kerndat()
		// struct kerndat_s starts with KDAT_MAGIC.
		if len(k) < 8 || binary.LittleEndian.Uint32(k) != 0x57023458 {
			t.Fatalf("checkpoint %d: the driver has no kerndat cache (%d bytes)", i, len(k))
		}
	}
	if after := mounts(); after != before {
		t.Fatalf("criu's mounts leaked into the gateway's:\nbefore %s\nafter %s", before, after)
	}
}

// TestLinuxCheckpointRunKeptWhereNeeded: criu gets no /run of its own
// where it would hide what criu needs: a data dir (the images) under
// /run.
func TestLinuxCheckpointRunKeptWhereNeeded(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/run", &fs); err != nil || fs.Type == 0x01021994 { // TMPFS_MAGIC
		t.Skip("this host's /run is a tmpfs: criu always sees it")
	}
	under, err := os.MkdirTemp("/run", "sandgate-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(under) })
	for _, c := range []struct {
		dataDir string
		own     bool
	}{{t.TempDir(), true}, {under, false}} {
		d, err := linuxns.NewWithInit(sandbox.Config{DataDir: c.dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := d.OwnRun(criu); got != c.own {
			t.Errorf("data dir %s: criu gets a /run of its own: %v, want %v", c.dataDir, got, c.own)
		}
	}
}

// forkAll checkpoints src once and restores it as a fork for each id (each
// destroyed at the test's end), then closes the checkpoint; any failure
// ends the test, naming the forks.
func forkAll(ctx context.Context, t *testing.T, src sandbox.Sandbox, ids ...string) []sandbox.Sandbox {
	t.Helper()
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatalf("checkpoint of the source of %v: %v", ids, err)
	}
	var forks []sandbox.Sandbox
	for _, id := range ids {
		f, err := ck.Restore(ctx, sandbox.Spec{ID: id})
		if err != nil {
			ck.Close()
			t.Fatalf("fork %s: %v", id, err)
		}
		t.Cleanup(func() { _ = f.Destroy(ctx) })
		forks = append(forks, f)
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	return forks
}

// checkTreeCgroups checks that every thread of every process in sandbox
// id's pid namespace (its init's, found by its outer cgroups) is in the
// sandbox's own cgroups of each v1 controller the driver manages: the
// init in /sandgate/<id>, the others there or in its procs cgroup. It
// needs at least the init and one more process with 4 threads.
func checkTreeCgroups(t *testing.T, id string) {
	t.Helper()
	if b, _ := os.ReadFile("/proc/self/cgroup"); !strings.Contains(string(b), ":pids:") {
		t.Log("no v1 pids hierarchy: the restored threads' cgroups are not checked")
		return
	}
	procs := hostProcesses()
	ns := ""
	for _, p := range procs {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid)); strings.Contains(string(b), ":pids:/sandgate/"+id+"\n") {
			ns = p.pidNS
		}
	}
	if ns == "" {
		t.Fatalf("no process in %s's cgroups", id)
	}
	controllers := []string{"cpu", "cpuacct", "freezer", "memory", "pids"}
	inTree, threaded := 0, false
	for _, p := range procs {
		if p.pidNS != ns {
			continue
		}
		inTree++
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.pid))
		threaded = threaded || len(tasks) >= 4
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/cgroup", p.pid, task.Name()))
			if err != nil {
				continue // the thread ended meanwhile
			}
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				f := strings.SplitN(line, ":", 3)
				if len(f) != 3 || !slices.ContainsFunc(strings.Split(f[1], ","), func(c string) bool { return slices.Contains(controllers, c) }) {
					continue
				}
				if f[2] != "/sandgate/"+id && f[2] != "/sandgate/"+id+"/procs" {
					t.Errorf("pid %d thread %s (%s) is in %s of %s, not %s's", p.pid, task.Name(), p.args, f[2], f[1], id)
				}
			}
		}
	}
	if inTree < 2 || !threaded {
		t.Errorf("%s's tree: %d processes, one with 4 threads: %v", id, inTree, threaded)
	}
}
