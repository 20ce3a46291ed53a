//go:build linux

package linuxns_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// blobServer is a Python process holding 100 MiB written byte by byte
// (every page present, as bench row 15d's kernel), that answers GET with
// the blob's SHA-256: a restore that lost or moved a page answers another.
const blobServer = `nohup python3 -c '
import hashlib, http.server
blob = bytearray(range(256)) * (400 << 10)
h = hashlib.sha256(blob).hexdigest().encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(hashlib.sha256(blob).hexdigest().encode() + b" " + h)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8002), H).serve_forever()
' >/dev/null 2>&1 &
for i in $(seq 200); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8002")' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`

// TestForkX4Measure logs the steps of rounds of a fork ×4 (one checkpoint,
// 4 restores at once) of a sandbox whose Python process holds 100 MiB
// (bench row 15d's shape, without the gateway): the checkpoint's line
// (sandbox_checkpointed), each restore's (sandbox_restored, restored_cpu_ms
// the CPU its tasks took while CRIU restored them), and each round's wall
// time. Each fork's blob must hash as the source's. It only runs when
// SANDGATE_MEASURE=1 (SANDGATE_CRIU picks the criu, SANDGATE_MEASURE_ROUNDS
// the rounds, SANDGATE_MEASURE_PAR how many restores run at once, for A/Bs):
//
//	SANDGATE_MEASURE=1 go test -count=1 -run TestForkX4Measure -v ./sandbox/linuxns/
func TestForkX4Measure(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	requireLinux(t)
	var logs lockedBuffer
	d, err := linuxns.NewWithInit(sandbox.Config{DataDir: t.TempDir(), Checkpoint: true, CRIU: criuForTest(t),
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, smallInit(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := d.Create(ctx, sandbox.Spec{ID: "sbx-fmeasure-src", Limits: sandbox.Limits{MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(ctx)
	mustRun(t, src, blobServer)
	get := `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8002").read().decode())'`
	want := strings.TrimSpace(mustRun(t, src, get))
	if f := strings.Fields(want); len(f) != 2 || f[0] != f[1] {
		t.Fatalf("source's blob: %q", want)
	}
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("SANDGATE_MEASURE_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	// SANDGATE_MEASURE_PAR: how many restores run at once (default 4).
	sem := make(chan struct{}, 4)
	if n, err := strconv.Atoi(os.Getenv("SANDGATE_MEASURE_PAR")); err == nil && n > 0 && n < 4 {
		sem = make(chan struct{}, n)
	}
	for r := range rounds {
		t0 := time.Now()
		ck, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tck := time.Since(t0)
		forks := make([]sandbox.Sandbox, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range forks {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				forks[i], errs[i] = ck.Restore(ctx, sandbox.Spec{ID: "sbx-fmeasure-" + strconv.Itoa(r) + "-" + strconv.Itoa(i), Limits: sandbox.Limits{MemoryBytes: 1 << 30}})
			})
		}
		wg.Wait()
		total := time.Since(t0)
		ck.Close()
		for i, f := range forks {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if got := strings.TrimSpace(mustRun(t, f, get)); got != want {
				t.Errorf("fork %d's blob: %q, want %q", i, got, want)
			}
			if r == 0 && i == 0 {
				t.Logf("fork's python: %s", mustRun(t, f, `grep -h AnonHugePages /proc/$(pgrep -f -o http.server)/smaps_rollup; grep -c ' nh' /proc/$(pgrep -f -o http.server)/smaps || true`))
			}
			_ = f.Destroy(ctx)
		}
		t.Logf("round %d: checkpoint %v, fork x4 %v", r, tck.Round(time.Millisecond), total.Round(time.Millisecond))
	}
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, "sandbox_restored") || strings.Contains(line, "sandbox_checkpointed") || strings.Contains(line, "lazy_pages") {
			t.Log(line[strings.Index(line, "msg="):])
		}
	}
}
