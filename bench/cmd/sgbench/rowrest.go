package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// --- row 10: the REST data plane (sandgate only) -----------------------------
//
// 10a POST /v1/sessions/{id}/commands {"command": "true"} on one keep-alive
//     HTTP connection (Go net/http, reused) against an exec of `true` on a
//     new channel of one open SSH connection to the same session (the Go
//     x/crypto/ssh client of rows 5 and 6: both sides are in-process Go
//     clients, no process start), alternating. For the breakdown, REST
//     then alternates with row 2's ControlMaster mux client.
// 10b cfg.size PUT and GET .../files?path= with curl (`-T file`, `-o file`)
//     against OpenSSH sftp put/get of the same remote file in the same
//     session through `sandgate proxy` (row 3's way), alternating; the
//     local files are in the same client dir for both.
//
// Both sides are sandgate's, on the main gateway (rows 1-4's driver): the
// reference column is its own SSH/SFTP, not OpenSSH's sshd.

const restRef = "sandgate only: the reference column is sandgate's own SSH/SFTP on the same session, not sshd"

// restClient calls the gateway's REST data plane over one reused
// connection, counting the TCP connections it dials.
type restClient struct {
	g     *sandgate
	tr    *http.Transport
	http  *http.Client
	dials atomic.Int64
}

func newRESTClient(g *sandgate) *restClient {
	rc := &restClient{g: g}
	d := &net.Dialer{Timeout: 30 * time.Second}
	rc.tr = &http.Transport{
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			rc.dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
	}
	rc.http = &http.Client{Timeout: 60 * time.Second, Transport: rc.tr}
	return rc
}

func (rc *restClient) close() { rc.tr.CloseIdleConnections() }

// commandResult is the part of a CommandResult the bench checks.
type commandResult struct {
	ExitCode *int `json:"exitCode"`
}

// command runs body (a CommandRequest) with POST .../commands, reads the
// whole answer (so the connection goes back to the pool) and checks that
// the command exited 0.
func (rc *restClient) command(ctx context.Context, id string, body []byte) error {
	status, out, err := rc.postRaw(ctx, "/v1/sessions/"+id+"/commands", body)
	if err != nil {
		return err
	}
	return checkCommand(status, out)
}

// postRaw sends body (JSON) to path with POST on rc's connection and
// reads the whole answer (at most 1 MiB), so the connection goes back to
// the pool; it returns the status and the body.
func (rc *restClient) postRaw(ctx context.Context, path string, body []byte) (int, []byte, error) {
	status, out, _, err := rc.postHeader(ctx, path, body)
	return status, out, err
}

// postHeader is postRaw, with the answer's header.
func (rc *restClient) postHeader(ctx context.Context, path string, body []byte) (int, []byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rc.g.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+rc.g.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := rc.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, out, resp.Header, nil
}

// checkCommand accepts a 200 CommandResult with exitCode 0.
func checkCommand(status int, body []byte) error {
	if status != http.StatusOK {
		return fmt.Errorf("POST .../commands: %d %s", status, bytes.TrimSpace(body))
	}
	var res commandResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("POST .../commands: %w: %s", err, bytes.TrimSpace(body))
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return fmt.Errorf("POST .../commands: not exit code 0: %s", bytes.TrimSpace(body))
	}
	return nil
}

// restTrue is the body of 10a's request: `true` is a builtin of bash
// that does nothing but exit, which the linux driver's init answers
// without a process (sandbox.DirectBuiltin); SSH exec runs bash for it.
var restTrue = []byte(`{"command": "true"}`)

// restExit0 is the body of 10a's equal-footing line: `exit 0` is a
// builtin that the sandbox does not answer for (sandbox.DirectBuiltin
// takes true, : and false only), so bash runs it on both sides.
var restExit0 = []byte(`{"command": "exit 0"}`)

// restBinTrue is the body of 10a's breakdown line without the shell: a
// plain command, which a REST command runs without bash's start where bash
// would exec it (docs/architecture.md, "Commands without the shell"),
// while SSH exec runs bash, which execs it.
var restBinTrue = []byte(`{"command": "/bin/true"}`)

// restSmoke is the dry run's check of the REST data plane: one `true`.
func (b *bench) restSmoke() error {
	rc := newRESTClient(b.sg)
	defer rc.close()
	return rc.command(b.ctx, b.sess.ID, restTrue)
}

// rotateRuns runs every variant n times, rotating the order every round
// (row 1's way), after one warm-up run of each.
func rotateRuns(n int, keys []string, runs map[string]func() (float64, error)) (map[string][]float64, error) {
	for _, k := range keys {
		if _, err := runs[k](); err != nil {
			return nil, err
		}
	}
	out := map[string][]float64{}
	for i := 0; i < n; i++ {
		for j := range keys {
			k := keys[(i+j)%len(keys)]
			x, err := runs[k]()
			if err != nil {
				return nil, err
			}
			out[k] = append(out[k], x)
		}
	}
	return out, nil
}

func (b *bench) rowREST() error {
	if b.cfg.wantRow("10a") {
		if err := b.restCommands(); err != nil {
			return fmt.Errorf("10a: %w", err)
		}
	}
	if b.cfg.wantRow("10c") {
		if err := b.remakeFiles(); err != nil { // 10b runs all the same
			b.report.add(&Row{ID: "10c", Name: "files made again after their removal", Skipped: err.Error()})
		}
	}
	if b.cfg.wantRow("10b") {
		if _, err := exec.LookPath("curl"); err != nil {
			b.report.add(&Row{ID: "10b", Name: "REST file PUT/GET vs SFTP", Skipped: "curl not installed (Debian: curl)"})
			return nil
		}
		b.report.Setup = append(b.report.Setup, "row 10b: `"+firstLine(cmdOut("curl", "--version"))+"`")
		if err := b.restFiles(); err != nil {
			return fmt.Errorf("10b: %w", err)
		}
	}
	return nil
}

func (b *bench) restCommands() error {
	rc := newRESTClient(b.sg)
	defer rc.close()
	c, err := b.sg.sshClient(b.sess)
	if err != nil {
		return err
	}
	defer c.Close()
	sock, stop, err := b.startMaster("sg")
	if err != nil {
		return err
	}
	defer stop()
	since := func(f func() error) func() (float64, error) {
		return func() (float64, error) {
			t0 := time.Now()
			err := f()
			return time.Since(t0).Seconds(), err
		}
	}
	rest := since(func() error { return rc.command(b.ctx, b.sess.ID, restTrue) })
	sshExec := since(func() error { return execTrue(c) })
	mux := timed(func() (time.Duration, error) {
		return b.runClient("", "", "ssh", "-F", b.sshCfg, "-S", sock, "sg", "true")
	})
	if _, _, err := alternate(3, rest, sshExec); err != nil { // warm-up, as row 2
		return err
	}
	ra, sa, err := alternate(b.cfg.execN, rest, sshExec)
	if err != nil {
		return err
	}
	if _, _, err := alternate(3, rest, mux); err != nil {
		return err
	}
	rb, ma, err := alternate(b.cfg.execN, rest, mux)
	if err != nil {
		return err
	}
	restBin := since(func() error { return rc.command(b.ctx, b.sess.ID, restBinTrue) })
	sshBin := since(func() error { return execRun(c, "/bin/true") })
	if _, _, err := alternate(3, restBin, sshBin); err != nil {
		return err
	}
	rd, sd, err := alternate(b.cfg.execN, restBin, sshBin)
	if err != nil {
		return err
	}
	restExit := since(func() error { return rc.command(b.ctx, b.sess.ID, restExit0) })
	sshExit := since(func() error { return execRun(c, "exit 0") })
	if _, _, err := alternate(3, restExit, sshExit); err != nil {
		return err
	}
	re, se, err := alternate(b.cfg.execN, restExit, sshExit)
	if err != nil {
		return err
	}
	restS, sshS := NewStats(ra), NewStats(sa)
	name := fmt.Sprintf("command `true` on an open connection, same session, %d×: REST vs SSH exec (`%s` driver)", b.cfg.execN, b.sg.driver)
	via := "`POST /v1/sessions/{id}/commands {\"command\": \"true\"}`, Go net/http, one keep-alive connection"
	sshVia := "exec `true` on a new channel of one open SSH connection (Go x/crypto/ssh, CONNECT tunnel)"
	conns := fmt.Sprintf("REST: %d requests (warm-ups and the breakdown's included) over %d TCP connection(s)", 3*(3+b.cfg.execN), rc.dials.Load())
	r := b.report
	r.add(&Row{ID: "10a", Name: name, Stat: "p50", Unit: "s", SG: restS, Ref: sshS, SGName: via, RefKind: "SSH", RefName: sshVia,
		Note: fmt.Sprintf("%s; ratio REST/SSH, target ≤ 1.00; both are in-process Go clients; `true` is a bash builtin that does nothing but exit: the linux driver's init answers it without a process where bash's start could do nothing else (sandbox.DirectBuiltin), SSH exec runs bash (as OpenSSH does); `exit 0` below runs bash on both sides (equal footing); %s", restRef, conns)})
	r.add(&Row{ID: "10a", Name: name, Stat: "p99", Unit: "s", SG: restS, Ref: sshS, SGName: via, RefKind: "SSH", RefName: sshVia, Note: restRef})
	r.Extra = append(r.Extra,
		&Row{ID: "10a", Name: "REST `true` vs an OpenSSH ControlMaster mux client (row 2's way: an `ssh -S` process per run), alternating, after 10a", Stat: "p50", Unit: "s",
			SG: NewStats(rb), Ref: NewStats(ma), SGName: "as 10a", RefKind: "SSH", RefName: "`ssh -S sock sg true`",
			Note: "the mux client's process start dominates its side; 10a compares like with like"},
		&Row{ID: "10a", Name: "`/bin/true` on an open connection, alternating, after 10a: REST, which runs a plain command without bash's start, vs SSH exec, which runs bash (as OpenSSH does) and bash execs it", Stat: "p50", Unit: "s",
			SG: NewStats(rd), Ref: NewStats(sd), SGName: "`POST .../commands {\"command\": \"/bin/true\"}`, as 10a", RefKind: "SSH", RefName: "exec `/bin/true`, as 10a",
			Note: "not equal footing: the REST side skips the shell's start (serve --command-shell turns that off); `exit 0` runs bash on both sides"},
		&Row{ID: "10a", Name: "`exit 0` on an open connection, alternating, after 10a: a builtin that REST does not answer for, so bash runs on both sides (equal footing)", Stat: "p50", Unit: "s",
			SG: NewStats(re), Ref: NewStats(se), SGName: "`POST .../commands {\"command\": \"exit 0\"}`, as 10a", RefKind: "SSH", RefName: "exec `exit 0`, as 10a",
			Note: restRef})
	return nil
}

// cpuLog holds CPU seconds per run: the gateway's process tree (its
// sandboxes' processes included, row 3's accounting) and the client's.
type cpuLog struct{ server, client []float64 }

func (l *cpuLog) medians() (float64, float64) {
	return NewStats(l.server).Median, NewStats(l.client).Median
}

// withCPU times run and logs the CPU it cost on both sides. Before each
// run (untimed) it syncs, so that a run does not pay for the writeback of
// the gigabyte the run before it wrote into the workspace (an ext4 image
// on a loop device: dirty pages pile up over runs).
func (b *bench) withCPU(l *cpuLog, run func() (time.Duration, error)) func() (float64, error) {
	return func() (float64, error) {
		syscall.Sync()
		pid := b.sg.pid()
		before := pidSet(descendants(pid))
		c0 := treeCPU(pid)
		d, err := run()
		client := b.lastClientCPU
		settle(pid, before, 2*time.Second)
		l.server = append(l.server, treeCPU(pid)-c0)
		l.client = append(l.client, client)
		return d.Seconds(), err
	}
}

// fileEntry is the part of a FileEntry the bench checks.
type fileEntry struct {
	SizeBytes int64 `json:"sizeBytes"`
}

// checkPut checks a PUT's FileEntry answer in path and removes it.
func checkPut(path string, want int64) error {
	body, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_ = os.Remove(path)
	var e fileEntry
	if err := json.Unmarshal(body, &e); err != nil {
		return fmt.Errorf("PUT answer: %w: %s", err, bytes.TrimSpace(body))
	}
	if e.SizeBytes != want {
		return fmt.Errorf("PUT wrote %d bytes, want %d", e.SizeBytes, want)
	}
	return nil
}

func (b *bench) restFiles() error {
	local, err := b.makeBigFile()
	if err != nil {
		return err
	}
	remote := b.remote("sg")
	down := filepath.Join(b.client, "down.bin")
	answer := filepath.Join(b.client, "put.json")
	fileURL := fmt.Sprintf("%s/v1/sessions/%s/files?path=%s", b.sg.url, b.sess.ID, url.QueryEscape(remote))
	curl := func(args ...string) (time.Duration, error) {
		// -q: no ~/.curlrc; -f: an HTTP error fails the run.
		return b.runClient("", "", "curl", append([]string{"-q", "-sS", "-f", "--max-time", "600",
			"-H", "Authorization: Bearer " + b.sg.token}, args...)...)
	}
	var putCPU, sftpUpCPU, getCPU, sftpDownCPU cpuLog
	up := map[string]func() (float64, error){
		"rest": b.withCPU(&putCPU, func() (time.Duration, error) {
			d, err := curl("-o", answer, "-T", local, fileURL)
			if err == nil {
				err = checkPut(answer, b.cfg.size)
			}
			return d, err
		}),
		"sftp": b.withCPU(&sftpUpCPU, func() (time.Duration, error) {
			return b.sftpBatch("sg", fmt.Sprintf("put %s %s", local, remote))
		}),
	}
	get := map[string]func() (float64, error){
		"rest": b.withCPU(&getCPU, func() (time.Duration, error) {
			d, err := curl("-o", down, fileURL)
			if err == nil {
				err = b.checkLocal(down)
			}
			return d, err
		}),
		"sftp": b.withCPU(&sftpDownCPU, func() (time.Duration, error) {
			d, err := b.sftpBatch("sg", fmt.Sprintf("get %s %s", remote, down))
			if err == nil {
				err = b.checkLocal(down)
			}
			return d, err
		}),
	}
	// One warm-up each (the first write into a fresh workspace allocates
	// its blocks), then alternating, as row 3.
	for _, m := range []map[string]func() (float64, error){up, get} {
		for _, k := range []string{"rest", "sftp"} {
			if _, err := m[k](); err != nil {
				return err
			}
		}
	}
	for _, l := range []*cpuLog{&putCPU, &sftpUpCPU, &getCPU, &sftpDownCPU} {
		*l = cpuLog{}
	}
	pa, pb, err := alternate(b.cfg.reps, up["rest"], up["sftp"])
	if err != nil {
		return err
	}
	if err := b.checkRemote("sg"); err != nil {
		return err
	}
	ga, gb, err := alternate(b.cfg.reps, get["rest"], get["sftp"])
	if err != nil {
		return err
	}
	// What each side's runs pay besides the bytes: a new SSH connection +
	// SFTP start for sftp, a process and a TCP connection for curl.
	fixed, err := rotateRuns(b.cfg.newConnN, []string{"rest", "sftp"}, map[string]func() (float64, error){
		"rest": timed(func() (time.Duration, error) { return curl("-o", "/dev/null", "-r", "0-0", fileURL) }),
		"sftp": timed(func() (time.Duration, error) { return b.sftpBatch("sg", "pwd") }),
	})
	if err != nil {
		return err
	}

	size := b.sizeName()
	mbps := func(xs []float64) float64 { return float64(b.cfg.size) / NewStats(xs).Median / 1e6 }
	note := func(a, c []float64, ra, rc *cpuLog) string {
		as, ac := ra.medians()
		ss, sc := rc.medians()
		return fmt.Sprintf("%s; MB/s REST/SFTP = %.2f (target ≥ 0.90); CPU s per run, server / client side: REST %.2f / %.2f, SFTP %.2f / %.2f",
			restRef, mbps(a)/mbps(c), as, ac, ss, sc)
	}
	sftpVia := func(op string) string {
		return "OpenSSH `sftp` " + op + " through " + b.proxyVia() + ", a new SSH connection per run (row 3's way)"
	}
	r := b.report
	r.add(&Row{ID: "10b", Name: fmt.Sprintf("%s upload: REST `PUT .../files` vs sftp put, same session (`%s` driver)", size, b.sg.driver), Stat: "median", Unit: "s",
		SG: NewStats(pa), Ref: NewStats(pb), Bytes: b.cfg.size, SGName: "`curl -T FILE URL`", RefKind: "SFTP", RefName: sftpVia("put"),
		Note: note(pa, pb, &putCPU, &sftpUpCPU)})
	r.add(&Row{ID: "10b", Name: fmt.Sprintf("%s download: REST `GET .../files` vs sftp get, same session (`%s` driver)", size, b.sg.driver), Stat: "median", Unit: "s",
		SG: NewStats(ga), Ref: NewStats(gb), Bytes: b.cfg.size, SGName: "`curl -o FILE URL`", RefKind: "SFTP", RefName: sftpVia("get"),
		Note: note(ga, gb, &getCPU, &sftpDownCPU)})
	r.Extra = append(r.Extra,
		&Row{ID: "10b", Name: "… the fixed cost in each 10b run, next to nothing transferred", Stat: "median", Unit: "s",
			SG: NewStats(fixed["rest"]), Ref: NewStats(fixed["sftp"]), SGName: "`curl -r 0-0 URL`: a 1-byte GET (curl's start, a TCP connection, the request's own start-up in the gateway)", RefKind: "SFTP", RefName: "`sftp -b` with `pwd`: a new SSH connection + SFTP start",
			Note: "rotating, after the transfers; both are inside 10b's times"})
	return nil
}

// proxyVia names how OpenSSH reaches the main gateway.
func (b *bench) proxyVia() string {
	if b.fdpass {
		return "`sandgate proxy --fdpass`"
	}
	return "`sandgate proxy`"
}

// remakeScript makes remakeN empty files in a new dir of $HOME, removes
// them, waits 1.1 s and makes them again in a dir of the same name, and
// prints both rounds' seconds. ext4 without a journal passes over each
// inode freed in the last minutes at every new one, looking it up: the
// second round pays for the first's removal (a build's clean, a
// reinstall of node_modules).
const remakeN = 3000

var remakeScript = fmt.Sprintf(`set -e; export LC_ALL=C; d="$HOME/sgbench-remake"; rm -rf "$d"
[ -n "$EPOCHREALTIME" ] || { echo "bash without EPOCHREALTIME (bash 5 has it)" >&2; exit 3; }
mk() { mkdir "$d"; cd "$d"; local i=0; while [ $i -lt %d ]; do : > f$i; i=$((i+1)); done; cd ..; }
t0=$EPOCHREALTIME; mk; t1=$EPOCHREALTIME; rm -rf "$d"; sleep 1.1
t2=$EPOCHREALTIME; mk; t3=$EPOCHREALTIME; rm -rf "$d"
echo "$t0 $t1 $t2 $t3"`, remakeN)

// remakeFiles is row 10c: remakeScript in the session's /workspace (an
// ext4 image of the linux driver's) and in sshd's home on the scratch
// dir's filesystem, over one open SSH connection each, alternating.
func (b *bench) remakeFiles() error {
	c, err := b.sg.sshClient(b.sess)
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := b.sd.sshClient()
	if err != nil {
		return err
	}
	defer d.Close()
	var firstSG, firstSD []float64
	run := func(c *ssh.Client, first *[]float64) func() (float64, error) {
		return func() (float64, error) {
			s, err := c.NewSession()
			if err != nil {
				return 0, err
			}
			defer s.Close()
			var stderr strings.Builder
			s.Stderr = &stderr
			out, err := s.Output("bash -c '" + strings.ReplaceAll(remakeScript, "'", `'\''`) + "'")
			if err != nil {
				return 0, fmt.Errorf("remake: %w: %s", err, strings.TrimSpace(stderr.String()))
			}
			var t [4]float64
			if _, err := fmt.Sscan(string(out), &t[0], &t[1], &t[2], &t[3]); err != nil {
				return 0, fmt.Errorf("remake: output %q: %w", out, err)
			}
			*first = append(*first, t[1]-t[0])
			return t[3] - t[2], nil
		}
	}
	n := max(3, b.cfg.execN/40)
	sa, sb, err := alternate(n, run(c, &firstSG), run(d, &firstSD))
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%d empty files made again 1.1 s after they were removed (a build's clean, a reinstall), bash loop over SSH exec", remakeN)
	r := b.report
	r.add(&Row{ID: "10c", Name: name, Stat: "median", Unit: "s", SG: NewStats(sa), Ref: NewStats(sb),
		SGName:  "in the session's /workspace (`" + b.sg.driver + "` driver: with linux, an ext4 image with a journal on a loop device)",
		RefKind: "SSH", RefName: "in sshd's home, on the scratch dir's filesystem (" + b.report.Machine.TmpFS + ")",
		Note: "not equal footing: each side's own filesystem. ext4 without a journal passes over each inode freed in the last minutes at every new inode, looking it up; the workspace's has one. The reference pays that walk only on a host filesystem without a journal"})
	r.Extra = append(r.Extra, &Row{ID: "10c", Name: fmt.Sprintf("… the first round: %d empty files made in a new dir", remakeN), Stat: "median", Unit: "s",
		SG: NewStats(firstSG), Ref: NewStats(firstSD), SGName: "as 10c", RefKind: "SSH", RefName: "as 10c"})
	return nil
}
