package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/internal/gwtest"
)

// The soak (issue 41 item 5): SANDGATE_SOAK_SESSIONS sessions (1,000 by
// default; bench row 14 runs 10,000) churned at a concurrency of
// SANDGATE_SOAK_CONCURRENCY (50), each created, running one REST command
// and deleted, on the linux driver with the gateway's defaults (warm pool,
// background teardown) and a mix of bodies: egress to a loopback listener,
// an OCI image from a loopback registry, a named workspace, or nothing.
// After it, the gateway must hold what it held after the warm-up: no
// mount, loop device, cgroup, network namespace, descriptor, goroutine or
// temporary file more, and its RSS within 10%. SANDGATE_SOAK_REPORT names
// a file to write the measurements to, as JSON (bench/run --rows 14).
func TestSoak(t *testing.T) {
	requireLinuxDriver(t)
	gwtest.RequireTool(t, "curl")
	sessions := soakEnvInt(t, "SANDGATE_SOAK_SESSIONS", 1000)
	conc := soakEnvInt(t, "SANDGATE_SOAK_CONCURRENCY", 50)
	rep := runSoak(t, sessions, conc)
	if p := os.Getenv("SANDGATE_SOAK_REPORT"); p != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Error(err)
		}
	}
}

func soakEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// soakReport is what a soak measured.
type soakReport struct {
	Sessions    int     `json:"sessions"`
	Concurrency int     `json:"concurrency"`
	WallSeconds float64 `json:"wallSeconds"`
	PerSecond   float64 `json:"sessionsPerSecond"`
	Mix         map[string]int
	Before      soakState `json:"before"`
	After       soakState `json:"after"`
	RSSDrift    float64   `json:"rssDrift"` // after/before - 1
	Leaks       []string  `json:"leaks"`
}

// soakState is what the gateway holds at one moment.
type soakState struct {
	RSSKiB     int64              `json:"rssKiB"`
	RSSAnonKiB int64              `json:"rssAnonKiB"` // of which the heap, stacks
	RSSFileKiB int64              `json:"rssFileKiB"` // of which mapped files (the binary, the store's)
	HeapInuse  int64              `json:"heapInuseBytes"`
	Allocated  float64            `json:"allocatedBytes"` // since the start
	Threads    int                `json:"threads"`
	Runtime    map[string]float64 `json:"runtime"` // go_memstats_*
	FDs        map[string]int     `json:"fds"`     // by kind
	Goroutines int                `json:"goroutines"`
	Mounts     []string           `json:"mounts"` // under the data dir or of a sandbox, host's and gateway's
	Loops      []string           `json:"loops"`  // backing files under the data dir
	Cgroups    []string           `json:"cgroups"`
	Files      []string           `json:"files"` // in the data dir (outside live sandboxes) and TMPDIR
	Sandboxes  []string           `json:"sandboxes"`
	// What the live (warm) sandboxes hold, which shows that each of the
	// checks above sees what it looks for.
	LiveMounts, LiveLoops, LiveCgroups int
}

type soakKind int

const (
	soakPlain soakKind = iota
	soakEgress
	soakImage
	soakWorkspace
)

func (k soakKind) String() string {
	return [...]string{"plain", "egress", "image", "workspace"}[k]
}

func runSoak(t *testing.T, sessions, conc int) soakReport {
	t.Helper()
	root := t.TempDir() // fixes the test's temp root before TMPDIR changes
	gwTmp := filepath.Join(root, "gateway-tmp")
	if err := os.Mkdir(gwTmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", gwTmp) // the gateway's (and its children's)

	_, port := upstream(t, nil)
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "tools/soak:1", imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/workspace"},
		imagestest.BusyboxLayer(t),
		imagestest.TarLayer(t, imagestest.Entry{Name: "etc/", Type: tar.TypeDir},
			imagestest.Entry{Name: "etc/image-name", Body: "soak\n"})))
	metricsAddr := "127.0.0.1:" + strconv.Itoa(gwtest.FreePort(t))
	g := startGateway(t, "--sandbox", "linux", "--warm-pool", "2", "--teardown-queue", "64",
		"--rate-limit", "0", "--max-sessions-per-tenant", strconv.Itoa(2*conc),
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", "soak.test=127.0.0.1",
		"--image-allow", reg.Host+"/tools/*", "--metrics-listen", metricsAddr, "--log-level", "debug")
	t.Setenv("TMPDIR", filepath.Dir(root))
	pid := g.cmd.Process.Pid

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc + 4}, Timeout: 2 * time.Minute}
	defer client.CloseIdleConnections()
	call := func(method, path string, body, out any) (int, error) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, g.URL+path, rd)
		req.Header.Set("Authorization", "Bearer "+g.Token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if out != nil && resp.StatusCode/100 == 2 && len(data) > 0 {
			if err := json.Unmarshal(data, out); err != nil {
				return resp.StatusCode, fmt.Errorf("decode %q: %w", data, err)
			}
		} else if resp.StatusCode/100 != 2 {
			return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, data)
		}
		return resp.StatusCode, nil
	}

	// One named workspace per worker that may hold one: a workspace has
	// one holder at a time.
	wsFree := make(chan string, conc)
	for i := range conc {
		name := fmt.Sprintf("soak-%d", i)
		if _, err := call(http.MethodPost, "/v1/workspaces", map[string]any{"name": name}, nil); err != nil {
			t.Fatalf("create workspace: %v", err)
		}
		wsFree <- name
	}

	var (
		mu      sync.Mutex
		netns   = map[string]string{} // "net:[inode]" of each session's sandbox -> session
		ids     []string
		failed  atomic.Int64
		mix     = map[string]int{}
		created atomic.Int64
	)
	one := func(i int) error {
		kind := soakKind(i % 4)
		body := map[string]any{}
		cmd := "echo soak-" + strconv.Itoa(i)
		want := "soak-" + strconv.Itoa(i) + "\n"
		var ws string
		switch kind {
		case soakEgress:
			body["egress"] = []string{"soak.test:" + port}
			cmd = "curl -sS --max-time 30 -w '%{http_code} %{size_download}\\n' http://soak.test:" + port + "/hello"
			want = "hello from soak.test:" + port + "\n200 " + strconv.Itoa(len("hello from soak.test:"+port+"\n")) + "\n"
		case soakImage:
			body["image"] = ref
			cmd = "cat /etc/image-name"
			want = "soak\n"
		case soakWorkspace:
			ws = <-wsFree
			defer func() { wsFree <- ws }()
			body["workspace"] = ws
			cmd = "echo " + strconv.Itoa(i) + " >> /workspace/log && tail -n1 /workspace/log"
			want = strconv.Itoa(i) + "\n"
		}
		var s sessionJSON
		if _, err := call(http.MethodPost, "/v1/sessions", body, &s); err != nil {
			return fmt.Errorf("create %s: %w", kind, err)
		}
		created.Add(1)
		mu.Lock()
		ids = append(ids, s.SessionID)
		mix[kind.String()]++
		mu.Unlock()
		ns := sandboxNetns(g, s.SessionID)
		var a cmdAnswer
		_, cerr := call(http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands", map[string]any{"command": cmd, "timeout": 60}, &a)
		if cerr == nil && (a.code() != 0 || a.out() != want) {
			stderr := ""
			if a.Stderr != nil {
				stderr = *a.Stderr
			}
			cerr = fmt.Errorf("command %q in %s session %s: exit %d, %q (stderr %q), want %q", cmd, kind, s.SessionID, a.code(), a.out(), stderr, want)
		}
		if ns != "" {
			mu.Lock()
			netns[ns] = s.SessionID
			mu.Unlock()
		} else if cerr == nil {
			cerr = fmt.Errorf("session %s: no network namespace found", s.SessionID)
		}
		if _, err := call(http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); err != nil {
			return fmt.Errorf("delete %s: %w", s.SessionID, err)
		}
		return cerr
	}
	churn := func(n int) time.Duration {
		start := time.Now()
		next := make(chan int)
		var wg sync.WaitGroup
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := one(i); err != nil {
						if failed.Add(1) <= 10 {
							t.Errorf("session %d: %v", i, err)
						}
					}
				}
			}()
		}
		for i := range n {
			if failed.Load() > 10 {
				break
			}
			next <- i
		}
		close(next)
		wg.Wait()
		return time.Since(start)
	}

	// Warm-up: the image is pulled, the workspaces made, the pools and
	// caches filled; then the baseline.
	churn(min(sessions, 4*conc))
	if t.Failed() {
		t.FailNow()
	}
	client.CloseIdleConnections()
	before := settleSoak(t, g, pid, gwTmp, metricsAddr, nil)
	soakProfile(t, metricsAddr, "before")
	if before.LiveMounts == 0 || before.LiveLoops == 0 || before.LiveCgroups == 0 {
		t.Fatalf("the checks do not see the warm sandboxes' mounts (%d), loop devices (%d) or cgroups (%d)",
			before.LiveMounts, before.LiveLoops, before.LiveCgroups)
	}
	rep := soakReport{Sessions: sessions, Concurrency: conc, Before: before}
	mu.Lock()
	clear(mix)
	mu.Unlock()
	created.Store(0)

	wall := churn(sessions)
	rep.WallSeconds = wall.Seconds()
	rep.PerSecond = float64(created.Load()) / wall.Seconds()
	rep.Mix = mix
	t.Logf("soak: %d sessions (%v) at concurrency %d in %v (%.1f/s)", created.Load(), mix, conc, wall.Round(time.Millisecond), rep.PerSecond)
	client.CloseIdleConnections()
	after := settleSoak(t, g, pid, gwTmp, metricsAddr, &before)
	rep.After = after
	soakProfile(t, metricsAddr, "after")
	rep.RSSDrift = float64(after.RSSKiB)/float64(before.RSSKiB) - 1

	leak := func(format string, args ...any) {
		rep.Leaks = append(rep.Leaks, fmt.Sprintf(format, args...))
	}
	for k, n := range after.FDs {
		if n > before.FDs[k] {
			leak("descriptors %s: %d after, %d before", k, n, before.FDs[k])
		}
	}
	if after.Goroutines > before.Goroutines {
		leak("goroutines: %d after, %d before", after.Goroutines, before.Goroutines)
	}
	for _, l := range []struct {
		what          string
		before, after []string
	}{{"mounts", before.Mounts, after.Mounts}, {"loop devices", before.Loops, after.Loops},
		{"cgroups", before.Cgroups, after.Cgroups}, {"files", before.Files, after.Files}} {
		if len(l.after) > len(l.before) {
			leak("%s: %d after, %d before: %s", l.what, len(l.after), len(l.before), strings.Join(firstN(l.after, 20), "; "))
		}
	}
	if held := netnsHeld(g, pid, netns); len(held) > 0 {
		leak("network namespaces of %d ended sessions still held: %s", len(held), strings.Join(firstN(held, 20), "; "))
	}
	if rep.RSSDrift > 0.10 {
		leak("gateway RSS %d KiB after, %d KiB before (%+.1f%%)", after.RSSKiB, before.RSSKiB, 100*rep.RSSDrift)
	}
	t.Logf("soak: before %+v", summary(before))
	t.Logf("soak: after  %+v", summary(after))
	t.Logf("soak: RSS %d -> %d KiB (%+.1f%%)", before.RSSKiB, after.RSSKiB, 100*rep.RSSDrift)
	for _, l := range rep.Leaks {
		t.Errorf("leak: %s", l)
	}
	if p := os.Getenv("SANDGATE_SOAK_GATEWAY_LOG"); p != "" {
		_ = os.WriteFile(p, []byte(g.stderr.String()), 0o644)
	}
	return rep
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }

func summary(s soakState) string {
	return fmt.Sprintf("rss=%dKiB (anon %d, file %d) heap_inuse=%dKiB fds=%v goroutines=%d mounts=%d loops=%d cgroups=%d files=%d sandboxes=%d (holding %d mounts, %d loops, %d cgroups)",
		s.RSSKiB, s.RSSAnonKiB, s.RSSFileKiB, s.HeapInuse>>10, s.FDs, s.Goroutines, len(s.Mounts), len(s.Loops), len(s.Cgroups), len(s.Files), len(s.Sandboxes),
		s.LiveMounts, s.LiveLoops, s.LiveCgroups)
}

// sandboxNetns is the network namespace ("net:[inode]") of session id's
// init, from its state.json.
func sandboxNetns(g *gatewayProc, id string) string {
	b, err := os.ReadFile(filepath.Join(g.DataDir, "sandboxes", id, "state.json"))
	if err != nil {
		return ""
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if json.Unmarshal(b, &st) != nil || st.Pid <= 0 {
		return ""
	}
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", st.Pid))
	return ns
}

// netnsHeld lists the namespaces of netns (of ended sessions) that are
// still held: by a process of one of those sessions (its cgroup names
// it), by a descriptor of the gateway (pid), or by a mount under the
// data dir. A namespace's inode number is reused once it is freed, so
// the same number held elsewhere (a live warm sandbox, another
// gateway's) is no leak.
func netnsHeld(g *gatewayProc, pid int, netns map[string]string) []string {
	live := map[string]bool{}
	for _, id := range sandboxDirs(g) {
		if ns := sandboxNetns(g, id); ns != "" {
			live[ns] = true
		}
	}
	var held []string
	seen := map[string]bool{}
	note := func(ns, by string) {
		if id, ok := netns[ns]; ok && !seen[ns] && !live[ns] {
			seen[ns] = true
			held = append(held, fmt.Sprintf("%s of session %s (%s)", ns, id, by))
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		ns, err := os.Readlink(p + "/ns/net")
		if err != nil {
			continue
		}
		if id, ok := netns[ns]; ok {
			if cg, _ := os.ReadFile(p + "/cgroup"); strings.Contains(string(cg), id) {
				note(ns, p)
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "net:") {
			note(l, "the gateway's descriptor")
		}
	}
	for _, mi := range []string{"/proc/thread-self/mountinfo", fmt.Sprintf("/proc/%d/mountinfo", pid)} {
		b, _ := os.ReadFile(mi)
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], g.DataDir) {
				for _, m := range regexp.MustCompile(`net:\[\d+\]`).FindAllString(line, -1) {
					note(m, "a mount at "+f[4])
				}
			}
		}
	}
	sort.Strings(held)
	return held
}

// soakWarm is how many warm sandboxes the soak's gateway holds when its
// pools are full: two of the default root and two of the soak's image.
const soakWarm = 4

// settleSoak waits until the gateway holds no session, its warm pools are
// full and its background work is done (or, with want, until it holds no
// more than want, for at most a minute), and returns what it holds.
func settleSoak(t *testing.T, g *gatewayProc, pid int, tmp, metricsAddr string, want *soakState) soakState {
	t.Helper()
	// The gateway gives a burst's memory back (memreturn.go).
	returned := strings.Count(g.stderr.String(), "msg=memory_returned")
	deadline := time.Now().Add(90 * time.Second)
	var s, prev soakState
	var prevAt time.Time
	for {
		s = soakSnapshot(t, g, pid, tmp, metricsAddr)
		var list struct {
			Total int `json:"total"`
		}
		g.api(t, http.MethodGet, "/v1/sessions", nil, &list)
		http.DefaultClient.CloseIdleConnections()
		// Full pools: --warm-pool 2 for the default root, and the soak's
		// image, used within --warm-pool-image-ttl, has a pool of
		// min(--warm-pool, 2) of its own.
		ready := list.Total == 0 && len(s.Sandboxes) == soakWarm && strings.Count(g.stderr.String(), "msg=memory_returned") > returned
		if ready && want != nil {
			ready = s.Goroutines <= want.Goroutines && len(s.Mounts) <= len(want.Mounts) &&
				len(s.Loops) <= len(want.Loops) && len(s.Cgroups) <= len(want.Cgroups) && len(s.Files) <= len(want.Files) &&
				float64(s.RSSKiB) <= 1.10*float64(want.RSSKiB) // the runtime gives freed pages back over time
			for k, n := range s.FDs {
				ready = ready && n <= want.FDs[k]
			}
		}
		if ready || time.Now().After(deadline) {
			break
		}
		if prev.Allocated > 0 {
			t.Logf("settle: %.1f MiB allocated in %v, heap in use %d MiB, rss %d MiB", (s.Allocated-prev.Allocated)/(1<<20),
				time.Since(prevAt).Round(time.Millisecond), s.HeapInuse>>20, s.RSSKiB>>10)
		}
		prev, prevAt = s, time.Now()
		time.Sleep(time.Second)
	}
	if want == nil {
		// The baseline: two more seconds, for a stable count.
		time.Sleep(2 * time.Second)
		s = soakSnapshot(t, g, pid, tmp, metricsAddr)
	}
	return s
}

// soakSnapshot reads what the gateway (pid) holds now.
func soakSnapshot(t *testing.T, g *gatewayProc, pid int, tmp, metricsAddr string) soakState {
	t.Helper()
	s := soakState{FDs: map[string]int{}, Sandboxes: sandboxDirs(g)}
	live := func(p string) bool { // under a live sandbox's directory
		for _, id := range s.Sandboxes {
			if strings.Contains(p, id) {
				return true
			}
		}
		return false
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		if m := regexp.MustCompile(`Threads:\s+(\d+)`).FindSubmatch(b); m != nil {
			s.Threads, _ = strconv.Atoi(string(m[1]))
		}
		for name, v := range map[string]*int64{"VmRSS": &s.RSSKiB, "RssAnon": &s.RSSAnonKiB, "RssFile": &s.RSSFileKiB} {
			if m := regexp.MustCompile(name + `:\s+(\d+)`).FindSubmatch(b); m != nil {
				*v, _ = strconv.ParseInt(string(m[1]), 10, 64)
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		kind := l
		if i := strings.IndexAny(l, ":"); i > 0 && !strings.HasPrefix(l, "/") {
			kind = l[:i]
			if strings.HasPrefix(l, "anon_inode:") {
				kind = l
			}
		} else if live(l) {
			kind = "file in a live sandbox"
		}
		s.FDs[kind]++
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			s.Goroutines, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if f := strings.Fields(sc.Text()); len(f) == 2 && strings.HasPrefix(f[0], "go_memstats_") {
			if s.Runtime == nil {
				s.Runtime = map[string]float64{}
			}
			s.Runtime[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_alloc_bytes_total "); ok {
			s.Allocated, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			s.HeapInuse = int64(f)
		}
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	for _, mi := range []string{"/proc/thread-self/mountinfo", fmt.Sprintf("/proc/%d/mountinfo", pid)} {
		b, _ := os.ReadFile(mi)
		for line := range strings.SplitSeq(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 || !strings.HasPrefix(f[4], g.DataDir) {
				continue
			}
			if live(f[4]) {
				s.LiveMounts++
				continue
			}
			s.Mounts = append(s.Mounts, mi+" "+f[4])
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		b, err := os.ReadFile(l)
		switch {
		case err != nil || !strings.HasPrefix(string(b), g.DataDir):
		case live(string(b)):
			s.LiveLoops++
		default:
			s.Loops = append(s.Loops, strings.TrimSpace(string(b)))
		}
	}
	ids := append(g.sessionIDs(), g.warmReady()...)
	for _, parent := range []string{"/sys/fs/cgroup/*/sandgate/*", "/sys/fs/cgroup/sandgate/*"} {
		dirs, _ := filepath.Glob(parent)
		for _, d := range dirs {
			switch id := filepath.Base(d); {
			case slices.Contains(s.Sandboxes, id):
				s.LiveCgroups++
			case slices.Contains(ids, id):
				s.Cgroups = append(s.Cgroups, d)
			}
		}
	}
	for _, dir := range []string{g.DataDir, tmp} {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && live(p) {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				s.Files = append(s.Files, p)
			}
			return nil
		})
	}
	sort.Strings(s.Files)
	return s
}

// soakProfile saves the gateway's heap profile to $SANDGATE_SOAK_PPROF/name.pb.gz
// when that is set and the binary serves /debug/pprof on its metrics
// address (a build made for profiling: sandgate serves none).
func soakProfile(t *testing.T, metricsAddr, name string) {
	dir := os.Getenv("SANDGATE_SOAK_PPROF")
	if dir == "" {
		return
	}
	resp, err := http.Get("http://" + metricsAddr + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Logf("heap profile: %v", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Logf("heap profile: %d", resp.StatusCode)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name+".pb.gz"), b, 0o644); err != nil {
		t.Log(err)
	}
}
