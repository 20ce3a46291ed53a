package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
)

var warmReadyRE = regexp.MustCompile(`msg=warm_sandbox_ready sandbox=(\S+)`)

// warmReady lists the warm sandboxes g logged as ready, oldest first.
func (g *gatewayProc) warmReady() []string {
	var ids []string
	for _, m := range warmReadyRE.FindAllStringSubmatch(g.stderr.String(), -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// sandboxDirs lists the sandboxes on disk of g (sessions and warm ones).
func sandboxDirs(g *gatewayProc) []string {
	entries, _ := os.ReadDir(filepath.Join(g.DataDir, "sandboxes"))
	var ids []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// probeScript prints what a session can observe of its sandbox, in a
// form that does not depend on its id (which it prints as ID and SHORT)
// or on the moment it runs. A process of the probe's own pipelines that
// ps lists with no command line yet ("[exe]": busybox's ps, between its
// fork and its exec; seen once in an image session) is left out.
const probeScript = `echo "hostname=$(hostname)"; echo "--etc"; cat /etc/hostname /etc/hosts;
echo "--ps"; ps -eo pid,user,args | grep -v ' ps -eo\|grep\|sed\|sort\|\[exe\]$' ;
echo "--env"; env | sort | grep -v '^_=\|^SHLVL=\|^PWD=';
echo "--files"; find /tmp /workspace /dev/shm /run 2>/dev/null | sort;
echo "--limits"; ulimit -a; id; pwd;
echo "--mounts"; cut -d' ' -f2-4 /proc/self/mounts | sort;
echo "--cgroups"; cat /proc/self/cgroup /proc/1/cgroup`

func probeSandbox(t *testing.T, g *gatewayProc, id string) string {
	t.Helper()
	a := runREST(t, g, id, map[string]any{"command": probeScript})
	if a.code() != 0 {
		t.Fatalf("probe in %s: exit %d: %s", id, a.code(), a.out())
	}
	out := strings.NewReplacer(id, "ID", sandbox.ShortID(id), "SHORT").Replace(a.out())
	// Host ids in mount options name the sandbox's uid range, which
	// is drawn at random.
	return hostIDsRE.ReplaceAllString(out, "${1}=HOST")
}

var hostIDsRE = regexp.MustCompile(`\b(uid|gid)=[12]\d{9}\b`)

// cgroupLimits reads the host side of session id's cgroup limits (v1:
// the commands' cgroup; v2: the sandbox's), and its CPU weight (a warm
// sandbox has the least until its claim).
func cgroupLimits(id string) string {
	var b strings.Builder
	for _, f := range []string{
		"memory/sandgate/%s/procs/memory.limit_in_bytes", "memory/sandgate/%s/memory.limit_in_bytes",
		"pids/sandgate/%s/procs/pids.max", "pids/sandgate/%s/pids.max",
		"cpu/sandgate/%s/procs/cpu.cfs_quota_us", "cpu,cpuacct/sandgate/%s/procs/cpu.cfs_quota_us",
		"sandgate/%s/memory.max", "sandgate/%s/pids.max", "sandgate/%s/cpu.max",
		"cpu/sandgate/%s/cpu.shares", "cpu,cpuacct/sandgate/%s/cpu.shares", "sandgate/%s/cpu.weight",
	} {
		p := filepath.Join("/sys/fs/cgroup", fmt.Sprintf(f, id))
		if v, err := os.ReadFile(p); err == nil {
			fmt.Fprintf(&b, "%s=%s\n", strings.ReplaceAll(f, "%s", "ID"), strings.TrimSpace(string(v)))
		}
	}
	return b.String()
}

// TestWarmPoolClaimIsACreate: with --warm-pool, a create claims a sandbox
// built ahead, and the session it gets cannot be told from one a cold
// create (--warm-pool 0, same flags) makes: its hostname and /etc, its
// processes, environment, files, open-file and process limits, mounts,
// and its cgroup limits on the host (asked for at create, applied at
// claim). Warm sandboxes count towards no quota, are in no list, the pool
// refills after a burst, and a stop leaves none of them behind.
func TestWarmPoolClaimIsACreate(t *testing.T) {
	requireLinuxDriver(t)
	common := []string{"--sandbox", "linux", "--max-sessions-per-tenant", "3"}
	warmG := startGateway(t, append([]string{"--warm-pool", "2", "--log-level", "debug"}, common...)...)
	coldG := startGateway(t, append([]string{"--warm-pool", "0"}, common...)...)

	waitFor(t, time.Minute, "two warm sandboxes", func() bool { return len(warmG.warmReady()) >= 2 })
	warm := warmG.warmReady()
	if got := len(sandboxDirs(warmG)); got != 2 {
		t.Fatalf("%d sandboxes on disk with a pool of 2 and no session", got)
	}
	var list struct {
		Sessions []any `json:"sessions"`
		Total    int   `json:"total"`
	}
	if code := warmG.api(t, http.MethodGet, "/v1/sessions", nil, &list); code != 200 || list.Total != 0 {
		t.Fatalf("list with only warm sandboxes: %d %+v", code, list)
	}

	body := map[string]any{"ttl": 600, "labels": map[string]any{"k": "v"},
		"resources": map[string]any{"memoryMiB": 200, "pids": 100, "cpus": 0.5}}
	create := func(g *gatewayProc) sessionJSON {
		var s sessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
			t.Fatalf("create: %d", code)
		}
		return s
	}
	ws, cs := create(warmG), create(coldG)
	if !slices.Contains(warm, ws.SessionID) {
		t.Fatalf("session %s is not one of the warm sandboxes %v", ws.SessionID, warm)
	}
	if !strings.Contains(warmG.stderr.String(), "session="+ws.SessionID+" ") ||
		!regexp.MustCompile(`session_created session=`+ws.SessionID+` .*warm=true`).MatchString(warmG.stderr.String()) {
		t.Errorf("the gateway did not log the claim as warm")
	}
	wp, cp := probeSandbox(t, warmG, ws.SessionID), probeSandbox(t, coldG, cs.SessionID)
	if wp != cp {
		t.Errorf("a warm session differs from a cold one:\n--- warm\n%s\n--- cold\n%s", wp, cp)
	}
	if !strings.Contains(wp, "hostname=SHORT") {
		t.Errorf("the warm session's hostname is not its own id's:\n%s", wp)
	}
	wl, cl := cgroupLimits(ws.SessionID), cgroupLimits(cs.SessionID)
	if wl != cl || !strings.Contains(wl, fmt.Sprint(200<<20)) {
		t.Errorf("cgroup limits of a warm session differ from a cold one's:\n--- warm\n%s--- cold\n%s", wl, cl)
	}
	var got struct {
		Labels    map[string]any `json:"labels"`
		Metadata  map[string]any `json:"metadata"`
		Resources struct {
			MemoryMiB int64 `json:"memoryMiB"`
		} `json:"resources"`
	}
	if code := warmG.api(t, http.MethodGet, "/v1/sessions/"+ws.SessionID, nil, &got); code != 200 || got.Resources.MemoryMiB != 200 {
		t.Errorf("warm session as the API shows it: %d %+v", code, got)
	}

	// A burst: two more creates fill the tenant's quota of 3 (the pool's
	// sandboxes do not count); the one after is refused.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if code := warmG.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, nil); code != http.StatusCreated {
				t.Errorf("burst create: %d", code)
			}
		})
	}
	wg.Wait()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if code := warmG.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &e); code != http.StatusTooManyRequests || e.Error.Code != "quota_exceeded" {
		t.Errorf("fourth create with a quota of 3: %d %+v", code, e)
	}
	// The pool is full again: 3 sessions and 2 warm sandboxes, ready.
	waitFor(t, time.Minute, "3 sessions and 2 warm sandboxes", func() bool {
		dirs, ready := sandboxDirs(warmG), warmG.warmReady()
		return len(dirs) == 5 && !slices.ContainsFunc(dirs, func(id string) bool {
			return !slices.Contains(ready, id) && !slices.Contains(warmG.sessionIDs(), id)
		})
	})
	if code := warmG.api(t, http.MethodGet, "/v1/sessions", nil, &list); code != 200 || list.Total != 3 {
		t.Errorf("list: %d, total %d, want 3", code, list.Total)
	}

	// Stopping tears the warm sandboxes down with the sessions (stop's
	// assertNoLeftovers checks the data dir and the mounts): their
	// cgroups are gone too.
	pooled := slices.DeleteFunc(sandboxDirs(warmG), func(id string) bool { return slices.Contains(warmG.sessionIDs(), id) })
	if len(pooled) != 2 {
		t.Fatalf("warm sandboxes on disk: %v", pooled)
	}
	warmG.stop(t)
	for _, id := range pooled {
		if l := cgroupLimits(id); l != "" {
			t.Errorf("cgroups of warm sandbox %s left behind:\n%s", id, l)
		}
	}
}

// TestWarmPoolEgress: a create with egress, an environment secret, a
// secret bound to a host (its session CA joins the trust store at claim)
// and resources claims a warm sandbox too; its proxy, policy and secrets
// are the session's (it reaches what its list allows, no more; the bound
// secret is injected), and what the session sees is what a cold create of
// the same request shows.
func TestWarmPoolEgress(t *testing.T) {
	requireLinuxDriver(t)
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	warmG := startGateway(t, append([]string{"--warm-pool", "1", "--log-level", "debug"}, f.args...)...)
	coldG := startGateway(t, append([]string{"--warm-pool", "0"}, f.args...)...)
	waitFor(t, time.Minute, "a warm sandbox", func() bool { return len(warmG.warmReady()) >= 1 })
	hp, tp := ":"+f.httpPort, ":"+f.tlsPort
	body := map[string]any{"egress": []string{"pypi.test" + hp, "secret.test" + tp},
		"secrets":   []any{"CANARY_TOKEN", map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test" + tp}, "header": "Authorization", "format": "Bearer {value}"}},
		"resources": map[string]any{"memoryMiB": 300}}
	create := func(g *gatewayProc) string {
		var s sessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
			t.Fatalf("create: %d", code)
		}
		return s.SessionID
	}
	wid, cid := create(warmG), create(coldG)
	if !slices.Contains(warmG.warmReady(), wid) {
		t.Fatalf("session %s did not claim a warm sandbox", wid)
	}
	probe := `curl -sS --max-time 20 http://pypi.test` + hp + `/hello; curl -sS --max-time 20 -o /dev/null -w '%{http_code}\n' http://other.test` + hp + `/hello;
printenv CANARY_TOKEN; curl -sS --max-time 20 https://secret.test` + tp + `/auth; env | grep -i 'proxy\|ssl\|cert' | sort`
	for _, x := range []struct {
		g  *gatewayProc
		id string
	}{{warmG, wid}, {coldG, cid}} {
		out := runREST(t, x.g, x.id, map[string]any{"command": probe}).out()
		if !strings.Contains(out, "hello from pypi.test"+hp+"\n403\n"+canary+"\nauthorized\n") {
			t.Errorf("egress and secret in %s: %q", x.id, out)
		}
	}
	wp, cp := probeSandbox(t, warmG, wid), probeSandbox(t, coldG, cid)
	if wp != cp {
		t.Errorf("a warm session with egress differs from a cold one:\n--- warm\n%s\n--- cold\n%s", wp, cp)
	}
	if wl, cl := cgroupLimits(wid), cgroupLimits(cid); wl != cl {
		t.Errorf("cgroup limits: warm\n%s cold\n%s", wl, cl)
	}
}

// TestWarmPoolDeadSandboxNotReused: a warm sandbox whose init died while
// idle is discarded at the next create, which builds a sandbox of its own
// under a fresh id: never the dead one's, whose teardown (its directory,
// cgroups and mounts, named by that id) runs beside the create.
func TestWarmPoolDeadSandboxNotReused(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux", "--warm-pool", "1", "--log-level", "debug")
	waitFor(t, time.Minute, "a warm sandbox", func() bool { return len(g.warmReady()) >= 1 })
	dead := g.warmReady()[0]
	killWarmInit(t, g, dead)
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s); code != http.StatusCreated {
		t.Fatalf("create with only a dead warm sandbox in the pool: %d\n%s", code, g.stderr.String())
	}
	if s.SessionID == dead {
		t.Fatalf("the session took the id %s of the dead warm sandbox being torn down", dead)
	}
	waitFor(t, time.Minute, "the dead warm sandbox to be removed", func() bool {
		_, err := os.Stat(filepath.Join(g.DataDir, "sandboxes", dead))
		return os.IsNotExist(err)
	})
	if a := runREST(t, g, s.SessionID, map[string]any{"command": "echo alive"}); a.code() != 0 || a.out() != "alive\n" {
		t.Fatalf("session after the dead warm sandbox's teardown: %+v", a)
	}
}

// TestWarmPoolReplacesDeadSandbox: a warm sandbox whose init dies while
// idle is removed and replaced at once, not left in the pool, holding its
// cgroups and workspace, until a create finds it dead.
func TestWarmPoolReplacesDeadSandbox(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux", "--warm-pool", "1", "--log-level", "debug")
	waitFor(t, time.Minute, "a warm sandbox", func() bool { return len(g.warmReady()) >= 1 })
	dead := g.warmReady()[0]
	killWarmInit(t, g, dead)
	waitFor(t, time.Minute, "the dead warm sandbox replaced, with no create", func() bool {
		_, err := os.Stat(filepath.Join(g.DataDir, "sandboxes", dead))
		dirs := sandboxDirs(g)
		return os.IsNotExist(err) && len(g.warmReady()) == 2 && len(dirs) == 1 && dirs[0] == g.warmReady()[1]
	})
	if l := cgroupLimits(dead); l != "" {
		t.Errorf("cgroups of the dead warm sandbox left behind:\n%s", l)
	}
}

// killWarmInit kills the init of g's warm sandbox id and waits until it
// is gone.
func killWarmInit(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.DataDir, "sandboxes", id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("state.json of %s: %v %s", id, err, b)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the warm init to die", func() bool { return syscall.Kill(st.Pid, 0) != nil })
	time.Sleep(200 * time.Millisecond) // the driver sees its end
}
