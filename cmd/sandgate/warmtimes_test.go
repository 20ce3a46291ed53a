package main

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// timesScript prints "path mtime ctime" (whole seconds) for what the
// sandbox's build writes: its root, /etc and /dev (their own files, not the
// host's bound in: -xdev, and stat of each path's own filesystem), /tmp,
// /dev/shm, /dev/pts and the home directory, and the files that name the
// sandbox in /etc (bound over the gateway's /etc template, from the root's
// filesystem).
const timesScript = `{ for d in / /etc /dev /dev/shm /dev/pts /tmp /workspace; do
  dev=$(stat -c %d "$d")
  find "$d" -xdev -exec stat -c '%d %n %Y %Z' {} + 2>/dev/null | while read -r dd n m c; do
    [ "$dd" = "$dev" ] && echo "$n $m $c"
  done
done; stat -c '%n %Y %Z' ` + etcOwn + `; } | sort -u`

// etcOwn are the files of a default root's /etc that are the sandbox's
// own: the rest is the gateway's template, built when the gateway started
// (or the host's /etc last changed), the same in every sandbox.
const etcOwn = "/etc/hostname /etc/hosts /etc/machine-id /etc/resolv.conf"

// fileTimes runs timesScript in session id of g: path -> [mtime, ctime].
func fileTimes(t *testing.T, g *gatewayProc, id string) map[string][2]int64 {
	t.Helper()
	a := runREST(t, g, id, map[string]any{"command": timesScript})
	if a.code() != 0 {
		t.Fatalf("times in %s: exit %d: %s", id, a.code(), a.out())
	}
	m := map[string][2]int64{}
	for line := range strings.Lines(a.out()) {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("times in %s: line %q", id, line)
		}
		mt, err1 := strconv.ParseInt(f[1], 10, 64)
		ct, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("times in %s: line %q", id, line)
		}
		m[f[0]] = [2]int64{mt, ct}
	}
	return m
}

// TestWarmPoolClaimTimes: the files a sandbox's build writes (its /etc,
// the home directory, /tmp...) show the time of the create that claimed
// it, as a cold create's do, not the time the pool filled: a process in
// the session cannot tell from them that its sandbox was built ahead.
func TestWarmPoolClaimTimes(t *testing.T) {
	requireLinuxDriver(t)
	warmG := startGateway(t, "--sandbox", "linux", "--warm-pool", "1", "--log-level", "debug")
	coldG := startGateway(t, "--sandbox", "linux", "--warm-pool", "0")
	waitFor(t, time.Minute, "a warm sandbox", func() bool { return len(warmG.warmReady()) >= 1 })
	// Older than the slack below, so that a time of the fill shows.
	time.Sleep(2500 * time.Millisecond)

	asked := time.Now().Add(-time.Second).Unix() // 1 s slack (whole seconds)
	create := func(g *gatewayProc) string {
		var s sessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s); code != http.StatusCreated {
			t.Fatalf("create: %d", code)
		}
		return s.SessionID
	}
	wid, cid := create(warmG), create(coldG)
	if !slices.Contains(warmG.warmReady(), wid) {
		t.Fatalf("session %s did not claim a warm sandbox", wid)
	}
	wt, ct := fileTimes(t, warmG, wid), fileTimes(t, coldG, cid)
	for _, p := range []string{"/", "/etc", "/etc/hostname", "/etc/hosts", "/etc/passwd", "/etc/group",
		"/etc/machine-id", "/etc/resolv.conf", "/tmp", "/dev", "/dev/shm", "/workspace"} {
		if _, ok := wt[p]; !ok {
			t.Errorf("no time of %s in the warm session: %v", p, wt)
		}
	}
	fresh := func(v [2]int64) bool { return v[0] >= asked && v[1] >= asked }
	for p, v := range wt {
		if !fresh(v) && (fresh(ct[p]) || slices.Contains(strings.Fields(etcOwn), p) || p == "/workspace") {
			t.Errorf("%s in the warm session: mtime %d ctime %d, before the create (%d); cold: %v", p, v[0], v[1], asked, ct[p])
		}
	}
	// What the claim cannot change (docs/architecture.md, "What a warm
	// sandbox still shows"), logged: pid 1's start (boot-relative ticks
	// and seconds since), files' birth times, the host's uptime.
	const rest = `echo "pid1_start=$(cut -d' ' -f22 /proc/1/stat) pid1_age=$(ps -o etimes= -p 1 | tr -d ' ')" \
"hostname_btime=$(stat -c %W /etc/hostname) uptime=$(cut -d' ' -f1 /proc/uptime) now=$(date +%s)"`
	t.Logf("warm: %s", runREST(t, warmG, wid, map[string]any{"command": rest}).out())
	t.Logf("cold: %s", runREST(t, coldG, cid, map[string]any{"command": rest}).out())
	for p, v := range ct {
		if _, ok := wt[p]; !ok && !strings.Contains(p, wid) && !strings.Contains(p, cid) {
			t.Errorf("%s (times %v) in the cold session only", p, v)
		}
	}
}
