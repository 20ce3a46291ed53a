package main

import (
	"archive/tar"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
)

// warmImageReady lists the warm sandboxes of image ref that g logged as
// ready, oldest first.
func (g *gatewayProc) warmImageReady(ref string) []string {
	re := regexp.MustCompile(`msg=warm_sandbox_ready sandbox=(\S+) image=` + regexp.QuoteMeta(ref) + `\b`)
	var ids []string
	for _, m := range re.FindAllStringSubmatch(g.stderr.String(), -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// pushToolImage pushes an image of busybox and a file of its own,
// /etc/image-name, to reg as tools/name:1.
func pushToolImage(t *testing.T, reg *imagestest.Registry, name string) string {
	img := imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin", "IMAGE_VAR=" + name}, WorkingDir: "/workspace"},
		imagestest.BusyboxLayer(t),
		imagestest.TarLayer(t, imagestest.Entry{Name: "etc/", Type: tar.TypeDir},
			imagestest.Entry{Name: "etc/image-name", Body: name + "\n"}))
	return reg.Push(t, "tools/"+name+":1", img)
}

// TestWarmPoolImageClaimIsACreate: the first create of an image (from a
// registry on loopback) starts a pool of that image; the next create of
// it claims one of its sandboxes, and that session cannot be told from
// one a cold create of the image (--warm-pool 0, same flags) makes: its
// hostname and /etc, processes, environment, files, limits, mounts and
// cgroup limits (asked for at create). The files the build wrote over
// the image get the claim's time, the image's own keep the image's. The
// pool refills, its sandboxes hold the image (`image rm` is refused), and
// a stop leaves nothing behind.
func TestWarmPoolImageClaimIsACreate(t *testing.T) {
	requireLinuxDriver(t)
	reg := imagestest.NewRegistry(t)
	ref := pushToolImage(t, reg, "alpha")
	common := []string{"--sandbox", "linux", "--image-allow", reg.Host + "/tools/*"}
	warmG := startGateway(t, append([]string{"--warm-pool", "2", "--log-level", "debug", "--metrics-token", "m"}, common...)...)
	coldG := startGateway(t, append([]string{"--warm-pool", "0"}, common...)...)
	waitFor(t, time.Minute, "the default pool", func() bool { return len(warmG.warmReady()) >= 2 })

	body := map[string]any{"image": ref, "ttl": 600, "labels": map[string]any{"k": "v"},
		"resources": map[string]any{"memoryMiB": 200, "pids": 100, "cpus": 0.5}}
	create := func(g *gatewayProc) imageSessionJSON {
		t.Helper()
		var s imageSessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
			t.Fatalf("create on %s: %d", ref, code)
		}
		return s
	}
	first := create(warmG) // pulls the image, starts its pool
	if slices.Contains(warmG.warmReady(), first.SessionID) {
		t.Fatalf("the first create of %s claimed a warm sandbox", ref)
	}
	waitFor(t, time.Minute, "the image's pool of 2", func() bool { return len(warmG.warmImageReady(ref)) >= 2 })
	pooled := warmG.warmImageReady(ref)
	// A file written at the pool's fill is older than the claim by more
	// than two of the stat's seconds; one the claim touched is at most
	// one second older than the test's clock (file times are the kernel's
	// coarse clock, a tick behind).
	time.Sleep(2500 * time.Millisecond)
	claimAt := time.Now().Unix()
	start := time.Now()
	ws := create(warmG)
	warmTook := time.Since(start)
	create(coldG) // the pull
	start = time.Now()
	cs := create(coldG)
	t.Logf("create of %s: %v claiming a warm sandbox, %v cold (for information: nothing is asserted of times)", ref, warmTook, time.Since(start))
	if !slices.Contains(pooled, ws.SessionID) {
		t.Fatalf("session %s on %s did not claim a warm sandbox of %v", ws.SessionID, ref, pooled)
	}
	if !regexp.MustCompile(`session_created session=` + ws.SessionID + ` .*warm=true`).MatchString(warmG.stderr.String()) {
		t.Errorf("the gateway did not log the claim as warm")
	}
	if ws.Image != ref || ws.ImageDigest == "" || ws.ImageDigest != cs.ImageDigest {
		t.Errorf("warm session's image %q %q, cold %q %q", ws.Image, ws.ImageDigest, cs.Image, cs.ImageDigest)
	}
	wp, cp := probeSandbox(t, warmG, ws.SessionID), probeSandbox(t, coldG, cs.SessionID)
	if wp != cp {
		t.Errorf("a warm session of an image differs from a cold one:\n--- warm\n%s\n--- cold\n%s", wp, cp)
	}
	if !strings.Contains(wp, "hostname=SHORT") {
		t.Errorf("the warm session's hostname is not its own id's:\n%s", wp)
	}
	const own = "cat /etc/image-name; echo $IMAGE_VAR; id -un; pwd"
	for _, x := range []struct {
		g  *gatewayProc
		id string
	}{{warmG, ws.SessionID}, {coldG, cs.SessionID}} {
		if a := runREST(t, x.g, x.id, map[string]any{"command": own}); a.out() != "alpha\nalpha\nsandbox\n/workspace\n" {
			t.Errorf("image session %s: %q", x.id, a.out())
		}
	}
	if wl, cl := cgroupLimits(ws.SessionID), cgroupLimits(cs.SessionID); wl != cl || !strings.Contains(wl, fmt.Sprint(200<<20)) {
		t.Errorf("cgroup limits of a warm image session differ from a cold one's:\n--- warm\n%s--- cold\n%s", wl, cl)
	}
	// Times: what the build wrote (/, /etc and its files the build
	// adds) shows the claim; the image's own file the image's time.
	mtimes := func(g *gatewayProc, id string) []int64 {
		out := runREST(t, g, id, map[string]any{"command": "stat -c %Y / /etc /etc/passwd /etc/hostname /etc/hosts /etc/image-name"}).out()
		var ts []int64
		for _, f := range strings.Fields(out) {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("stat in %s: %q", id, out)
			}
			ts = append(ts, n)
		}
		if len(ts) != 6 {
			t.Fatalf("stat in %s: %q", id, out)
		}
		return ts
	}
	wt, ct := mtimes(warmG, ws.SessionID), mtimes(coldG, cs.SessionID)
	for i, n := range wt[:5] {
		if n < claimAt-1 {
			t.Errorf("file %d the build wrote in the warm session %s has mtime %d, before the claim at %d: %v (pool %v)", i, ws.SessionID, n, claimAt, wt, pooled)
		}
	}
	if wt[5] != ct[5] || wt[5] >= claimAt-2 {
		t.Errorf("the image's own /etc/image-name: warm mtime %d, cold %d (claim at %d): the claim touched the image", wt[5], ct[5], claimAt)
	}

	// The pool refills; its sandboxes hold the image.
	waitFor(t, time.Minute, "the image's pool refilled", func() bool {
		ready := warmG.warmImageReady(ref)
		return len(ready) == 3 && !slices.Contains(warmG.sessionIDs(), ready[2])
	})
	if _, stderr, code := runImage(t, warmG.DataDir, "rm", ref); code == 0 {
		t.Errorf("image rm while sessions and a pool hold it: exit 0, %s", stderr)
	}
	// The pools' sizes by image.
	waitFor(t, time.Minute, "the warm sandboxes by image in /metrics", func() bool {
		_, _, body := scrapeMetrics(t, warmG.URL+"/metrics", "m")
		return strings.Contains(body, "\n"+`sandgate_warm_sandboxes{image="default"} 2`+"\n") &&
			strings.Contains(body, "\n"+`sandgate_warm_sandboxes{image="`+ref+`"} 2`+"\n")
	})
	warmG.stop(t)
	for _, id := range warmG.warmImageReady(ref) {
		if slices.Contains(warmG.sessionIDs(), id) {
			continue
		}
		if l := cgroupLimits(id); l != "" {
			t.Errorf("cgroups of warm sandbox %s left behind:\n%s", id, l)
		}
	}
	if dirs := sandboxDirs(warmG); len(dirs) != 0 {
		t.Errorf("sandboxes left after stop: %v", dirs)
	}
	if _, stderr, code := runImage(t, warmG.DataDir, "rm", ref); code != 0 {
		t.Errorf("image rm after stop (no session, no pool): exit %d: %s", code, stderr)
	}
}

// TestWarmPoolImageBounds: an image's pool drains once no create used it
// for --warm-pool-image-ttl (its sandboxes go, with their holds of the
// image: `image rm` works again); with --warm-pool-memory below what one
// more sandbox takes, no image gets a warm sandbox while the default
// pool stays full; and a new image past --warm-pool-images drains the
// least recently used image's pool.
func TestWarmPoolImageBounds(t *testing.T) {
	requireLinuxDriver(t)
	reg := imagestest.NewRegistry(t)
	refA, refB := pushToolImage(t, reg, "alpha"), pushToolImage(t, reg, "beta")
	common := []string{"--sandbox", "linux", "--image-allow", reg.Host + "/tools/*", "--log-level", "debug"}

	t.Run("ttl and count", func(t *testing.T) {
		g := startGateway(t, append([]string{"--warm-pool", "1", "--warm-pool-image-ttl", "4s", "--warm-pool-images", "1"}, common...)...)
		var a imageSessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": refA}, &a); code != http.StatusCreated {
			t.Fatalf("create on %s: %d", refA, code)
		}
		waitFor(t, time.Minute, "a warm sandbox of A", func() bool { return len(g.warmImageReady(refA)) == 1 })
		warmA := g.warmImageReady(refA)[0]
		// B takes the only image pool: A's drains.
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": refB}, nil); code != http.StatusCreated {
			t.Fatalf("create on %s: %d", refB, code)
		}
		waitFor(t, time.Minute, "A's pool drained for B's", func() bool {
			return !slices.Contains(sandboxDirs(g), warmA) && len(g.warmImageReady(refB)) == 1
		})
		warmB := g.warmImageReady(refB)[0]
		if g.api(t, http.MethodDelete, "/v1/sessions/"+a.SessionID, nil, nil) != http.StatusNoContent {
			t.Fatal("delete")
		}
		waitFor(t, time.Minute, "A let go", func() bool {
			_, _, code := runImage(t, g.DataDir, "rm", refA)
			return code == 0
		})
		// B unused past the TTL: its pool drains.
		waitFor(t, time.Minute, "B's pool drained", func() bool {
			return !slices.Contains(sandboxDirs(g), warmB) && strings.Contains(g.stderr.String(), "msg=warm_pool_expired image="+refB)
		})
		if l := cgroupLimits(warmB); l != "" {
			t.Errorf("cgroups of drained warm sandbox %s left behind:\n%s", warmB, l)
		}
		if len(g.warmReady()) < 1 {
			t.Errorf("the default pool is empty")
		}
	})

	t.Run("memory", func(t *testing.T) {
		g := startGateway(t, append([]string{"--warm-pool", "2", "--warm-pool-memory", "1MiB"}, common...)...)
		waitFor(t, time.Minute, "the default pool", func() bool { return len(g.warmReady()) >= 2 })
		var a imageSessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": refA}, &a); code != http.StatusCreated {
			t.Fatalf("create on %s: %d", refA, code)
		}
		waitFor(t, time.Minute, "the image's pool to start", func() bool {
			return strings.Contains(g.stderr.String(), "msg=warm_pool_started image="+refA)
		})
		time.Sleep(3 * time.Second) // three of the pools' tend rounds
		if ready := g.warmImageReady(refA); len(ready) != 0 {
			t.Errorf("warm sandboxes of %s past a memory bound of 1 MiB: %v", refA, ready)
		}
		if dirs := sandboxDirs(g); len(dirs) != 3 {
			t.Errorf("sandboxes on disk: %v, want the default pool's 2 and the session's", dirs)
		}
	})
}
