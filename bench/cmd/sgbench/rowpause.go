package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
// it) on the main session paused vs running, alternating. 15d, fork, runs
// on a gateway of its own, with serve --checkpoint (rowFork).

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
	// A session restored from a checkpoint pauses by a freeze
	// (docs/pause.md): under serve --checkpoint each run starts from a
	// stop and a start, untimed, for a pause that checkpoints.
	checkpoint := probe.Pause.Method == "checkpoint"
	fresh := func(base string) error {
		if !checkpoint {
			return nil
		}
		if err := rc.post(ctx, base+"/stop", nil, nil); err != nil {
			return err
		}
		return rc.command(ctx, strings.TrimPrefix(base, "/v1/sessions/"), restTrue)
	}
	const fill = `{"code": "blob = bytearray(b'x') * (100 << 20); len(blob)"}`
	if err := rc.post(ctx, base+"/python", []byte(fill), nil); err != nil {
		return err
	}
	var pauses, resident []float64
	var onPaused, onRunning []float64
	methods := map[string]int{}
	for i := 0; i < n; i++ {
		if checkpoint {
			if err := fresh(base); err != nil {
				return err
			}
			if err := rc.post(ctx, base+"/python", []byte(fill), nil); err != nil {
				return err
			}
		}
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
		methods[a.Pause.Method]++
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
		if err := fresh(mainBase); err != nil {
			return 0, err
		}
		var a pauseAnswer
		if err := rc.post(ctx, mainBase+"/pause", nil, &a); err != nil {
			return 0, err
		}
		if a.Pause != nil {
			methods["main:"+a.Pause.Method]++
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
	how := "cgroup freezer + memory reclaim (memory.force_empty / memory.reclaim)"
	if checkpoint {
		how = "serve --checkpoint: CRIU dump, processes ended; restored in place by the next call (each run after an untimed stop and start)"
	}
	r.add(&Row{ID: "15a", Name: fmt.Sprintf("POST /pause of a session whose python kernel holds 100 MiB, %d runs", n), Stat: "p50", Unit: "s", SG: ps,
		SGName: how, Note: fmt.Sprintf("kernel's 100 MiB intact after %d pause/resume cycles: %v; pause methods %v", n, kept, methods)})
	r.add(&Row{ID: "15a", Name: "memory still resident after the pause (the pause answer's residentBytes)", Stat: "p50", Unit: "B", SG: rs,
		Note: fmt.Sprintf("target < 1 MiB: %s; %s", verdict(rs.Median < pauseResidentTarget), swapNote())})
	r.add(&Row{ID: "15b", Name: fmt.Sprintf("first REST command `true` on the paused session (the call resumes it) vs on it running, %d each", n), Stat: "p50", Unit: "s",
		SG: pst, Ref: rst, SGName: "paused", RefKind: "running", RefName: "the same session running",
		Note: fmt.Sprintf("resume to first command answered, target ≤ %v: %s", resumeTarget, verdict(pst.Median <= resumeTarget.Seconds()))})
	added := time.Duration((spt.Median - srt.Median) * float64(time.Second))
	r.add(&Row{ID: "15c", Name: fmt.Sprintf("`ssh sg true` (new connection, CONNECT tunnel) on the paused main session vs on it running, %d each, alternating", n), Stat: "p50", Unit: "s",
		SG: spt, Ref: srt, SGName: "paused", RefKind: "running", RefName: "the same session running",
		Note: fmt.Sprintf("auto-resume adds %.1f ms, target ≤ %v: %s", added.Seconds()*1e3, sshResumeTarget, verdict(added <= sshResumeTarget))})
	return b.rowFork()
}

// forkTarget is issue 43's: fork ×4 to first command in each, p50.
const forkTarget = 250 * time.Millisecond

// criuBin is the criu 4.x row 15d runs (serve --checkpoint --criu):
// $SANDGATE_CRIU, else the one .ci/build-criu builds ("": none).
func criuBin() string {
	for _, c := range []string{os.Getenv("SANDGATE_CRIU"), filepath.Join(os.Getenv("HOME"), ".cache/sandgate/criu-4.2/criu")} {
		if c == "" {
			continue
		}
		if out, err := exec.Command(c, "--version").CombinedOutput(); err == nil && bytes.Contains(out, []byte("Version: 4.")) {
			return c
		}
	}
	return ""
}

// rowFork is 15d: on a gateway of its own (serve --checkpoint), a session
// whose python kernel holds 100 MiB and a variable, with a server on its
// loopback, is forked ×4, n times: for each fork, the time from the fork's
// request to its first REST command answered. The forks' kernel variable
// and server are checked once.
func (b *bench) rowFork() error {
	r := b.report
	criu := criuBin()
	if criu == "" {
		r.add(&Row{ID: "15d", Name: "fork ×4 to first command in each", Skipped: "no criu 4.x (SANDGATE_CRIU, or .ci/build-criu's ~/.cache/sandgate/criu-4.2/criu)"})
		return nil
	}
	args := append([]string{"--warm-pool", "0", "--checkpoint", "--criu", criu, "--sandbox-workspace-size", strconv.FormatInt(1<<30, 10), "--server-timing"}, b.cfg.serveArgs...)
	g, err := startSandgate(b.cfg.sandgateBin, filepath.Join(b.tmp, "sandgate-fork"), "linux", args)
	if err != nil {
		return err
	}
	defer g.stop()
	ctx := b.ctx
	rc := newRESTClient(g)
	defer rc.close()
	sess, err := g.create(ctx)
	if err != nil {
		return err
	}
	base := "/v1/sessions/" + sess.ID
	if err := rc.post(ctx, base+"/python", []byte(`{"code": "blob = bytearray(b'x') * (100 << 20); v = 4242; len(blob)"}`), nil); err != nil {
		return err
	}
	if err := rc.command(ctx, sess.ID, []byte(`{"command": "nohup python3 -m http.server 8766 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1"}`)); err != nil {
		return err
	}
	const count = 4
	n := max(b.cfg.execN/20, 3)
	var perFork, answers []float64
	steps := map[string][]float64{} // the fork's Server-Timing steps
	kernelKept, serverKept := true, true
	for round := range n {
		t0 := time.Now()
		status, body, hdr, err := rc.postHeader(ctx, base+"/fork", []byte(`{"count": 4}`))
		if err != nil {
			return err
		}
		st, _ := parseServerTiming(hdr.Get("Server-Timing"))
		for k, v := range st {
			steps[k] = append(steps[k], v)
		}
		if status != http.StatusCreated {
			return fmt.Errorf("POST /fork: %d %s", status, bytes.TrimSpace(body))
		}
		answers = append(answers, time.Since(t0).Seconds())
		var fa struct {
			Sessions []struct {
				SessionID string `json:"sessionId"`
			} `json:"sessions"`
		}
		if err := json.Unmarshal(body, &fa); err != nil || len(fa.Sessions) != count {
			return fmt.Errorf("POST /fork answered %s", bytes.TrimSpace(body))
		}
		times := make([]float64, count)
		if err := parallel(count, count, func(i int) error {
			frc := newRESTClient(g)
			defer frc.close()
			err := frc.command(ctx, fa.Sessions[i].SessionID, restTrue)
			times[i] = time.Since(t0).Seconds()
			return err
		}); err != nil {
			return err
		}
		perFork = append(perFork, times...)
		if round == 0 {
			id := fa.Sessions[0].SessionID
			var k struct {
				Result *string `json:"result"`
			}
			if err := rc.post(ctx, "/v1/sessions/"+id+"/python", []byte(`{"code": "v"}`), &k); err != nil || k.Result == nil || *k.Result != "4242" {
				kernelKept = false
			}
			probe := `{"command": "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8766/\").status)'"}`
			if err := rc.command(ctx, id, []byte(probe)); err != nil {
				serverKept = false
			}
		}
		for _, f := range fa.Sessions {
			if err := rc.delete(context.WithoutCancel(ctx), f.SessionID); err != nil {
				return err
			}
		}
	}
	var breakdown []string
	for _, k := range []string{"checkpoint", "restores", "images_removed"} {
		if len(steps[k]) > 0 {
			breakdown = append(breakdown, fmt.Sprintf("%s %.0f ms", k, NewStats(steps[k]).Median*1e3))
		}
	}
	st, at := NewStats(perFork), NewStats(answers)
	met := "missed"
	if st.Median <= forkTarget.Seconds() {
		met = "met"
	}
	r.add(&Row{ID: "15d", Name: fmt.Sprintf("fork ×4 (POST /fork {\"count\": 4}) of a session whose python kernel holds 100 MiB, to the first REST command answered in each fork, %d forks", len(perFork)), Stat: "p50", Unit: "s",
		SG: st, SGName: "serve --checkpoint: one CRIU dump (--leave-running), 4 restores",
		Note: fmt.Sprintf("target ≤ %v: %s; the fork's answer (4 sessions) p50 %.0f ms (its Server-Timing, p50: %s); restored kernel keeps its variable: %v; restored server answers on its port: %v", forkTarget, met, at.Median*1e3, strings.Join(breakdown, ", "), kernelKept, serverKept)})
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
