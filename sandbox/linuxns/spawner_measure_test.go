//go:build linux

package linuxns_test

import (
	"context"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// TestSpawnServerOverhead measures Create through the spawn server
// against the gateway forking its inits itself, interleaved, 30 each, with
// BALLAST MiB of heap in this process standing in for a gateway's: a clone
// into a new user namespace forks the whole caller. It only runs when
// SANDGATE_MEASURE=1:
//
//	SANDGATE_MEASURE=1 BALLAST=100 go test -count=1 -run TestSpawnServerOverhead -v ./sandbox/linuxns/
func TestSpawnServerOverhead(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	ballast := make([][]byte, 0)
	for range ballastMiB() {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = 1
		}
		ballast = append(ballast, b)
	}
	small := smallInit(t)
	on, err := linuxns.NewWithInit(sandbox.Config{DataDir: t.TempDir()}, small)
	if err != nil {
		t.Fatal(err)
	}
	off, err := linuxns.NewWithInit(sandbox.Config{DataDir: t.TempDir()}, small)
	if err != nil {
		t.Fatal(err)
	}
	off.NoSpawner()
	res := map[string][]time.Duration{}
	steps := map[string]map[string][]time.Duration{}
	for i := range 30 {
		for name, d := range map[string]*linuxns.Driver{"server": on, "fork": off} {
			tr := sandbox.NewTrace()
			ctx := sandbox.WithTrace(context.Background(), tr)
			t0 := time.Now()
			sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-m-" + name + strconv.Itoa(i)})
			if err != nil {
				t.Fatal(err)
			}
			res[name] = append(res[name], time.Since(t0))
			if steps[name] == nil {
				steps[name] = map[string][]time.Duration{}
			}
			st, _ := tr.Steps()
			for _, s := range st {
				steps[name][s.Name] = append(steps[name][s.Name], s.Dur)
			}
			_ = sb.Destroy(context.Background())
		}
	}
	_ = len(ballast)
	for name, r := range res {
		sort.Slice(r, func(i, j int) bool { return r[i] < r[j] })
		t.Logf("%s create p50 %v", name, r[len(r)/2])
		for _, k := range []string{"init_exec_bg", "init_fork", "init.exec_to_main", "init_handshake"} {
			v := steps[name][k]
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			if len(v) > 0 {
				t.Logf("  %s %s p50 %v", name, k, v[len(v)/2])
			}
		}
	}
}

// ballastMiB is $BALLAST.
func ballastMiB() int {
	n, _ := strconv.Atoi(os.Getenv("BALLAST"))
	return n
}
