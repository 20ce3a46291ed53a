//go:build linux

package linuxns_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
)

// TestCreateToFirstExecLatency measures session create -> first command
// done, 50 times per driver, through the whole stack (REST create, CONNECT
// tunnel, SSH handshake, exec `true`) and at the driver alone (Create,
// Start `true`, Wait). It only runs when SANDGATE_MEASURE=1:
//
//	SANDGATE_MEASURE=1 go test -count=1 -run TestCreateToFirstExecLatency -v ./sandbox/linuxns/
func TestCreateToFirstExecLatency(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	const n = 50
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinux(t)
			}
			s := gwtest.Start(t, gwtest.Options{Driver: driver})
			var stack []time.Duration
			for range n {
				start := time.Now()
				id := s.CreateSession(t, nil).SessionID
				c := s.SSH(t, id)
				if r := gwtest.Exec(t, c, "true"); r.Code != 0 {
					t.Fatalf("exec: %+v", r)
				}
				stack = append(stack, time.Since(start))
				c.Close()
				if code := s.Do(t, s.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
					t.Fatalf("delete: %d\n%s", code, s.Log.String())
				}
			}
			d, err := openDriver(driver, sandbox.Config{DataDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			var direct []time.Duration
			for i := range n {
				start := time.Now()
				sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-latency-" + strconv.Itoa(i)})
				if err != nil {
					t.Fatal(err)
				}
				if _, _, e := runIn(t, sb, "true"); e.Code != 0 {
					t.Fatalf("true: %+v", e)
				}
				direct = append(direct, time.Since(start))
				if err := sb.Destroy(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: create -> first exec done, median of %d: full stack %v (p90 %v), driver only %v (p90 %v)",
				driver, n, quantile(stack, 0.5), quantile(stack, 0.9), quantile(direct, 0.5), quantile(direct, 0.9))
		})
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)].Round(10 * time.Microsecond)
}

// TestExecLatency measures Start `true` → Wait on a running sandbox, 300
// times per driver: the driver's share of an exec on an open connection.
// It only runs when SANDGATE_MEASURE=1.
func TestExecLatency(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	const n = 300
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinux(t)
			}
			d, err := openDriver(driver, sandbox.Config{DataDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-exec-latency"})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			var started, done []time.Duration
			for range n {
				begin := time.Now()
				p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "true"})
				if err != nil {
					t.Fatal(err)
				}
				started = append(started, time.Since(begin))
				p.Stdin().Close()
				if e, err := p.Wait(); err != nil || e.Code != 0 {
					t.Fatalf("true: %+v %v", e, err)
				}
				done = append(done, time.Since(begin))
				p.Stdout().Close()
				p.Stderr().Close()
			}
			t.Logf("%s: exec `true` on a running sandbox, %d runs: started p50 %v, done p50 %v p99 %v",
				driver, n, quantile(started, 0.5), quantile(done, 0.5), quantile(done, 0.99))
		})
	}
}
