//go:build linux

package linuxns_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

// requireLazyCriu skips (fails under CI, whose criu .ci/build-criu builds
// with patch 0006) when forks cannot restore with lazy pages here.
func requireLazyCriu(t *testing.T, criu string) {
	t.Helper()
	b, err := os.ReadFile(criu)
	why := ""
	switch {
	case err != nil:
		why = err.Error()
	case !bytes.Contains(b, []byte("/dev/userfaultfd")):
		why = criu + " lacks .ci/criu-patches/0006 (run .ci/build-criu)"
	default:
		if _, err := os.Stat("/dev/userfaultfd"); err != nil {
			why = "no /dev/userfaultfd (Linux 6.1)"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("lazy pages: " + why)
	}
	t.Skip("lazy pages: " + why)
}

// slowLazyCriu is a criu for the driver that runs criu: it runs the
// lazy-pages daemons of the restores of sandboxes whose id holds "-slow-"
// in a cgroup of their own limited to 5% of a CPU (so that a copy of
// 256 MiB takes seconds), the rest as criu does. It holds the strings the
// driver looks for in a criu binary (the real one has them:
// requireLazyCriu).
func slowLazyCriu(t *testing.T, criu string) string {
	t.Helper()
	var cg string
	for _, c := range []string{"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(c, "cgroup.procs")); err == nil {
			cg = c
			break
		}
	}
	dir := filepath.Join(cg, "sandgate-test-slow-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		waitFor(10*time.Second, func() bool { return os.Remove(dir) == nil })
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("the slow daemons' cgroup %s: not empty after the test", dir)
		}
	})
	quota := map[string]string{"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "5000"}
	if cg == "/sys/fs/cgroup" {
		quota = map[string]string{"cpu.max": "5000 100000"}
	}
	for f, v := range quota {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			t.Fatalf("a CPU limit for the slow daemons: %v", err)
		}
	}
	script := "#!/bin/sh\n# The real criu's marks: /dev/userfaultfd, empty netns: lo up\n" +
		"if [ \"$1\" = lazy-pages ]; then case \"$3\" in *-slow-*) echo $$ > " + filepath.Join(dir, "cgroup.procs") + ";; esac; fi\n" +
		"exec " + criu + " \"$@\"\n"
	p := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// lazyDaemons are the pids of the criu lazy-pages daemons serving a
// restore of sandbox id (their images dir, r-<id>, is in their command
// line).
func lazyDaemons(id string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(b), "\x00")
		if len(args) > 3 && args[1] == "lazy-pages" && strings.HasSuffix(args[3], "/r-"+id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopDaemon stops (SIGSTOP) the one lazy-pages daemon of sandbox id's
// restore, still copying, and returns its pid.
func stopDaemon(t *testing.T, id string) int {
	t.Helper()
	pids := lazyDaemons(id)
	if len(pids) != 1 {
		t.Fatalf("lazy-pages daemons of %s right after its restore: %v, want one", id, pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	return pids[0]
}

// TestLinuxForkLazyPages forks a sandbox whose Python process holds
// 256 MiB, restoring with lazy pages (a criu lazy-pages daemon copies
// the memory in after the restore, a page on demand before):
//   - a fork gets every byte: the blob hashes as the source's;
//   - a fork whose daemon is killed before it copied everything is
//     killed too, never left reading zeros where its memory was;
//   - a fork destroyed at once leaves no daemon behind;
//   - a fork of a fork, and a pause by checkpoint of that, made at once,
//     wait for the copy: their memory is whole too;
//   - Close waits for the daemons, then the images are gone, and
//     nothing leaks;
//   - a gateway restarted before a daemon was done does not adopt its
//     fork (it may miss pages): its processes are killed.
func TestLinuxForkLazyPages(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	requireLazyCriu(t, criu)
	// The daemons of the forks named "-slow-" copy slowly (5% of a CPU),
	// so that the test acts while they still copy.
	slow := slowLazyCriu(t, criu)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	var logs lockedBuffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: slow,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := sandbox.Limits{MemoryBytes: 1 << 30}
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-lazy-src", Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	// blobServer's blob, 256 MiB: its copy at 5% of a CPU takes seconds.
	mustRun(t, src, strings.Replace(blobServer, "(400 << 10)", "(1024 << 10)", 1))
	get := `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8002").read().decode())'`
	want := strings.TrimSpace(mustRun(t, src, get))
	if f := strings.Fields(want); len(f) != 2 || f[0] != f[1] {
		t.Fatalf("source's blob: %q", want)
	}
	ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			ck.Close()
		}
	})

	// A daemon killed half-way: its fork's processes go with it, and a
	// checkpoint of the fork (made while the daemon, stopped here, has
	// not copied everything in, so it waits for it) fails, as does a
	// pause by checkpoint: neither dumps the pages never copied (zeros
	// once the daemon is gone).
	killed, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-lazy-slow-killed", Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killed.Destroy(ctx) })
	pids := []int{stopDaemon(t, "sbx-lazy-slow-killed")}
	ckErr := make(chan error, 1)
	go func() {
		c, err := killed.(sandbox.Checkpointer).Checkpoint(ctx)
		if err == nil {
			c.Close()
		}
		ckErr <- err
	}()
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-ckErr; err == nil || !strings.Contains(err.Error(), "lazy pages") {
		t.Errorf("checkpoint of the fork whose lazy-pages daemon was killed: %v, want an error naming lazy pages", err)
	}
	if rep, err := killed.(sandbox.Pauser).Pause(ctx); err == nil || !strings.Contains(err.Error(), "lazy pages") {
		t.Errorf("pause of the fork whose lazy-pages daemon was killed: %+v, %v, want an error naming lazy pages", rep, err)
	}
	ran := func() bool {
		p, err := killed.Start(ctx, sandbox.Cmd{Command: "true"})
		if err != nil {
			return false
		}
		p.Stdin().Close()
		e, err := p.Wait()
		return err == nil && e.Code == 0 && e.Signal == ""
	}
	if !waitFor(10*time.Second, func() bool { return !ran() }) {
		t.Fatal("the fork whose lazy-pages daemon was killed still runs commands")
	}
	if !waitFor(10*time.Second, func() bool {
		return strings.Contains(logs.String(), "sandbox_lazy_pages_failed sandbox=sbx-lazy-slow-killed")
	}) {
		t.Errorf("no sandbox_lazy_pages_failed for the killed daemon's fork: %s", logs.String())
	}

	// Destroyed at once: its daemon ends.
	gone, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-lazy-gone", Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// A fork that runs gets every byte, served on demand while the
	// daemon copies the rest.
	ok, err := ck.Restore(ctx, sandbox.Spec{ID: "sbx-lazy-slow-ok", Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ok.Destroy(ctx) })
	// Its daemon, held back (lazyNice) only while other restores of ck
	// run, copies at the gateway's priority once none is.
	own, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pids := lazyDaemons("sbx-lazy-slow-ok"); len(pids) != 1 {
		t.Errorf("lazy-pages daemons of sbx-lazy-slow-ok right after its restore: %v, want one", pids)
	} else if p, err := syscall.Getpriority(syscall.PRIO_PROCESS, pids[0]); err != nil || p != own {
		t.Errorf("lazy-pages daemon %d after the restores: priority %d (%v), want the gateway's %d", pids[0], p, err, own)
	}
	// At once, before its daemon is done: a fork of it, then a pause by
	// checkpoint (each dump waits for the copy: CRIU dumps only the pages
	// present), and a resume.
	ck3, err := ok.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ok2, err := ck3.Restore(ctx, sandbox.Spec{ID: "sbx-lazy-ok2", Limits: lim})
	ck3.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ok2.Destroy(ctx) })
	if rep, err := ok2.(sandbox.Pauser).Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Fatalf("pause of a fork of a fork: %+v, %v; want a pause by checkpoint", rep, err)
	}
	if err := ok2.(sandbox.Pauser).Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	for i, f := range []sandbox.Sandbox{ok, ok2} {
		if got := strings.TrimSpace(mustRun(t, f, get)); got != want {
			t.Errorf("blob of fork %d (1: a fork of it, paused and resumed): %q, want %q", i, got, want)
		}
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, id := range []string{"sbx-lazy-slow-killed", "sbx-lazy-gone", "sbx-lazy-slow-ok", "sbx-lazy-ok2"} {
		if pids := lazyDaemons(id); len(pids) != 0 {
			t.Errorf("lazy-pages daemons of %s after Close: %v", id, pids)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", ".checkpoints", "*")); len(left) != 0 {
		t.Errorf("checkpoint images left after Close: %v", left)
	}
	// Close waited for each daemon's end to be dealt with: the forks'
	// markers are gone (a restart adopts them).
	for _, id := range []string{"sbx-lazy-slow-ok", "sbx-lazy-ok2"} {
		if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id, "lazy-pages")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("lazy-pages marker of %s after Close: %v, want none", id, err)
		}
	}
	if strings.Contains(logs.String(), "sandbox_lazy_pages_failed sandbox=sbx-lazy-gone") {
		t.Errorf("the lazy-pages daemon of a fork destroyed at once failed: %s", logs.String())
	}
	if !strings.Contains(logs.String(), "sandbox_lazy_pages_done sandbox=sbx-lazy-ok") {
		t.Errorf("no sandbox_lazy_pages_done for the fork that ran: %s", logs.String())
	}
	if got := strings.TrimSpace(mustRun(t, src, get)); got != want {
		t.Errorf("source's blob after the forks: %q, want %q", got, want)
	}

	// A gateway restarted while a daemon copies (stopped here, so that it
	// cannot finish) does not adopt the fork: its processes are killed.
	ck2, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck2.Close() })
	if _, err := ck2.Restore(ctx, sandbox.Spec{ID: "sbx-lazy-slow-restart", Limits: lim}); err != nil {
		t.Fatal(err)
	}
	pids = []int{stopDaemon(t, "sbx-lazy-slow-restart")}
	t.Cleanup(func() { _ = syscall.Kill(pids[0], syscall.SIGKILL) })
	d2, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, KeepOrphans: true}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d2.Adopt(ctx, "sbx-lazy-slow-restart")
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "lazy pages") {
		t.Fatalf("Adopt of a fork whose memory was still being copied: %v, want os.ErrNotExist naming lazy pages", err)
	}
	left := func() (out []string) {
		procs, _ := filepath.Glob("/sys/fs/cgroup/*/sandgate/sbx-lazy-slow-restart/*/cgroup.procs")
		more, _ := filepath.Glob("/sys/fs/cgroup/*/sandgate/sbx-lazy-slow-restart/cgroup.procs")
		for _, p := range append(procs, more...) {
			if b, _ := os.ReadFile(p); len(bytes.TrimSpace(b)) != 0 {
				out = append(out, p+": "+strings.Join(strings.Fields(string(b)), " "))
			}
		}
		return out
	}
	if !waitFor(5*time.Second, func() bool { return len(left()) == 0 }) {
		t.Errorf("processes left after the refused Adopt: %v", left())
	}
	_ = syscall.Kill(pids[0], syscall.SIGKILL)
	if err := d2.Remove(ctx, "sbx-lazy-slow-restart"); err != nil {
		t.Fatal(err)
	}

	// A fork stopped while its daemon copies (stopped here, so that it
	// cannot finish, as if the gateway had died) has no process left
	// that could miss a page: a restarted gateway adopts it stopped, and
	// once resumed neither the next restart nor the daemon's end (a
	// failure) kills what runs in it then, nor does that end keep it
	// from a pause by checkpoint.
	ck4, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck4.Close() })
	stopped, err := ck4.Restore(ctx, sandbox.Spec{ID: "sbx-lazy-slow-stopped", Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stopped.Destroy(ctx) })
	pids = []int{stopDaemon(t, "sbx-lazy-slow-stopped")}
	t.Cleanup(func() { _ = syscall.Kill(pids[0], syscall.SIGKILL) })
	if err := stopped.(sandbox.Stopper).Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := func() {
		t.Helper()
		dr, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, KeepOrphans: true}, smallInit(t))
		if err != nil {
			t.Fatal(err)
		}
		sb, err := dr.Adopt(ctx, "sbx-lazy-slow-stopped")
		if err != nil {
			t.Fatalf("Adopt after a restart of a fork stopped while its daemon could not finish: %v", err)
		}
		if err := sb.(sandbox.Detacher).Detach(ctx); err != nil {
			t.Fatal(err)
		}
	}
	restarted()
	if err := stopped.(sandbox.Stopper).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	restarted()
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool {
		return strings.Contains(logs.String(), "sandbox_lazy_pages_failed sandbox=sbx-lazy-slow-stopped")
	}) {
		t.Errorf("no sandbox_lazy_pages_failed for the stopped fork's daemon: %s", logs.String())
	}
	if got := strings.TrimSpace(mustRun(t, stopped, "echo up")); got != "up" {
		t.Errorf("the resumed fork after its old daemon's end: %q", got)
	}
	if rep, err := stopped.(sandbox.Pauser).Pause(ctx); err != nil || rep.Method != "checkpoint" {
		t.Errorf("pause of the resumed fork after its old daemon's end: %+v, %v; want a pause by checkpoint", rep, err)
	}
}

// TestLinuxForkEager: with Config.EagerForks a fork's restore copies the
// memory in before its processes run, with no lazy-pages daemon, even
// where the criu could restore lazily.
func TestLinuxForkEager(t *testing.T) {
	requireLinux(t)
	criu := criuForTest(t)
	requireLazyCriu(t, criu)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	var logs lockedBuffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: dataDir, Checkpoint: true, CRIU: criu, EagerForks: true,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-eager-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Destroy(ctx) })
	mustRun(t, src, varServer)
	forks := forkAll(ctx, t, src, "sbx-eager-a")
	if v := getVar(t, forks[0]); v != "from-source-xxxxxxxxxx" {
		t.Errorf("fork's variable %q, want the source's", v)
	}
	out := logs.String()
	if !strings.Contains(out, "msg=sandbox_restored sandbox=sbx-eager-a") {
		t.Fatalf("no sandbox_restored line: %s", out)
	}
	if strings.Contains(out, "lazy_pages") {
		t.Errorf("an eager fork's restore ran a lazy-pages daemon: %s", out)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", "sbx-eager-a", "lazy-pages")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an eager fork has a lazy-pages marker: %v", err)
	}
}
