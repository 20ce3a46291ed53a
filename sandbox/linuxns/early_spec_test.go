//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// The init gets its spec before the workspace is made, and builds the
// default root and its /etc meanwhile (ctl.Spec.Late): a create then
// costs the longer of the two, not their sum. Its steps say so: /etc is
// built before the init waits for the workspace.
func TestLinuxInitBuildsRootBeforeWorkspace(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	tr := sandbox.NewTrace()
	sb, err := d.Create(sandbox.WithTrace(context.Background(), tr), sandbox.Spec{ID: "sbx-early-spec"})
	if err != nil {
		t.Fatal(err)
	}
	steps, _ := tr.Steps()
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
	}
	etc, wait := slices.Index(names, "init.etc"), slices.Index(names, "init.wait_workspace")
	if etc < 0 || wait < 0 || etc > wait || !slices.Contains(names, "init_spec") {
		t.Errorf("create steps %q: want init_spec, then the init's /etc (init.etc) before it waits for the workspace (init.wait_workspace)", names)
	}
	if _, _, e := runIn(t, sb, "test -w /workspace && test -s /etc/hostname"); e.Code != 0 {
		t.Errorf("workspace or /etc missing: exit %+v", e)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, dataDir)
}

// requireV1 skips a test of the cgroup v1 hierarchy of controller c on a
// host without one. Not by the "sandgate" parent in it: cgroup.Remove
// removes that with the host's last sandbox, and the test then skipped
// wherever no other sandbox ran (CI).
func requireV1(t *testing.T, c string) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup/"+c, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
		t.Skip("no cgroup v1 " + c + " hierarchy here")
	}
}

// cpuCgroups are the v1 cpu cgroups of every thread of pid.
func cpuCgroups(t *testing.T, pid int) []string {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/cgroup", pid, task.Name()))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.SplitN(line, ":", 3); len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "cpu") {
				out = append(out, f[2])
			}
		}
	}
	return out
}

// A new init starts outside the "sandgate" CPU parent that every sandbox
// shares (cgroup.Set.CPUTasks), where busy sandboxes would hold up its
// start, and is under it, in its own cgroup, before it gets its
// workspace; its commands start in the sandbox's CPU-limited cgroup. The
// init moves itself: here the test binary, linked with cgo, one thread
// id at a time.
func TestLinuxInitStartsOutsideSandboxesCPU(t *testing.T) {
	requireV1(t, "cpu")
	dataDir := t.TempDir()
	checkInitJoinsCPU(t, openLinux(t, sandbox.Config{DataDir: dataDir}), dataDir, "sbx-cpu-late")
}

// The small init (cmd/sandgate-init, without cgo, as make build embeds
// it) moves every one of its threads with one write of "0" each
// (syscall.AllThreadsSyscall), skipping the kernel's grace period.
func TestLinuxSmallInitJoinsCPUEveryThread(t *testing.T) {
	requireLinux(t)
	requireV1(t, "cpu")
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Report()["init"]; got != "embedded" {
		t.Fatalf("report init %v, want embedded", got)
	}
	for i := range 3 {
		checkInitJoinsCPU(t, d, dataDir, fmt.Sprintf("sbx-cpu-small-%d", i))
	}
}

// checkInitJoinsCPU creates sandbox id on d and checks where its init's
// threads are, in the v1 cpu hierarchy, before it gets its workspace and
// once built.
func checkInitJoinsCPU(t *testing.T, d *linuxns.Driver, dataDir, id string) {
	t.Helper()
	var before []string
	d.BeforeAttach(func(pid int) { before = cpuCgroups(t, pid) })
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
		checkNoLeaks(t, dataDir)
	}()
	if len(before) == 0 || slices.ContainsFunc(before, func(c string) bool { return strings.HasPrefix(c, "/sandgate/") }) {
		t.Errorf("the init's threads were in cpu cgroups %q while it built its root, want the gateway's, not under /sandgate", before)
	}
	after := cpuCgroups(t, sb.(interface{ InitPID() int }).InitPID())
	for _, c := range after {
		if c != "/sandgate/"+id && c != "/sandgate/"+id+"/procs" {
			t.Errorf("a thread of the built init is in cpu cgroup %s (all: %q)", c, after)
		}
	}
	// The spawner thread, which forks the commands, is in their cgroup.
	if !slices.Contains(after, "/sandgate/"+id+"/procs") {
		t.Errorf("no thread of the init is in the commands' cpu cgroup: %q", after)
	}
	// And so are the commands: the root of their cgroup namespace, which
	// the spawner thread made there.
	out, _, e := runIn(t, sb, "grep -E '^[0-9]+:cpu[,:]' /proc/self/cgroup")
	if e.Code != 0 || !strings.HasSuffix(strings.TrimSpace(out), ":/") {
		t.Errorf("a command's cpu cgroup: %q (exit %+v), want the commands' one, its namespace's root", out, e)
	}
}

// When the init cannot join its cpu cgroup (here: removed under it, so
// the write answers ENODEV), the create fails saying so, and leaves no
// process, mount or loop device; the driver creates again after.
func TestLinuxInitCPUJoinFails(t *testing.T) {
	requireLinux(t)
	requireV1(t, "cpu")
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	var initPid int
	d.BeforeAttach(func(pid int) {
		initPid = pid
		dir := "/sys/fs/cgroup/cpu/sandgate/sbx-cpu-gone"
		if err := os.Remove(dir + "/procs"); err != nil {
			t.Error(err)
		}
		if err := os.Remove(dir); err != nil {
			t.Error(err)
		}
	})
	_, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-cpu-gone"})
	if err == nil || !strings.Contains(err.Error(), "cpu cgroup") {
		t.Fatalf("create whose init cannot join its cpu cgroup: %v, want an error naming it", err)
	}
	t.Logf("create: %v", err)
	if initPid == 0 {
		t.Fatal("no init started")
	}
	if !waitFor(5*time.Second, func() bool { return unix.Kill(initPid, 0) != nil }) {
		t.Errorf("the init %d outlives its failed create", initPid)
	}
	checkNoLeaks(t, dataDir)
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/sandgate/sbx-cpu-gone"); len(left) > 0 {
		t.Errorf("cgroups left by the failed create: %q", left)
	}
	d.BeforeAttach(nil)
	checkInitJoinsCPU(t, d, dataDir, "sbx-cpu-after")
}

// A warm sandbox's init (built for a pool, sandbox.Spec.Warm) is born in
// its own cgroup of the cpu hierarchy, at the least weight, instead of
// moving there once its root is built: its whole build yields the CPU to
// the creates that claim, and it skips the move, whose wait for each of
// its threads spun in sched_yield on a busy host (issue 41, row 11e). Once
// built, and once claimed, its threads are where a cold create's are.
func TestLinuxWarmInitBornInCPUCgroup(t *testing.T) {
	requireLinux(t)
	requireV1(t, "cpu")
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	id := "sbx-cpu-warm"
	var before []string
	d.BeforeAttach(func(pid int) { before = cpuCgroups(t, pid) })
	tr := sandbox.NewTrace()
	sb, err := d.Create(sandbox.WithTrace(context.Background(), tr), sandbox.Spec{ID: id, Warm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
		checkNoLeaks(t, dataDir)
	}()
	if len(before) == 0 || slices.ContainsFunc(before, func(c string) bool { return c != "/sandgate/"+id }) {
		t.Errorf("the warm init's threads were in cpu cgroups %q while it built its root, want all in /sandgate/%s", before, id)
	}
	steps, _ := tr.Steps()
	for _, s := range steps {
		if s.Name == "init.cpu_join" {
			t.Errorf("a warm init moved itself into its cpu cgroup (step %s), want it born there", s.Name)
		}
	}
	shares := func() string {
		b, err := os.ReadFile("/sys/fs/cgroup/cpu/sandgate/" + id + "/cpu.shares")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := shares(); got != "64" {
		t.Errorf("a warm sandbox's cpu.shares is %s, want 64 (a warm one's) until its claim", got)
	}
	check := func(when string) {
		after := cpuCgroups(t, sb.(interface{ InitPID() int }).InitPID())
		for _, c := range after {
			if c != "/sandgate/"+id && c != "/sandgate/"+id+"/procs" {
				t.Errorf("%s: a thread of the init is in cpu cgroup %s (all: %q)", when, c, after)
			}
		}
		if !slices.Contains(after, "/sandgate/"+id+"/procs") {
			t.Errorf("%s: no thread of the init is in the commands' cpu cgroup: %q", when, after)
		}
	}
	check("built")
	if err := sb.(sandbox.Rebinder).Rebind(context.Background(), sandbox.Spec{ID: id}); err != nil {
		t.Fatal(err)
	}
	check("claimed")
	if got := shares(); got != "1024" {
		t.Errorf("a claimed sandbox's cpu.shares is %s, want 1024 (any running sandbox's)", got)
	}
	out, _, e := runIn(t, sb, "grep -E '^[0-9]+:cpu[,:]' /proc/self/cgroup")
	if e.Code != 0 || !strings.HasSuffix(strings.TrimSpace(out), ":/") {
		t.Errorf("a command's cpu cgroup: %q (exit %+v), want the commands' one, its namespace's root", out, e)
	}
}

// A checkpointable warm sandbox's init is not born in its cpu cgroup: its
// cgroup namespace (CLONE_NEWCGROUP) is rooted where it is born, so it
// moves itself there as a cold create's does, and its commands see the
// same cgroups as a cold create's.
func TestLinuxCheckpointWarmInitMovesIntoCPU(t *testing.T) {
	requireLinux(t)
	requireV1(t, "cpu")
	criu := criuForTest(t)
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[bool]string{}
	for _, warm := range []bool{false, true} {
		id := fmt.Sprintf("sbx-cpu-ckpt-%v", warm)
		var before []string
		d.BeforeAttach(func(pid int) { before = cpuCgroups(t, pid) })
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id, Warm: warm})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(before, func(c string) bool { return strings.HasPrefix(c, "/sandgate/") }) {
			t.Errorf("warm %v: the init's threads were in cpu cgroups %q while it built its root, want the gateway's", warm, before)
		}
		if warm {
			if err := sb.(sandbox.Rebinder).Rebind(context.Background(), sandbox.Spec{ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		out, _, e := runIn(t, sb, "grep -E '^[0-9]+:cpu[,:]' /proc/self/cgroup")
		if e.Code != 0 {
			t.Errorf("warm %v: exit %+v", warm, e)
		}
		seen[warm] = strings.ReplaceAll(out, id, "ID")
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
	}
	if seen[true] != seen[false] {
		t.Errorf("a command's cpu cgroup: %q in a claimed warm sandbox, %q in a cold one", seen[true], seen[false])
	}
	checkNoLeaks(t, dataDir)
}

// A warm sandbox's init is forked at the weight of its cgroup that Create
// gave it (cgroup.Plan.Create), and gets the least (cgroup.Plan.Idle) only
// once started: the thread that forks it (the spawn server's, or the
// gateway's) joins the cgroups the init is born in (v1), and waits for
// its exec. At the least weight, among busy sandboxes, the spawn server's
// fork took seconds, past its bound (spawnReplyWait), and the driver
// ended the server for good (issue 41's warm init born in its cpu
// cgroup: 10 to 20 busy sandboxes here, init_exec_bg 4.4 s and 6.4 s,
// "the gateway forks every init itself from now on").
func TestLinuxWarmInitForkedBeforeIdle(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	const id = "sbx-warm-fork"
	weight := func() (file, value string) {
		for _, f := range []string{"/sys/fs/cgroup/cpu/sandgate/" + id + "/cpu.shares", "/sys/fs/cgroup/sandgate/" + id + "/cpu.weight"} {
			if b, err := os.ReadFile(f); err == nil {
				return f, strings.TrimSpace(string(b))
			}
		}
		return "", ""
	}
	var atFork, atForkFile string
	d.BeforeLaunch(func(got string) {
		if got == id {
			atForkFile, atFork = weight()
		}
	})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id, Warm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
		checkNoLeaks(t, dataDir)
	}()
	if atForkFile == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no cpu cgroup for the sandbox (cpu.shares or cpu.weight)")
		}
		t.Skip("no cpu controller for sandboxes here")
	}
	if atFork == "64" || atFork == "6" {
		t.Errorf("the warm init was forked with %s = %s, a warm one's: its fork waits for every busy sandbox", atForkFile, atFork)
	}
	if file, got := weight(); got != "64" && got != "6" {
		t.Errorf("the built warm sandbox's %s = %s, want a warm one's (64 on v1, 6 on v2)", file, got)
	}
}

// A warm sandbox destroyed unclaimed (the pool's shrink or close), or
// left by a gateway and removed by the next (Restore), is killed at a
// running sandbox's CPU weight, not at the least it waited
// at: its init's exit, the teardown of its namespaces, runs in its
// cgroups, and at the least weight it waited for every busy sandbox (20
// busy sandboxes here: 3.5 s against 0.15 s for a claimed one), towards
// the bounds past which the destroy fails and leaves its cgroups.
func TestLinuxWarmDestroyedAtRunningWeight(t *testing.T) {
	requireLinux(t)
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	const id = "sbx-warm-destroy"
	var atKill, atKillFile string
	d.BeforeKill(func(got string) {
		if got != id {
			return
		}
		for _, f := range []string{"/sys/fs/cgroup/cpu/sandgate/" + id + "/cpu.shares", "/sys/fs/cgroup/sandgate/" + id + "/cpu.weight"} {
			if b, err := os.ReadFile(f); err == nil {
				atKillFile, atKill = f, strings.TrimSpace(string(b))
			}
		}
	})
	for _, how := range []string{"destroyed", "left by a restart, removed"} {
		atKill, atKillFile = "", ""
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id, Warm: true})
		if err != nil {
			t.Fatal(err)
		}
		if how == "destroyed" {
			err = sb.Destroy(context.Background())
		} else if err = sb.(sandbox.Detacher).Detach(context.Background()); err == nil {
			err = d.Remove(context.Background(), id)
		}
		if err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, dataDir)
		checkKilledAtRunningWeight(t, how, atKillFile, atKill)
	}
}

func checkKilledAtRunningWeight(t *testing.T, how, atKillFile, atKill string) {
	t.Helper()
	if atKillFile == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no cpu cgroup for the sandbox (cpu.shares or cpu.weight)")
		}
		t.Skip("no cpu controller for sandboxes here")
	}
	if atKill != "1024" && atKill != "100" {
		t.Errorf("an unclaimed warm sandbox %s: its init was killed with %s = %s, want a running sandbox's (1024 on v1, 100 on v2)", how, atKillFile, atKill)
	}
}

// The init's main thread, the thread group's leader, stays out of the
// commands' cgroups, whatever thread its spawner runs on: /proc/1/cgroup
// (the leader's) is then the same in every sandbox, and, on cgroup v1,
// the init's memory is charged to its own memory cgroup (the kernel
// charges a process's memory to its leader's), not to the commands', whose
// OOM killer would count the init among its candidates. Unlocked, the main
// goroutine let the spawner's goroutine lock the leader in most sandboxes.
func TestLinuxInitMainThreadOutsideCommandsCgroups(t *testing.T) {
	requireLinux(t)
	requireV1(t, "memory") // on v2, the init and its commands share one cgroup
	dataDir := t.TempDir()
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	defer checkNoLeaks(t, dataDir)
	for i := range 6 {
		id := fmt.Sprintf("sbx-leader-%d", i)
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id, Warm: i%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, e := runIn(t, sb, "true"); e.Code != 0 {
			t.Errorf("%s: a command: exit %+v", id, e)
		}
		pid := sb.(interface{ InitPID() int }).InitPID()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "/"+id+"/procs") {
			t.Errorf("%s: the init's main thread is in the commands' cgroups:\n%s", id, b)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
	}
}
