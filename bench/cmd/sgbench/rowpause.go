package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

// --- row 15: pause and resume a session in place ----------------------------
//
// On the main gateway (linux driver), a session whose python kernel holds
// 100 MiB is paused and resumed pauseN times: 15a is the pause answered
// (POST /pause) and the memory the answer says the paused sandbox still
// holds; 15b is the first REST command on the paused session (the call
// resumes it) vs the same command on it running, alternating; 15c is
// `ssh sg true` (a new connection through the CONNECT tunnel, which resumes
// it) on the main session paused vs running, alternating. 15d, fork, is not
// built: docs/pause.md says why (CRIU).

// Targets of issue 43.
const (
	pauseResidentTarget = 1 << 20
	resumeTarget        = 150 * time.Millisecond
	sshResumeTarget     = 200 * time.Millisecond
)

// post sends body to path with POST on rc's connection and decodes a 200
// answer into out (nil: discarded).
func (rc *restClient) post(ctx context.Context, path string, body []byte, out any) error {
	status, b, err := rc.postRaw(ctx, path, body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("POST %s: %d %s", path, status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// pauseAnswer is the part of POST /pause's answer the bench reads.
type pauseAnswer struct {
	Status string `json:"status"`
	Pause  *struct {
		Method        string `json:"method"`
		ResidentBytes *int64 `json:"residentBytes"`
	} `json:"pause"`
}

func (b *bench) rowPause() error {
	r := b.report
	if b.sg.driver != "linux" {
		r.add(&Row{ID: "15a", Name: "pause / resume", Skipped: "needs the linux driver (this run: " + b.sg.driver + ")"})
		return nil
	}
	n := b.cfg.execN / 10
	if n < 5 {
		n = 5
	}
	ctx := b.ctx
	rc := newRESTClient(b.sg)
	defer rc.close()
	sess, err := b.sg.create(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = rc.delete(context.WithoutCancel(ctx), sess.ID) }()
	base := "/v1/sessions/" + sess.ID
	var probe pauseAnswer
	if err := rc.post(ctx, base+"/pause", nil, &probe); err != nil || probe.Pause == nil {
		r.add(&Row{ID: "15a", Name: "pause / resume", Skipped: fmt.Sprintf("this sandgate cannot pause sessions (%v)", err)})
		return nil
	}
	if err := rc.post(ctx, base+"/resume", nil, nil); err != nil {
		return err
	}
	// 100 MiB the kernel has written to, so that it is resident.
	if err := rc.post(ctx, base+"/python", []byte(`{"code": "blob = bytearray(b'x') * (100 << 20); len(blob)"}`), nil); err != nil {
		return err
	}
	var pauses, resident []float64
	var onPaused, onRunning []float64
	for i := 0; i < n; i++ {
		t0 := time.Now()
		var a pauseAnswer
		if err := rc.post(ctx, base+"/pause", nil, &a); err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0).Seconds())
		if a.Status != "paused" || a.Pause == nil || a.Pause.ResidentBytes == nil {
			return fmt.Errorf("pause answered %+v", a)
		}
		resident = append(resident, float64(*a.Pause.ResidentBytes))
		// First command on the paused session (it resumes it) and on the
		// running one, the order flipped every round.
		paused := func() (float64, error) {
			t := time.Now()
			err := rc.command(ctx, sess.ID, restTrue)
			return time.Since(t).Seconds(), err
		}
		running := func() (float64, error) {
			t := time.Now()
			err := rc.command(ctx, sess.ID, restTrue)
			return time.Since(t).Seconds(), err
		}
		x, err := paused() // paused above: this one resumes it
		if err != nil {
			return err
		}
		y, err := running()
		if err != nil {
			return err
		}
		onPaused, onRunning = append(onPaused, x), append(onRunning, y)
	}
	var kernel struct {
		Result *string `json:"result"`
	}
	if err := rc.post(ctx, base+"/python", []byte(`{"code": "len(blob) == 100 << 20"}`), &kernel); err != nil {
		return err
	}
	kept := kernel.Result != nil && *kernel.Result == "True"

	// 15c: a new SSH connection to the main session, paused vs running.
	mainBase := "/v1/sessions/" + b.sess.ID
	sshPaused := func() (float64, error) {
		if err := rc.post(ctx, mainBase+"/pause", nil, nil); err != nil {
			return 0, err
		}
		d, err := b.ssh("sg", "true")
		return d.Seconds(), err
	}
	sshRunning := func() (float64, error) {
		d, err := b.ssh("sg", "true")
		return d.Seconds(), err
	}
	if _, err := sshRunning(); err != nil { // warm-up
		return err
	}
	sp, sr, err := alternate(n, sshPaused, sshRunning)
	if err != nil {
		return err
	}

	ps, rs := NewStats(pauses), NewStats(resident)
	pst, rst := NewStats(onPaused), NewStats(onRunning)
	spt, srt := NewStats(sp), NewStats(sr)
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	r.add(&Row{ID: "15a", Name: fmt.Sprintf("POST /pause of a session whose python kernel holds 100 MiB, %d runs", n), Stat: "p50", Unit: "s", SG: ps,
		SGName: "cgroup freezer + memory reclaim (memory.force_empty / memory.reclaim)", Note: fmt.Sprintf("kernel's 100 MiB intact after %d pause/resume cycles: %v", n, kept)})
	r.add(&Row{ID: "15a", Name: "memory still resident after the pause (the pause answer's residentBytes)", Stat: "p50", Unit: "B", SG: rs,
		Note: fmt.Sprintf("target < 1 MiB: %s; %s", verdict(rs.Median < pauseResidentTarget), swapNote())})
	r.add(&Row{ID: "15b", Name: fmt.Sprintf("first REST command `true` on the paused session (the call resumes it) vs on it running, %d each", n), Stat: "p50", Unit: "s",
		SG: pst, Ref: rst, SGName: "paused", RefKind: "running", RefName: "the same session running",
		Note: fmt.Sprintf("resume to first command answered, target ≤ %v: %s", resumeTarget, verdict(pst.Median <= resumeTarget.Seconds()))})
	added := time.Duration((spt.Median - srt.Median) * float64(time.Second))
	r.add(&Row{ID: "15c", Name: fmt.Sprintf("`ssh sg true` (new connection, CONNECT tunnel) on the paused main session vs on it running, %d each, alternating", n), Stat: "p50", Unit: "s",
		SG: spt, Ref: srt, SGName: "paused", RefKind: "running", RefName: "the same session running",
		Note: fmt.Sprintf("auto-resume adds %.1f ms, target ≤ %v: %s", added.Seconds()*1e3, sshResumeTarget, verdict(added <= sshResumeTarget))})
	r.add(&Row{ID: "15d", Name: "fork ×4 to first command in each", Skipped: "not built: fork needs a checkpoint of the processes, and CRIU cannot dump a sandbox on this kernel and init yet (docs/pause.md)"})
	return nil
}

// swapNote says what the host's swap means for row 15a: the reclaim
// moves anonymous memory only to swap.
func swapNote() string {
	b, err := os.ReadFile("/proc/swaps")
	if err != nil || len(strings.Split(strings.TrimSpace(string(b)), "\n")) < 2 {
		return "this host has no swap: a freeze keeps anonymous memory resident (docs/pause.md)"
	}
	return "the host has swap: the reclaim moved the kernel's memory there; what stays is the kernel's own (page tables, stacks, slab)"
}
