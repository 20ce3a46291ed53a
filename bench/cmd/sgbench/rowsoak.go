package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// --- row 14: the soak ---------------------------------------------------------
//
// The soak of issue 41 item 5 is cmd/sandgate's TestSoak (the CI runs it
// with 1,000 sessions): this row runs it with --soak-sessions (10,000 by
// default) against the binary under test, churned at a concurrency of 50
// (create, one REST command, DELETE; a quarter each with egress to a
// loopback listener, an OCI image from a loopback registry, a named
// workspace, or nothing), and reports its pace, the leaks it found (none
// is the target: mounts, loop devices, cgroups, network namespaces,
// descriptors, goroutines, temporary files) and the gateway's RSS after
// it against after its warm-up (target: within 10%). It takes about a
// minute per 1,000 sessions on 2 cores, so it is not in the default rows:
// `bench/run --rows 14`.

type soakResult struct {
	Sessions    int            `json:"sessions"`
	Concurrency int            `json:"concurrency"`
	WallSeconds float64        `json:"wallSeconds"`
	PerSecond   float64        `json:"sessionsPerSecond"`
	Mix         map[string]int `json:"Mix"`
	Before      struct {
		RSSKiB int64 `json:"rssKiB"`
	} `json:"before"`
	After struct {
		RSSKiB int64 `json:"rssKiB"`
	} `json:"after"`
	RSSDrift float64  `json:"rssDrift"`
	Leaks    []string `json:"leaks"`
}

func (b *bench) rowSoak() error {
	r := b.report
	n := soakSessions(b.cfg)
	if _, err := os.Stat(filepath.Join(b.cfg.repo, "cmd", "sandgate", "soak_test.go")); err != nil {
		r.add(&Row{ID: "14", Name: "soak", Skipped: "this checkout has no cmd/sandgate/soak_test.go"})
		return nil
	}
	out := filepath.Join(b.tmp, "soak.json")
	cmd := exec.CommandContext(b.ctx, "go", "test", "-count=1", "-timeout", fmt.Sprintf("%dm", 10+n/200),
		"-run", "^TestSoak$", "./cmd/sandgate/")
	cmd.Dir = b.cfg.repo
	cmd.Env = append(os.Environ(), "SANDGATE_BIN="+b.cfg.sandgateBin, "SANDGATE_SOAK_REPORT="+out,
		fmt.Sprintf("SANDGATE_SOAK_SESSIONS=%d", n))
	start := time.Now()
	log, err := cmd.CombinedOutput()
	var res soakResult
	b2, rerr := os.ReadFile(out)
	if rerr != nil || json.Unmarshal(b2, &res) != nil {
		tail := string(log)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("the soak (go test -run TestSoak) wrote no report after %v: %v\n%s", time.Since(start).Round(time.Second), err, tail)
	}
	mix := fmt.Sprintf("egress %d, image %d, workspace %d, plain %d", res.Mix["egress"], res.Mix["image"], res.Mix["workspace"], res.Mix["plain"])
	r.add(&Row{ID: "14", Name: fmt.Sprintf("soak: %d sessions at concurrency %d (create, one REST command, DELETE; %s), wall time", res.Sessions, res.Concurrency, mix),
		Stat: "value", Unit: "s", SG: NewStats([]float64{res.WallSeconds}), Note: fmt.Sprintf("%.1f sessions/s", res.PerSecond)})
	leaks := "none"
	if len(res.Leaks) > 0 {
		leaks = strings.Join(res.Leaks, "; ")
	}
	r.add(&Row{ID: "14", Name: "soak: leaks after it (mounts, loop devices, cgroups, network namespaces, descriptors, goroutines, temporary files, RSS > +10%)",
		Stat: "value", Unit: "", SG: NewStats([]float64{float64(len(res.Leaks))}), Note: leaks})
	r.add(&Row{ID: "14", Name: "soak: gateway RSS after it, vs after its warm-up", Stat: "value", Unit: "B",
		SG: NewStats([]float64{float64(res.After.RSSKiB << 10)}), Ref: NewStats([]float64{float64(res.Before.RSSKiB << 10)}), RefKind: "after the warm-up",
		Note: fmt.Sprintf("drift %+.1f%% (target: within 10%%)", 100*res.RSSDrift)})
	if err != nil && len(res.Leaks) == 0 {
		return fmt.Errorf("the soak failed: %v", err)
	}
	return nil
}

// soakSessions is how many sessions row 14 churns.
func soakSessions(c *config) int {
	switch {
	case c.soakN > 0:
		return c.soakN
	case c.quick:
		return 1000
	}
	return 10000
}
