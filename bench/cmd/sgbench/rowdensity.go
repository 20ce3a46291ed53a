package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// --- row 16: idle density --------------------------------------------------------
//
// Issue 41's density targets: N idle sessions (created, nothing run) on the
// linux driver, with no warm pool. The sandbox side is the PSS (shared
// pages split between the processes sharing them) of every process under
// the gateway, that is every sandbox's init and whatever it runs, summed
// and divided by N; the gateway side is the growth of the gateway's
// anonymous PSS (heap, stacks) from before the creates, divided by N. Targets: 2 MiB and
// 128 KiB per session.

func (b *bench) rowDensity() error {
	for _, n := range b.cfg.density {
		if err := b.densityAt(n); err != nil {
			return fmt.Errorf("%d sessions: %w", n, err)
		}
	}
	return nil
}

func (b *bench) densityAt(n int) error {
	args := append([]string{"--warm-pool", "0", "--sandbox-workspace-size", strconv.FormatInt(64<<20, 10)}, b.cfg.serveArgs...)
	g, err := startSandgate(b.cfg.sandgateBin, filepath.Join(b.tmp, "sandgate-density-"+strconv.Itoa(n)), "linux", args)
	if err != nil {
		return err
	}
	defer g.stop()
	init := initKind(g.logPath)
	time.Sleep(time.Second)
	pid := g.pid()
	gwRSS0, gwAnon0 := rssBytes(pid), anonPSSBytes(pid)
	t0 := time.Now()
	if err := parallel(n, 8, func(i int) error {
		_, err := g.create(b.ctx)
		return err
	}); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	took := time.Since(t0)
	// Idle: the inits have given their set-up's heap back (at once), and
	// the gateway's creates are over.
	time.Sleep(3 * time.Second)
	procs := descendants(pid)
	sbRSS, sbPSS := treeMemory(procs)
	gwRSS1, gwAnon1 := rssBytes(pid), anonPSSBytes(pid)
	per := func(v int64) float64 { return float64(v) / float64(n) }
	one := func(v float64) *Stats { return NewStats([]float64{v}) }
	r := b.report
	r.add(&Row{ID: "16", Name: fmt.Sprintf("idle density, %d sessions: sandbox-side PSS per session (target ≤ 2 MiB)", n), Stat: "value", Unit: "B",
		SG: one(per(sbPSS)), SGName: "PSS of every sandbox process / session, init: " + init,
		Note: fmt.Sprintf("%d sandbox processes, RSS %s/session; %d creates took %v (8 at once)", len(procs), formatValue(per(sbRSS), "B"), n, took.Round(time.Millisecond))})
	r.add(&Row{ID: "16", Name: fmt.Sprintf("idle density, %d sessions: gateway memory per session (target ≤ 128 KiB)", n), Stat: "value", Unit: "B",
		SG: one(per(gwAnon1 - gwAnon0)), SGName: "gateway anonymous PSS delta / session",
		Note: fmt.Sprintf("gateway anonymous PSS %s → %s, RSS %s → %s (RSS %s/session)", formatValue(float64(gwAnon0), "B"), formatValue(float64(gwAnon1), "B"),
			formatValue(float64(gwRSS0), "B"), formatValue(float64(gwRSS1), "B"), formatValue(per(gwRSS1-gwRSS0), "B"))})
	return nil
}

// anonPSSBytes is a process's anonymous memory (Pss_Anon): its heap and
// stacks. The gateway's whole PSS would mislead here: the pages of its
// binary are split with every init that runs the same binary.
func anonPSSBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pss_Anon:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n * 1024
			}
		}
	}
	return 0
}

// initKind is what the gateway's log says its sandboxes' init is: the
// small embedded one, or the gateway's own binary.
func initKind(logPath string) string {
	b, _ := os.ReadFile(logPath)
	if strings.Contains(string(b), "built without the small init") {
		return "the gateway's own binary"
	}
	return "embedded"
}
