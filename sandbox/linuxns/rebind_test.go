//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// A running sandbox takes new memory, pids and CPU limits (a warm
// sandbox claimed by a session): up from the driver's, then down below
// them, each enforced as if it had been created with it; and a session
// CA in its trust store. The sizes of /tmp and the workspace, an image,
// a second CA or another id cannot change live (ErrNotLive), and the
// sandbox keeps its limits then.
func TestLinuxRebind(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{MemoryBytes: 256 << 20, Pids: 64}})
	const id = "sbx-rebind"
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	rb, ok := sb.(sandbox.Rebinder)
	if !ok {
		t.Fatal("a linux sandbox is not a sandbox.Rebinder")
	}
	cgroupV1 := func(t *testing.T, want map[string]string) {
		t.Helper()
		for file, w := range want {
			ctrl, _, _ := strings.Cut(file, ".")
			b, err := os.ReadFile("/sys/fs/cgroup/" + ctrl + "/sandgate/" + id + "/procs/" + file)
			if err != nil {
				t.Logf("%s: %v (not cgroup v1 here)", file, err)
				continue
			}
			if got := strings.TrimSpace(string(b)); got != w {
				t.Errorf("%s = %s, want %s", file, got, w)
			}
		}
	}
	// The init started with a larger CPU weight (for a quick start
	// beside busy sandboxes); built, it has a running sandbox's.
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu/sandgate/" + id + "/cpu.shares"); err == nil && strings.TrimSpace(string(b)) != "1024" {
		t.Errorf("the built sandbox's cpu.shares = %s, want 1024", strings.TrimSpace(string(b)))
	}
	// tail keeps the one 400 MiB line in memory.
	const alloc = "head -c 400m /dev/zero | tail | wc -c"
	if out, _, exit := runIn(t, sb, alloc); exit.Code == 0 && strings.TrimSpace(out) == strconv.Itoa(400<<20) {
		t.Fatalf("400 MiB fit in a 256 MiB sandbox")
	}

	if err := rb.Rebind(context.Background(), sandbox.Spec{ID: id, Limits: sandbox.Limits{MemoryBytes: 1024 << 20, Pids: 100, CPUs: 2}}); err != nil {
		t.Fatal(err)
	}
	cgroupV1(t, map[string]string{"memory.limit_in_bytes": "1073741824", "pids.max": "100", "cpu.cfs_quota_us": "200000"})
	if out, stderr, exit := runIn(t, sb, alloc); exit.Code != 0 || strings.TrimSpace(out) != strconv.Itoa(400<<20) {
		t.Fatalf("400 MiB after raising the limit to 1 GiB: %+v %q %q", exit, out, stderr)
	}

	if err := rb.Rebind(context.Background(), sandbox.Spec{ID: id, Limits: sandbox.Limits{MemoryBytes: 128 << 20, Pids: 32, CPUs: 0.5}}); err != nil {
		t.Fatal(err)
	}
	cgroupV1(t, map[string]string{"memory.limit_in_bytes": "134217728", "pids.max": "32", "cpu.cfs_quota_us": "50000"})
	if out, _, exit := runIn(t, sb, "head -c 200m /dev/zero | tail | wc -c"); exit.Code == 0 && strings.TrimSpace(out) == strconv.Itoa(200<<20) {
		t.Fatalf("200 MiB fit after lowering the limit to 128 MiB")
	}

	// A session CA joins the trust store, as Spec.TrustPEM does at build;
	// /etc stays read-only, and a second CA is refused.
	pem := []byte(testPEM)
	if err := rb.Rebind(context.Background(), sandbox.Spec{ID: id, Limits: sandbox.Limits{MemoryBytes: 128 << 20, Pids: 32, CPUs: 0.5}, TrustPEM: pem}); err != nil {
		t.Fatal(err)
	}
	check := "grep -c 'BEGIN CERTIFICATE' " + sandbox.TrustBundle + " >/dev/null && tail -c 200 " + sandbox.TrustBundle + " | grep -q 'END CERTIFICATE' && " +
		"cmp -s " + sandbox.TrustBundle + " /etc/ssl/certs/ca-certificates.crt && echo same; touch /etc/x 2>/dev/null || echo ro"
	if out, stderr, _ := runIn(t, sb, check); out != "same\nro\n" {
		t.Errorf("trust store after Rebind with TrustPEM: %q %q", out, stderr)
	}
	if out, _, _ := runIn(t, sb, "cat "+sandbox.TrustBundle); !strings.Contains(out, strings.TrimSpace(string(pem))) {
		t.Errorf("the session CA is not in %s", sandbox.TrustBundle)
	}
	for _, spec := range []sandbox.Spec{
		{ID: id, Limits: sandbox.Limits{TmpBytes: 1 << 20}},
		{ID: id, Limits: sandbox.Limits{WorkspaceBytes: 64 << 20}},
		{ID: id, Limits: sandbox.Limits{MemoryBytes: 128 << 20, Pids: 32, CPUs: 0.5}, TrustPEM: pem},
		{ID: id, Image: &sandbox.Image{Name: "x"}},
		{ID: "sbx-other"},
	} {
		if err := rb.Rebind(context.Background(), spec); !errors.Is(err, sandbox.ErrNotLive) {
			t.Errorf("Rebind(%+v) = %v, want ErrNotLive", spec, err)
		}
	}
	cgroupV1(t, map[string]string{"memory.limit_in_bytes": "134217728"})
	if out, _, _ := runIn(t, sb, "echo alive"); out != "alive\n" {
		t.Fatalf("sandbox after the rebinds: %q", out)
	}
}

// A Rebind (a warm sandbox's claim) gives the files the sandbox's build
// wrote the time of the claim, leaves the read-only mounts read-only and
// the host's files bound in untouched, and holds nothing of the sandbox
// after (checkNoLeaks: the thread that entered its mounts left them).
func TestLinuxRebindTimes(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	const id = "sbx-rebind-times"
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	var usr unix.Stat_t
	if err := unix.Stat("/usr", &usr); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2100 * time.Millisecond) // whole seconds: the build's time must show
	claimed := time.Now().Unix()
	start := time.Now()
	if err := sb.(sandbox.Rebinder).Rebind(context.Background(), sandbox.Spec{ID: id}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Rebind with the same limits (the times alone): %v", time.Since(start))
	// /etc itself and passwd are the gateway's /etc template's, every
	// sandbox's (below); hostname and hosts are the sandbox's own.
	paths := []string{"/", "/etc/hostname", "/etc/hosts", "/etc/machine-id", "/dev", "/dev/shm", "/tmp", "/workspace"}
	out, stderr, _ := runIn(t, sb, "stat -c '%n %Y %Z' "+strings.Join(paths, " ")+"; stat -c '%Y' /usr; for d in / /etc /dev; do touch $d/x 2>/dev/null && echo $d writable; done")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(paths)+1 {
		t.Fatalf("stat in the sandbox: %q %q", out, stderr)
	}
	for _, l := range lines[:len(paths)] {
		f := strings.Fields(l)
		m, _ := strconv.ParseInt(f[1], 10, 64)
		c, _ := strconv.ParseInt(f[2], 10, 64)
		if m < claimed || c < claimed {
			t.Errorf("%s: mtime %d ctime %d, before the claim at %d", f[0], m, c, claimed)
		}
	}
	if got := lines[len(paths)]; got != strconv.FormatInt(usr.Mtim.Sec, 10) {
		t.Errorf("the host's /usr has mtime %d, the sandbox shows %s", usr.Mtim.Sec, got)
	}
	// What the /etc template holds shows the same times in the claimed
	// sandbox as in one created after the claim: nothing tells them apart.
	cold, err := d.Create(context.Background(), sandbox.Spec{ID: id + "-cold"})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Destroy(context.Background())
	const shared = "stat -c '%n %Y %Z' /etc /etc/passwd /etc/group"
	claimedEtc, _, _ := runIn(t, sb, shared)
	coldEtc, _, _ := runIn(t, cold, shared)
	if claimedEtc != coldEtc || claimedEtc == "" {
		t.Errorf("/etc's shared files in the claimed sandbox:\n%s\nin a sandbox created after the claim:\n%s", claimedEtc, coldEtc)
	}
	// A host directory bound into the sandbox's /etc keeps the host's
	// times too: the claim's walk stats what is mounted (touchBelow).
	var apt unix.Stat_t
	if err := unix.Stat("/etc/apt", &apt); err == nil && apt.Mtim.Sec < claimed-1 {
		out, _, _ := runIn(t, sb, "stat -c '%Y' /etc/apt")
		if got := strings.TrimSpace(out); got != strconv.FormatInt(apt.Mtim.Sec, 10) {
			t.Errorf("the host's /etc/apt has mtime %d, the sandbox shows %s", apt.Mtim.Sec, got)
		}
	}
}

// A warm sandbox (Spec.Warm) is built, and waits, with the least CPU
// weight, so that a refill of the gateway's pool yields the CPU to the
// creates that claim and run (issue 41, row 11e); its claim, even one
// that changes no limit, gives it a running sandbox's weight. Checked on
// the host's real cgroups (v1 cpu.shares, v2 cpu.weight).
func TestLinuxRebindWarmCPUWeight(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	const id = "sbx-warmcpu"
	weight := func() (file, value string) {
		for _, f := range []string{"/sys/fs/cgroup/cpu/sandgate/" + id + "/cpu.shares", "/sys/fs/cgroup/sandgate/" + id + "/cpu.weight"} {
			if b, err := os.ReadFile(f); err == nil {
				return f, strings.TrimSpace(string(b))
			}
		}
		return "", ""
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id, Warm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	file, got := weight()
	if file == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no cpu cgroup for the sandbox (cpu.shares or cpu.weight)")
		}
		t.Skip("no cpu controller for sandboxes here")
	}
	if got != "64" && got != "6" {
		t.Errorf("the idle warm sandbox's %s = %s, want a warm one's (64 on v1, 6 on v2)", file, got)
	}
	if err := sb.(sandbox.Rebinder).Rebind(context.Background(), sandbox.Spec{ID: id}); err != nil {
		t.Fatal(err)
	}
	if file, got = weight(); got != "1024" && got != "100" {
		t.Errorf("the claimed sandbox's %s = %s, want a running sandbox's (1024 on v1, 100 on v2)", file, got)
	}
	if out, _, _ := runIn(t, sb, "echo alive"); out != "alive\n" {
		t.Fatalf("claimed sandbox: %q", out)
	}
}
