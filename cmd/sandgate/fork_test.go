package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
)

// criuForTest returns a criu 4.x for serve --criu ($SANDGATE_CRIU, else the
// one .ci/run builds in ~/.cache/sandgate); it skips without one and fails
// under CI=true, where .ci/run builds it.
func criuForTest(t *testing.T) string {
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
		t.Fatal("no criu 4.x: .ci/run builds one in ~/.cache/sandgate/criu-4.2")
	}
	t.Skip("no criu 4.x: set SANDGATE_CRIU")
	return ""
}

// checkpointsLeft lists the checkpoint images of g's data dir that are
// still there 10 s after a fork's answer (they are deleted right after it).
func checkpointsLeft(g *gatewayProc) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		left, _ := filepath.Glob(filepath.Join(g.DataDir, "sandboxes", ".checkpoints", "*"))
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type forkAnswer struct {
	Sessions []sessionJSON `json:"sessions"`
}

// TestForkCarriesKernel: POST /fork {"count": 2} copies a running linux
// session twice: each fork's Python kernel has the source's variable,
// then its own; files written in one fork are in no other session; each
// fork's egress follows its own policy; the checkpoint's images are gone
// once the fork answers; the source runs on.
func TestForkCarriesKernel(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	f := newEgressFixture(t)
	g := startGateway(t, append(f.args, "--checkpoint", "--criu", criu)...)
	hp, tp := ":"+f.httpPort, ":"+f.tlsPort
	var src egressSession
	body := map[string]any{
		"egress":  []string{"pypi.test" + hp, "secret.test" + tp},
		"secrets": []any{map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test" + tp}, "header": "Authorization", "format": "Bearer {value}"}},
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &src); code != http.StatusCreated {
		logs, _ := exec.Command("sh", "-c", "tail -n 20 "+g.DataDir+"/sandboxes/*/init.log").CombinedOutput()
		t.Fatalf("create: %d\n%s\n%s", code, g.stderr.String(), logs)
	}
	if a := runPython(t, g, src.SessionID, map[string]any{"code": "x = 4242\nblob = bytearray(16 << 20)\nx"}); a.result() != "4242" {
		t.Fatalf("python: %+v", a)
	}
	if a := runREST(t, g, src.SessionID, map[string]any{"command": "echo src > /workspace/src.txt"}); a.code() != 0 {
		t.Fatalf("write: %+v", a)
	}
	if a := runREST(t, g, src.SessionID, map[string]any{"command": "mkdir -p /tmp/deep && cd /tmp/deep && export FORK_VAR=kept && plain=1", "shell": "main"}); a.code() != 0 {
		t.Fatalf("shell: %+v", a)
	}

	bg := procClient{g: g, base: "/v1/sessions/" + src.SessionID + "/processes"}.start(t,
		map[string]any{"command": "i=0; while :; do echo tick$i; i=$((i+1)); sleep 0.2; done"})

	// Bad counts first.
	for _, n := range []int{0, 9} {
		var e apiError
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+src.SessionID+"/fork", map[string]any{"count": n}, &e); code != http.StatusBadRequest || e.Error.Code != "invalid_count" {
			t.Errorf("fork count %d: %d %+v", n, code, e)
		}
	}
	var fa forkAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+src.SessionID+"/fork", map[string]any{"count": 2}, &fa); code != http.StatusCreated || len(fa.Sessions) != 2 {
		t.Fatalf("fork: %d %+v\n%s", code, fa, g.stderr.String())
	}
	if left := checkpointsLeft(g); len(left) != 0 {
		t.Errorf("checkpoint images left after the fork: %v", left)
	}
	ids := []string{fa.Sessions[0].SessionID, fa.Sessions[1].SessionID}
	for i, s := range fa.Sessions {
		if s.SessionID == src.SessionID || s.SSH.Password == "" {
			t.Fatalf("fork %d: %+v", i, s)
		}
	}
	for i, id := range ids {
		if a := runPython(t, g, id, map[string]any{"code": "x"}); a.result() != "4242" || a.StateLost {
			t.Errorf("fork %d: x = %+v", i, a)
		}
		if a := runREST(t, g, id, map[string]any{"command": "cat /workspace/src.txt"}); a.out() != "src\n" {
			t.Errorf("fork %d: src.txt %+v", i, a)
		}
		if out := runREST(t, g, id, map[string]any{"command": "pwd; echo $FORK_VAR $plain", "shell": "main"}).out(); out != "/tmp/deep\nkept 1\n" {
			t.Errorf("fork %d: its persistent shell says %q", i, out)
		}
	}
	// The background process goes on in each fork, its output with it.
	for i, id := range ids {
		c := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
		if p := c.get(t, bg.ProcessID); p.Status != "running" {
			t.Errorf("fork %d: background process %+v", i, p)
			continue
		}
		deadline := time.Now().Add(20 * time.Second)
		for c.get(t, bg.ProcessID).OutputBytes < 200 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		lines, cancel := c.output(t, bg.ProcessID, 0, false)
		var out strings.Builder
		for l := range lines {
			out.WriteString(l.Stdout)
		}
		cancel()
		if !strings.HasPrefix(out.String(), "tick0\n") || out.Len() < 200 {
			t.Errorf("fork %d: background output %q", i, out.String())
		}
	}
	// They diverge.
	for i, id := range ids {
		runPython(t, g, id, map[string]any{"code": "x = " + string(rune('1'+i))})
	}
	runREST(t, g, ids[0], map[string]any{"command": "echo a > /workspace/a.txt"})
	for i, id := range ids {
		if a := runPython(t, g, id, map[string]any{"code": "x"}); a.result() != string(rune('1'+i)) {
			t.Errorf("fork %d: x = %+v after setting it", i, a)
		}
	}
	if a := runPython(t, g, src.SessionID, map[string]any{"code": "x"}); a.result() != "4242" {
		t.Errorf("source: x = %+v after the forks set theirs", a)
	}
	for _, id := range []string{src.SessionID, ids[1]} {
		if a := runREST(t, g, id, map[string]any{"command": "test -e /workspace/a.txt"}); a.code() == 0 {
			t.Errorf("%s sees fork 0's file", id)
		}
	}
	// A bound secret reaches its host from a fork too: bound again to the
	// fork's own proxy, which the fork trusts (its source's CA).
	if a := runREST(t, g, ids[0], map[string]any{"command": "curl -sS --max-time 20 https://secret.test" + tp + "/auth 2>&1; true"}); a.out() != "authorized\n" {
		t.Errorf("bound secret from fork 0: %q", a.out())
	}
	// Egress: each follows its own policy (by default the source's).
	if code := g.api(t, http.MethodPatch, "/v1/sessions/"+ids[1], map[string]any{"egress": []string{}}, nil); code != http.StatusOK {
		t.Fatalf("patch fork 1's egress: %d", code)
	}
	get := "curl -sS --max-time 20 http://pypi.test" + hp + "/hello"
	for _, c := range []struct {
		id, want string
	}{
		{src.SessionID, "hello from pypi.test" + hp},
		{ids[0], "hello from pypi.test" + hp},
		{ids[1], "denied"},
	} {
		a := runREST(t, g, c.id, map[string]any{"command": get + " 2>&1; true"})
		if !strings.Contains(a.out(), c.want) {
			t.Errorf("%s: %q, want %q", c.id, a.out(), c.want)
		}
	}
	// A fork is forked again: the fork of a fork has fork 0's kernel
	// variable, files and shell, as they are now.
	var ff forkAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+ids[0]+"/fork", map[string]any{"count": 1}, &ff); code != http.StatusCreated || len(ff.Sessions) != 1 {
		t.Fatalf("fork of a fork: %d %+v\n%s", code, ff, g.stderr.String())
	}
	fid := ff.Sessions[0].SessionID
	if a := runPython(t, g, fid, map[string]any{"code": "x"}); a.result() != "1" || a.StateLost {
		t.Errorf("fork of a fork: x = %+v, want fork 0's 1", a)
	}
	if a := runREST(t, g, fid, map[string]any{"command": "cat /workspace/a.txt"}); a.out() != "a\n" {
		t.Errorf("fork of a fork: a.txt %+v", a)
	}
	if out := runREST(t, g, fid, map[string]any{"command": "pwd; echo $FORK_VAR", "shell": "main"}).out(); out != "/tmp/deep\nkept\n" {
		t.Errorf("fork of a fork: its persistent shell says %q", out)
	}
	if left := checkpointsLeft(g); len(left) != 0 {
		t.Errorf("checkpoint images left after the fork of a fork: %v", left)
	}
}

// TestForkGatewayLimit: at most gateway.MaxConcurrentForks forks run on
// the gateway at once (each dumps a session's memory and workspace, then
// restores it up to 8 times): one more is refused with 503
// fork_gateway_limit, and those under way complete.
func TestForkGatewayLimit(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	// The real criu, whose dumps wait for the test's word before they
	// start (no process is held meanwhile).
	wrapper := filepath.Join(dir, "criu")
	script := "#!/bin/sh\nif [ \"$1\" = dump ]; then touch " + dir + "/dumping.$$; while [ ! -e " + release + " ]; do sleep 0.1; done; fi\nexec \"" + criu + "\" \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", wrapper)
	srcs := []sessionJSON{g.createSession(t), g.createSession(t)}
	codes := make(chan int, len(srcs))
	var forks [2]forkAnswer
	for i, s := range srcs {
		go func() {
			codes <- g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/fork", map[string]any{"count": 1}, &forks[i])
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m, _ := filepath.Glob(filepath.Join(dir, "dumping.*")); len(m) == len(srcs) {
			break
		}
		if time.Now().After(deadline) {
			_ = os.WriteFile(release, nil, 0o644)
			t.Fatalf("the two forks did not reach their dumps\n%s", g.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A gateway without the bound queues the third behind the first
	// (same source): the dumps go on after a while, not to hang.
	late := time.AfterFunc(20*time.Second, func() { _ = os.WriteFile(release, nil, 0o644) })
	defer late.Stop()
	var e apiError
	code := g.api(t, http.MethodPost, "/v1/sessions/"+srcs[0].SessionID+"/fork", map[string]any{"count": 1}, &e)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || e.Error.Code != "fork_gateway_limit" {
		t.Errorf("a third fork at once: %d %+v", code, e)
	}
	for range srcs {
		if c := <-codes; c != http.StatusCreated {
			t.Errorf("a fork under way: %d\n%s", c, g.stderr.String())
		}
	}
	// Once they are done, a fork runs again.
	var fa forkAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+srcs[0].SessionID+"/fork", map[string]any{"count": 1}, &fa); code != http.StatusCreated {
		t.Errorf("a fork after the others: %d", code)
	}
}

// TestForkSlotHeldForRemoval: a fork answered holds its slot of
// gateway.MaxConcurrentForks until its images are removed, after the
// answer; a fork that finds the slots held, one of them only for such a
// removal, waits for it rather than being refused (503
// fork_gateway_limit) for a fork its client saw done.
func TestForkSlotHeldForRemoval(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	dir := t.TempDir()
	// The real criu, whose dump leaves many files beside its images
	// (which no restore reads): their removal takes a while.
	wrapper := filepath.Join(dir, "criu")
	script := "#!/bin/sh\n\"" + criu + "\" \"$@\"; rc=$?\n" +
		"if [ \"$1\" = dump ] && [ $rc = 0 ]; then prev=; for a in \"$@\"; do [ \"$prev\" = -D ] && d=$a; prev=$a; done; " +
		"mkdir \"$d/slow\" && cd \"$d/slow\" && seq 1 20000 | xargs touch; fi\nexit $rc\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", wrapper)
	srcs := []sessionJSON{g.createSession(t), g.createSession(t)}
	var first forkAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+srcs[0].SessionID+"/fork", map[string]any{"count": 1}, &first); code != http.StatusCreated {
		t.Fatalf("fork: %d\n%s", code, g.stderr.String())
	}
	// Right after the answer, its images still being removed: two more.
	type answer struct {
		code int
		e    apiError
	}
	answers := make(chan answer, len(srcs))
	for _, s := range srcs {
		go func() {
			var a answer
			a.code = g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/fork", map[string]any{"count": 1}, &a.e)
			answers <- a
		}()
	}
	for range srcs {
		if a := <-answers; a.code != http.StatusCreated {
			t.Errorf("a fork while an answered one's images are removed: %d %+v", a.code, a.e)
		}
	}
	if left := checkpointsLeft(g); len(left) != 0 {
		t.Errorf("checkpoint images left after the forks: %v", left)
	}
}

// TestForkServerTiming: with --server-timing, a fork's answer times its
// steps (checkpoint, restores, images removed), and none of its creates'
// own steps, which run at once; by default, the total alone.
func TestForkServerTiming(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	for _, timed := range []bool{false, true} {
		args := []string{"--sandbox", "linux", "--checkpoint", "--criu", criu, "--warm-pool", "0"}
		if timed {
			args = append(args, "--server-timing")
		}
		g := startGateway(t, args...)
		var src sessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &src); code != http.StatusCreated {
			t.Fatalf("create: %d\n%s", code, g.stderr.String())
		}
		req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions/"+src.SessionID+"/fork", strings.NewReader(`{"count": 2}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+g.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("fork: %d\n%s", resp.StatusCode, g.stderr.String())
		}
		h := resp.Header.Get("Server-Timing")
		want := regexp.MustCompile(`^total;dur=[0-9.]+$`)
		if timed {
			want = regexp.MustCompile(`^checkpoint;dur=[0-9.]+, restores;dur=[0-9.]+, total;dur=[0-9.]+$`)
		}
		if !want.MatchString(h) {
			t.Errorf("--server-timing %v: the fork's Server-Timing is %q, want %s", timed, h, want)
		}
	}
}

// TestForkWithMostBackgroundProcesses: a session running as many
// background processes as it may (dataplane.DefaultMaxRunning), each
// with its input open, forks: the gateway grew their input and output
// pipes to 1 MiB, which the restore recreates as the sandbox's
// unprivileged user, whose pipes count against fs.pipe-user-pages-soft
// (64 pipes of 1 MiB); the gateway gives them the default size back as it
// lets go of them. (Every such fork's restore failed: CRIU's "Can't
// restore pipe size: Operation not permitted".)
func TestForkWithMostBackgroundProcesses(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	var last restProcess
	for range dataplane.DefaultMaxRunning {
		last = pc.start(t, map[string]any{"command": "read line; echo got-$line"})
	}
	var fa forkAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/fork", map[string]any{"count": 1}, &fa); code != http.StatusCreated || len(fa.Sessions) != 1 {
		t.Fatalf("fork: %d %+v\n%s", code, fa, g.stderr.String())
	}
	// The fork's copy of a process reads its input and answers.
	fp := procClient{g: g, base: "/v1/sessions/" + fa.Sessions[0].SessionID + "/processes"}
	if code := g.api(t, http.MethodPost, fp.base+"/"+last.ProcessID+"/stdin", map[string]any{"data": "fork\n"}, nil); code != http.StatusNoContent {
		t.Fatalf("stdin of the fork's %s: %d", last.ProcessID, code)
	}
	if p := fp.waitEnd(t, last.ProcessID); p.Status != "exited" || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("the fork's %s: %+v", last.ProcessID, p)
	}
	lines, _ := fp.output(t, last.ProcessID, 0, false)
	if data, _, _, _ := collect(t, lines); string(data) != "got-fork\n" {
		t.Errorf("the fork's %s wrote %q", last.ProcessID, data)
	}
}
