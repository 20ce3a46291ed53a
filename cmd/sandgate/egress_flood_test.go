package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// floodScript opens n CONNECT tunnels through the session's egress proxy
// to hole.test:port, reads each answer's status, prints
// "<200s> <503s> <others>" and holds the tunnels until it is killed.
const floodScript = `
import os, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
proxy = os.environ["HTTPS_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
proxy = (proxy[0], int(proxy[1]))
socks, counts, why = [], {b"200": 0, b"503": 0, b"other": 0}, []
for i in range(n):
    try:
        s = socket.create_connection(proxy, timeout=60)
        s.sendall(b"CONNECT hole.test:%d HTTP/1.1\r\nHost: hole.test:%d\r\n\r\n" % (port, port))
        socks.append(s)
    except OSError as e:
        counts[b"other"] += 1
        why.append(repr(e))
for s in socks:
    try:
        answer = s.recv(400)
        code = answer.split(b" ")[1]
    except Exception as e:
        code = b"other"
        why.append(repr(e))
    if code not in counts:
        why.append(repr(answer))
        code = b"other"
    counts[code] += 1
print(counts[b"200"], counts[b"503"], counts[b"other"], flush=True)
for w in why[:3]:
    print(w, flush=True)
time.sleep(600)
`

// gatewayFDs counts the gateway process's descriptors, and its pipes.
func gatewayFDs(t *testing.T, pid int) (all, pipes int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("gateway descriptors: %v", err)
	}
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
			pipes++
		}
	}
	return len(ents), pipes
}

// TestLinuxEgressFloodOneTenant is the load test of issue 34 item 1,
// against the built binary on the linux driver: 24 sessions of one
// tenant each open 256 CONNECT tunnels to a loopback listener that never
// accepts. The gateway keeps its descriptors under 4,000, another
// tenant's create, list and /healthz are answered meanwhile, and
// deleting the sessions gives every descriptor back at once.
// The refusals past the tenant's bound come at its pace
// (--egress-refusals-per-tenant, 256 a second), so the flood lasts about
// 25 s. Set SANDGATE_FLOOD_SESSIONS and SANDGATE_FLOOD_CONNS to change the
// 24 and the 256, SANDGATE_FLOOD_REFUSALS to set the pace, and
// SANDGATE_FLOOD_CREATE_BOUND a bound to assert on the other tenant's
// creates (on the p90, and 3 times it on the first, at the burst's
// start; by default they are only logged).
func TestLinuxEgressFloodOneTenant(t *testing.T) {
	driver := "linux"
	if os.Getenv("SANDGATE_FLOOD_DRIVER") == "workdir" {
		// The same flood from host processes: tells the gateway's own
		// latency apart from a linux sandbox's start.
		driver = "workdir"
	} else {
		requireLinuxDriver(t)
	}
	sessions, perSession := 24, 256
	if v, err := strconv.Atoi(os.Getenv("SANDGATE_FLOOD_SESSIONS")); err == nil && v > 0 {
		sessions = v
	}
	if v, err := strconv.Atoi(os.Getenv("SANDGATE_FLOOD_CONNS")); err == nil && v >= 0 {
		perSession = v // 0: the same processes, no tunnels (to tell their cost apart)
	}
	hole, err := net.Listen("tcp", "127.0.0.1:0") // never accepts
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	_, holePort, _ := net.SplitHostPort(hole.Addr().String())
	const otherToken = "other-token"
	// No request rate limit: the test polls each flooding session's
	// output while its refusals are paced (--egress-refusals-per-tenant).
	args := []string{"--sandbox", driver, "--api-key", "flood:test-token", "--api-key", "other:" + otherToken,
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", "hole.test=127.0.0.1", "--rate-limit", "0",
		"--server-timing"} // slow creates are logged with their steps
	if v := os.Getenv("SANDGATE_FLOOD_REFUSALS"); v != "" {
		args = append(args, "--egress-refusals-per-tenant", v) // a huge value: the refusals unpaced
	}
	g := startGateway(t, args...)
	testStart := time.Now()
	pid := g.cmd.Process.Pid
	other := func(method, path string, body any, out any) (int, time.Duration) {
		start := time.Now()
		code := gwtest.DoJSON(t, g.URL, otherToken, method, path, body, out)
		return code, time.Since(start)
	}
	var otherSessions []string
	// slowCreates keeps the Server-Timing of each create over 100 ms:
	// the steps it spent its time in.
	var slowCreates []string
	createOther := func() time.Duration {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+otherToken)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		var s sessionJSON
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("the other tenant's create: %d %s", resp.StatusCode, data)
		}
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatalf("the other tenant's create: %q: %v", data, err)
		}
		if d > 100*time.Millisecond || len(otherSessions) == 0 {
			slowCreates = append(slowCreates, fmt.Sprintf("%v at +%v: %s", d.Round(time.Millisecond), time.Since(testStart).Round(time.Millisecond), resp.Header.Get("Server-Timing")))
		}
		otherSessions = append(otherSessions, s.SessionID)
		// On a quiet machine the flood outlasts 100 creates: each one
		// ends, or the tenant's session limit would refuse the next.
		if code, _ := other(http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
			t.Errorf("delete the other tenant's session: %d", code)
		}
		return d
	}
	idle := createOther()

	ids := make([]string, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			var s sessionJSON
			if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"hole.test:" + holePort}}, &s); code != http.StatusCreated {
				t.Errorf("create: %d", code)
				return
			}
			ids[i] = s.SessionID
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	baseFDs, basePipes := gatewayFDs(t, pid)

	// The flood: every session opens its tunnels at once.
	cpuBefore := processCPU(t, pid)
	var (
		mu     sync.Mutex
		counts [3]int
	)
	start := time.Now()
	for _, id := range ids {
		wg.Go(func() {
			c := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
			p := c.start(t, map[string]any{"command": "exec /usr/bin/python3 -c '" + floodScript + "' " + holePort + " " + strconv.Itoa(perSession)})
			deadline := time.Now().Add(3 * time.Minute)
			for time.Now().Before(deadline) {
				lines, cancel := c.output(t, p.ProcessID, 0, false)
				var out string
				for l := range lines {
					out += l.Stdout
				}
				cancel()
				first, rest, _ := strings.Cut(out, "\n")
				if rest != "" {
					t.Logf("session %s: %s", id, strings.TrimSpace(rest))
				}
				if f := strings.Fields(first); len(f) == 3 && strings.HasSuffix(out, "\n") {
					mu.Lock()
					for i := range f {
						n, _ := strconv.Atoi(f[i])
						counts[i] += n
					}
					mu.Unlock()
					return
				}
				time.Sleep(time.Second)
			}
			t.Errorf("session %s: the flood script never reported", id)
		})
	}
	// Meanwhile, the other tenant is served.
	var during []time.Duration
	var slowList, slowHealth time.Duration
	var maxFDs, maxPipes int
	// One waiter: a new one each round would leave earlier ones waiting,
	// their Wait unordered with the WaitGroup's later reuse (a race).
	flood := make(chan struct{})
	go func() { wg.Wait(); close(flood) }()
	for done := false; !done; {
		select {
		case <-flood:
			done = true
		case <-time.After(200 * time.Millisecond):
		}
		code, d := other(http.MethodGet, "/v1/sessions", nil, nil)
		if code != http.StatusOK {
			t.Errorf("the other tenant's list: %d after %v", code, d)
		}
		slowList = max(slowList, d)
		code, d = other(http.MethodGet, "/healthz", nil, nil)
		if code != http.StatusOK {
			t.Errorf("/healthz: %d after %v", code, d)
		}
		slowHealth = max(slowHealth, d)
		during = append(during, createOther())
		fds, pipes := gatewayFDs(t, pid)
		maxFDs, maxPipes = max(maxFDs, fds), max(maxPipes, pipes)
	}
	flooded := time.Since(start)
	cpu := processCPU(t, pid) - cpuBefore
	held := createOther()
	fds, pipes := gatewayFDs(t, pid)
	maxFDs, maxPipes = max(maxFDs, fds), max(maxPipes, pipes)
	var slowest time.Duration
	for _, d := range during {
		slowest = max(slowest, d)
	}
	sorted := slices.Clone(during)
	slices.Sort(sorted)
	var p50, p90 time.Duration
	if len(sorted) > 0 {
		p50, p90 = sorted[len(sorted)/2], sorted[len(sorted)*9/10]
	}
	t.Logf("%d sessions x %d CONNECTs: %d tunnels held, %d refused (503), %d other, in %v; the gateway's CPU meanwhile %v", sessions, perSession, counts[0], counts[1], counts[2], flooded.Round(time.Millisecond), cpu)
	t.Logf("gateway descriptors: %d before the flood (%d pipes), at most %d during it (%d pipes), %d while the tunnels are held", baseFDs, basePipes, maxFDs, maxPipes, fds)
	t.Logf("during the flood the slowest list took %v, the slowest /healthz %v", slowList.Round(time.Millisecond), slowHealth.Round(time.Millisecond))
	t.Logf("the other tenant's create: %v idle, during the flood p50 %v, p90 %v and slowest %v of %d (all: %v), with the tunnels held %v", idle.Round(time.Millisecond), p50.Round(time.Millisecond), p90.Round(time.Millisecond), slowest.Round(time.Millisecond), len(during), during, held.Round(time.Millisecond))
	for _, s := range slowCreates {
		t.Logf("create (the idle one, and each over 100ms): %s", s)
	}
	// A new sandbox's init starts with a larger CPU weight than running
	// sandboxes (cgroup.Plan.Started, checked by TestLinuxRebind), so the
	// flooding sessions' processes do not hold it back: the create at the
	// burst's start, when 24 interpreters start and the gateway answers
	// their 6,144 CONNECTs at once, took 280-830 ms before and 35-235 ms
	// since, the p90 about 50 ms, on a shared 2-core machine. Times are
	// logged, not asserted (a loaded CI machine is not a benchmark):
	// SANDGATE_FLOOD_CREATE_BOUND (a duration, say 100ms) asserts the p90
	// under it and the burst's first create under 3 times it.
	var bound time.Duration
	if v := os.Getenv("SANDGATE_FLOOD_CREATE_BOUND"); v != "" {
		if bound, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SANDGATE_FLOOD_CREATE_BOUND: %v", err)
		}
	}
	if bound > 0 && len(during) > 0 && (during[0] > 3*bound || p90 > bound) {
		t.Errorf("the other tenant's create during the flood: %v at its start, p90 %v; want under %v and %v (SANDGATE_FLOOD_CREATE_BOUND changes the bound on a busy machine)", during[0].Round(time.Millisecond), p90.Round(time.Millisecond), 3*bound, bound)
	}
	if maxFDs >= 4000 {
		t.Errorf("the gateway held %d descriptors; want under 4000", maxFDs)
	}
	if perSession > 0 && counts[0] == 0 || counts[0]+counts[1]+counts[2] != sessions*perSession || counts[2] != 0 {
		t.Errorf("tunnels %d held, %d refused, %d other: want every CONNECT answered 200 or 503", counts[0], counts[1], counts[2])
	}

	// Deleting the sessions gives their descriptors back at once.
	for _, id := range ids {
		wg.Go(func() {
			if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
				t.Errorf("delete %s: %d", id, code)
			}
		})
	}
	wg.Wait()
	after, afterPipes := gatewayFDs(t, pid)
	t.Logf("after the deletes: %d descriptors, %d pipes", after, afterPipes)
	// The sessions' own descriptors (their listeners, control
	// connections) went too (the other tenant's sessions ended as they
	// were made); allow a little for descriptors the runtime keeps.
	if after > baseFDs+32 || afterPipes > basePipes+16 {
		t.Errorf("after the deletes the gateway holds %d descriptors (%d pipes); before the flood %d (%d pipes)", after, afterPipes, baseFDs, basePipes)
	}
}

// processCPU is the user and system CPU time process pid used so far.
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 14th and 15th of the line, in clock ticks (100/s).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return time.Duration(u+st) * 10 * time.Millisecond
}
