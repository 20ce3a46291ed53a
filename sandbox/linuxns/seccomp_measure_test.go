//go:build linux

package linuxns_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// TestSeccompOverhead measures what the seccomp filter costs: create ->
// first command (`true`) done at the driver, 50 times with the filter and
// 50 without, interleaved; then 1000 fork+exec of /bin/true in one shell
// (clone is the one call the filter judges by its arguments on every
// fork). It only runs when SANDGATE_MEASURE=1:
//
//	SANDGATE_MEASURE=1 go test -count=1 -run TestSeccompOverhead -v ./sandbox/linuxns/
func TestSeccompOverhead(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	const n = 50
	on := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	off := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	off.DisableSeccomp()
	drivers := []struct {
		name string
		d    *linuxns.Driver
	}{{"filter", on}, {"no filter", off}}
	times := map[string][]time.Duration{}
	for i := range n {
		for _, d := range drivers {
			start := time.Now()
			sb, err := d.d.Create(context.Background(), sandbox.Spec{ID: "sbx-seccomp-" + strconv.Itoa(i)})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, e := runIn(t, sb, "true"); e.Code != 0 {
				t.Fatalf("true: %+v", e)
			}
			times[d.name] = append(times[d.name], time.Since(start))
			if err := sb.Destroy(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range drivers {
		t.Logf("%s: create -> first command done, %d runs: p50 %v, p90 %v", d.name, n,
			quantile(times[d.name], 0.5), quantile(times[d.name], 0.9))
	}
	for _, d := range drivers {
		sb, err := d.d.Create(context.Background(), sandbox.Spec{ID: "sbx-seccomp-forks"})
		if err != nil {
			t.Fatal(err)
		}
		var runs []time.Duration
		for range 5 {
			start := time.Now()
			if _, _, e := runIn(t, sb, "i=0; while [ $i -lt 1000 ]; do /bin/true; i=$((i+1)); done"); e.Code != 0 {
				t.Fatalf("forks: %+v", e)
			}
			runs = append(runs, time.Since(start))
		}
		_ = sb.Destroy(context.Background())
		t.Logf("%s: 1000 fork+exec of /bin/true, median of 5: %v (%v each)", d.name, quantile(runs, 0.5), quantile(runs, 0.5)/1000)
	}
}
