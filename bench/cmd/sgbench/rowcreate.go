package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// --- row 11: where a create's time goes, and the warm pool -------------------
//
// Two linux gateways, one with `--warm-pool 0` (every create builds its
// sandbox) and one with the default pool (`--warm-pool` not given, 8),
// take creates in turn, each
// followed at once by the first REST command (`true`, on the same open
// HTTP connection) and an untimed DELETE. Row 11a is create → first REST
// command done; row 11b is each step of the create as the gateway's
// Server-Timing header tells it (POST /v1/sessions), p50 and p99 over the
// same creates, so that a change shows which step it moved.

// warmGap is the pause before each measured create, in which the warm
// gateway's pool refills in the background (a create never waits for
// it; one that finds the pool empty builds its sandbox, and 11a counts them).
const warmGap = 300 * time.Millisecond

// traced is one create → first command of row 11.
type traced struct {
	create, first float64            // seconds
	del           float64            // DELETE answered, seconds
	steps         map[string]float64 // seconds, from Server-Timing
	stepNames     []string           // in the header's order
	warm          bool               // the create claimed a warm sandbox
}

func (b *bench) rowCreateTrace() error {
	r := b.report
	help, _ := exec.Command(b.cfg.sandgateBin, "serve", "-h").CombinedOutput()
	if !bytes.Contains(help, []byte("-warm-pool")) {
		r.add(&Row{ID: "11a", Name: "create → first REST command, warm pool vs none", Skipped: "this sandgate has no --warm-pool"})
		return nil
	}
	ways := []struct {
		name string
		g    *sandgate
		rc   *restClient
		runs []traced
		args []string
	}{{name: "warm", args: []string{"--server-timing"}}, {name: "cold", args: []string{"--warm-pool", "0", "--teardown-queue", "0", "--server-timing"}}}
	// Both may give sessions egress (to 127.0.0.1 as big.test) and a
	// secret, for 11d.
	secrets := filepath.Join(b.tmp, "secrets-11")
	if err := os.WriteFile(secrets, []byte(egressSecret+"=sgbench-"+randHex(16)+"\n"), 0o600); err != nil {
		return err
	}
	egressArgs := []string{"--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", egressName + "=127.0.0.1", "--secrets-file", secrets}
	for i := range ways {
		w := &ways[i]
		g, err := startSandgate(b.cfg.sandgateBin, filepath.Join(b.tmp, "sandgate-11-"+w.name), "linux",
			append(append(slices.Clone(b.cfg.serveArgs), egressArgs...), w.args...))
		if err != nil {
			r.add(&Row{ID: "11a", Name: "create → first REST command (linux driver)", Skipped: err.Error()})
			return nil
		}
		b.others = append(b.others, g)
		if g.driver != "linux" {
			r.add(&Row{ID: "11a", Name: "create → first REST command (linux driver)", Skipped: "serve --sandbox linux runs driver " + g.driver})
			return nil
		}
		w.g, w.rc = g, newRESTClient(g)
		defer w.rc.close()
	}
	full := fmt.Sprintf(`{"egress": ["%s:9"], "secrets": ["%s"], "resources": {"memoryMiB": 256, "cpus": 0.5, "pids": 128}}`, egressName, egressSecret)
	var fullRuns [2][]traced
	for i := -3; i < b.cfg.createN; i++ { // three warm-up rounds
		for k := range ways {
			wi := (k + max(i, 0)) % len(ways) // alternate which goes first
			w := &ways[wi]
			for _, body := range []string{"{}", full} {
				time.Sleep(warmGap)
				t, err := traceCreate(b.ctx, w.g, w.rc, body)
				if err != nil {
					return fmt.Errorf("%s gateway: %w", w.name, err)
				}
				if i < 0 {
					continue
				}
				if body == full {
					fullRuns[wi] = append(fullRuns[wi], t)
				} else {
					w.runs = append(w.runs, t)
				}
			}
		}
	}
	warm, cold := ways[0].runs, ways[1].runs
	pick := func(ts []traced, f func(traced) (float64, bool)) *Stats {
		var xs []float64
		for _, t := range ts {
			if v, ok := f(t); ok {
				xs = append(xs, v)
			}
		}
		return NewStats(xs)
	}
	first := func(t traced) (float64, bool) { return t.first, true }
	create := func(t traced) (float64, bool) { return t.create, true }
	claimed := 0
	for _, t := range warm {
		if t.warm {
			claimed++
		}
	}
	via, refVia := "default `--warm-pool` (auto: four per GiB of the host's memory, 8-64)", "`--warm-pool 0 --teardown-queue 0`"
	name := "session create → first REST command done (`true`, same HTTP connection), linux driver"
	note := fmt.Sprintf("%d of %d creates claimed a warm sandbox; %v between creates", claimed, len(warm), warmGap)
	for _, st := range []string{"p50", "p99"} {
		r.add(&Row{ID: "11a", Name: name, Stat: st, Unit: "s", SG: pick(warm, first), Ref: pick(cold, first), SGName: via, RefName: refVia, RefKind: "no pool", Note: note})
	}
	r.add(&Row{ID: "11a", Name: "… of which `POST /v1/sessions` (client side)", Stat: "p50", Unit: "s", SG: pick(warm, create), Ref: pick(cold, create), SGName: via, RefName: refVia, RefKind: "no pool"})
	claimedFull := 0
	for _, t := range fullRuns[0] {
		if t.warm {
			claimedFull++
		}
	}
	for _, st := range []string{"p50", "p99"} {
		r.add(&Row{ID: "11d", Name: "the same with egress, a secret and resources: `" + strings.ReplaceAll(full, ":9", ":PORT") + "`", Stat: st, Unit: "s",
			SG: pick(fullRuns[0], first), Ref: pick(fullRuns[1], first), SGName: via, RefName: refVia, RefKind: "no pool",
			Note: fmt.Sprintf("%d of %d creates claimed a warm sandbox; alternating with 11a's `{}`", claimedFull, len(fullRuns[0]))})
	}
	del := func(t traced) (float64, bool) { return t.del, true }
	for _, st := range []string{"p50", "p99"} {
		r.add(&Row{ID: "11c", Name: "`DELETE /v1/sessions/{id}` answered, just after the first command", Stat: st, Unit: "s", SG: pick(warm, del), Ref: pick(cold, del),
			SGName: "default `--teardown-queue` (released in the background)", RefName: "`--teardown-queue 0` (released before the answer)", RefKind: "sync"})
	}
	if b.cfg.wantRow("11e") {
		if err := b.rowPlainClient(ways[0].g, ways[1].g, via, refVia); err != nil {
			return fmt.Errorf("11e: %w", err)
		}
	}
	// 11b: every step either way showed, in the order a cold create runs them.
	var order []string
	for _, ts := range [][]traced{cold, warm} {
		for _, t := range ts {
			for _, s := range t.stepNames {
				if !slices.Contains(order, s) {
					order = append(order, s)
				}
			}
		}
	}
	for _, step := range order {
		f := func(t traced) (float64, bool) { v, ok := t.steps[step]; return v, ok }
		for _, st := range []string{"p50", "p99"} {
			r.add(&Row{ID: "11b", Name: "create step `" + step + "`", Stat: st, Unit: "s", SG: pick(warm, f), Ref: pick(cold, f), SGName: via, RefName: refVia, RefKind: "no pool",
				Note: stepNotes[step]})
		}
	}
	r.note("row 11b: the steps of `POST /v1/sessions` from its Server-Timing header; a warm claim has no driver steps (its sandbox was built before); `*_bg` ran beside the steps after it; `init.*` are the sandbox init's own steps, from `init_fork` to `init_handshake`, beside the gateway's")
	return nil
}

// stepNotes say what a step of row 11b covers.
var stepNotes = map[string]string{
	"check":               "parameters, quota reservation",
	"session":             "ids, password, workspace claim",
	"claim_times":         "the files a warm sandbox's build wrote get the claim's time (a walk of /, /etc, /dev, /tmp, /workspace in its mounts)",
	"warm_claim":          "the rest of a claim: the session's limits set in the warm sandbox's cgroups, its trust store",
	"driver_state":        "sandbox dir, uid range, state file",
	"cgroups":             "cgroup dirs and limits",
	"init_fork":           "clone into new namespaces + exec of the init, its pidfd, state saved",
	"init_exec_bg":        "of init_fork: by the spawn server (sandbox-spawner): v1 cgroups joined, clone into new namespaces, ids mapped, exec done, pidfd sent back",
	"workspace_image_bg":  "workspace filesystem (loop ext4 from a template), beside init_fork",
	"workspace.copy_bg":   "of workspace_image_bg: the template copied (FICLONE, or its data extents)",
	"workspace.mount_bg":  "of workspace_image_bg: loop device attached, ext4 mounted",
	"workspace.chown_bg":  "of workspace_image_bg: its root given to the sandbox user",
	"init_spec":           "control socket; spec sent (the init builds its root and /etc meanwhile)",
	"workspace_wait":      "what remained of workspace_image_bg",
	"workspace_mount":     "control socket, open_tree of the workspace",
	"init_handshake":      "workspace sent → init ready",
	"init.exec_to_main":   "fork → the init's main (exec + Go runtime start)",
	"init.root":           "tmpfs root and read-only binds of /usr...",
	"init.etc":            "the sandbox's own /etc",
	"init.dev":            "the sandbox's /dev (tmpfs, device binds, devpts, /dev/shm)",
	"init.proc_tmp":       "/proc and /tmp mounted",
	"init.pivot":          "/workspace attached, pivot_root, read-only remount",
	"init.cpu_join":       "every init thread moves itself into the sandbox's v1 cpu cgroup (a write of \"0\" each, no RCU grace period)",
	"init.net":            "hostname, loopback up",
	"init.seccomp_bg":     "spawner thread, beside the root's building from the spec's arrival: no_new_privs, bounding set, the gateway's seccomp program loaded",
	"init.seccomp":        "what remained of init.seccomp_bg; the spawner thread joins the commands' cgroups",
	"workspace_attach":    "named workspace restored (none here)",
	"store":               "session record written (bbolt, fsync)",
	"total":               "the whole of Manager.Create as the gateway timed it",
	"init.wait_spec":      "init's main → its spec received",
	"init.wait_workspace": "root, /etc, /dev, /proc and /tmp built → the workspace received",
	"init.limits":         "nested user namespaces off, RLIMIT_NOFILE",
	"egress_proxy":        "the session's egress proxy",
}

// traceCreate makes one session on g, runs `true` in it through rc, and
// deletes it (untimed).
func traceCreate(ctx context.Context, g *sandgate, rc *restClient, body string) (traced, error) {
	var t traced
	t0 := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/sessions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := rc.http.Do(req)
	if err != nil {
		return t, err
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return t, fmt.Errorf("create session: %d %s", resp.StatusCode, bytes.TrimSpace(answer))
	}
	t.create = time.Since(t0).Seconds()
	var s struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(answer, &s); err != nil {
		return t, fmt.Errorf("create session: %w", err)
	}
	createdMu.Lock()
	created = append(created, s.SessionID)
	createdMu.Unlock()
	err = rc.command(ctx, s.SessionID, restTrue)
	t.first = time.Since(t0).Seconds()
	t1 := time.Now()
	derr := rc.delete(ctx, s.SessionID)
	t.del = time.Since(t1).Seconds()
	if err != nil {
		return t, err
	}
	if derr != nil {
		return t, derr
	}
	t.steps, t.stepNames = parseServerTiming(resp.Header.Get("Server-Timing"))
	_, t.warm = t.steps["warm_claim"]
	return t, nil
}

// parseServerTiming reads `name;dur=ms, ...` into seconds per name, and
// the names in order.
func parseServerTiming(h string) (map[string]float64, []string) {
	steps := map[string]float64{}
	var names []string
	for _, part := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if name == "" {
			continue
		}
		for _, p := range strings.Split(params, ";") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if ms, err := strconv.ParseFloat(v, 64); err == nil {
					if _, seen := steps[name]; !seen {
						names = append(names, name)
					}
					steps[name] += ms / 1000
				}
			}
		}
	}
	return steps, names
}

// delete ends session id (DELETE, on rc's open connection) and checks the 204.
func (rc *restClient) delete(ctx context.Context, id string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, rc.g.url+"/v1/sessions/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+rc.g.token)
	resp, err := rc.http.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("DELETE session: %d %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	return nil
}

// plainRuns and plainN are row 11e's sizes: the check, the best of
// three runs of 60.
const (
	plainRuns = 3
	plainN    = 60
)

// rowPlainClient is row 11e: 11a's create → first command, the DELETE
// after it, and 10a's command round trip as a plain client sees them
// (bench/plain_client.py: Python's http.client, one keep-alive
// connection, creates back to back with no pause for the pool), the best
// of plainRuns runs of plainN by p50, on the warm gateway and the cold one.
func (b *bench) rowPlainClient(warm, cold *sandgate, via, refVia string) error {
	r := b.report
	name := "plain client (Python http.client, loopback, back to back), best of 3 runs of 60: "
	if _, err := exec.LookPath(b.cfg.python); err != nil {
		r.add(&Row{ID: "11e", Name: name + "create → first REST command", Skipped: b.cfg.python + " not found"})
		return nil
	}
	script := filepath.Join(b.cfg.repo, "bench", "plain_client.py")
	run := func(g *sandgate, mode, body string, endpoint ...string) (best, del *Stats, err error) {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
		defer cancel()
		args := append([]string{script, g.url, g.token, mode, strconv.Itoa(plainN), strconv.Itoa(plainRuns), body}, endpoint...)
		cmd := exec.CommandContext(ctx, b.cfg.python, args...)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, nil, fmt.Errorf("plain_client.py %s: %w", mode, err)
		}
		var res struct{ Runs, Delete [][]float64 }
		if err := json.Unmarshal(out, &res); err != nil {
			return nil, nil, fmt.Errorf("plain_client.py %s: %w: %s", mode, err, out)
		}
		for i, xs := range res.Runs {
			if st := NewStats(xs); best == nil || st.Median < best.Median {
				best = st
				if i < len(res.Delete) && len(res.Delete[i]) > 0 {
					del = NewStats(res.Delete[i])
				}
			}
		}
		return best, del, nil
	}
	wf, wd, err := run(warm, "first", string(restTrue))
	if err != nil {
		return err
	}
	cf, cd, err := run(cold, "first", string(restTrue))
	if err != nil {
		return err
	}
	note := "targets: warm p50 ≤ 5 ms, p99 ≤ 15 ms; cold p50 ≤ 12 ms; back to back, the default pool (auto, 64 from 16 GiB of memory) serves a run as large as it, then refills behind the creates, one build at a time on 2 cores, so the later runs' creates build some of their sandboxes: the best run is the one the pool served"
	for _, st := range []string{"p50", "p99"} {
		r.add(&Row{ID: "11e", Name: name + "create → first REST command `true`", Stat: st, Unit: "s", SG: wf, Ref: cf, SGName: via, RefName: refVia, RefKind: "no pool", Note: note})
	}
	if wd != nil && cd != nil {
		r.add(&Row{ID: "11e", Name: name + "`DELETE` answered, after the first command", Stat: "p50", Unit: "s", SG: wd, Ref: cd, SGName: via, RefName: refVia, RefKind: "sync",
			Note: "target ≤ 2 ms; the reference releases the sandbox before it answers (`--teardown-queue 0`)"})
	}
	for _, body := range []string{string(restTrue), string(restBinTrue)} {
		rt, _, err := run(warm, "rtt", body)
		if err != nil {
			return err
		}
		r.add(&Row{ID: "11e", Name: name + "command round trip on an open connection, `" + body + "`", Stat: "p50", Unit: "s", SG: rt, SGName: via,
			Note: "target ≤ 1.0 ms; `true` is answered by the init without a process, `/bin/true` runs without bash's start"})
	}
	// The calls on a process that lives across calls (each registered
	// for a pause to let go of mid-call, docs/pause.md): a persistent
	// shell's command and a Python kernel's cell.
	for _, c := range []struct{ body, endpoint, note string }{
		{`{"command": "true", "shell": "main"}`, "commands", "one bash for the session's calls: the command sourced from a file, the state saved after it"},
		{`{"code": "1"}`, "python", "the session's Python kernel (started by the first call, not timed)"},
	} {
		rt, _, err := run(warm, "rtt", c.body, c.endpoint)
		if err != nil {
			return err
		}
		r.add(&Row{ID: "11e", Name: name + "call round trip on an open connection, `POST /" + c.endpoint + " " + c.body + "`", Stat: "p50", Unit: "s", SG: rt, SGName: via, Note: c.note})
	}
	return nil
}
