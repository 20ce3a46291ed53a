// Command sgbench benchmarks sandgate against a private OpenSSH sshd on the
// same machine: the same workloads, the same clients, alternating runs. It
// prints a Markdown table and writes it, with a JSON twin, to bench/results.
//
// bench/run builds and runs it; see bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/piperelay"
)

type config struct {
	quick, dryRun, keep bool
	hold                bool
	repo                string
	kubeMany            int
	soakN               int
	sandgateBin         string
	driver              string
	drivers             []string
	rows                map[string]bool
	size                int64
	reps                int
	newConnN            int
	execN               int
	keysN               int
	createN             int
	sessions            int
	latN                int
	pyN                 int
	pullReps            int   // row 8b: first pulls per way
	pullSize            int64 // row 8b: bytes of the random layer
	imageSessions       int   // row 8c: sessions on one image
	density             []int // row 13: idle sessions, one run per count
	tmpBase             string
	outDir              string
	name                string
	python              string
	self                string
	// refSandgate, when set, replaces sshd by a second sandgate binary in
	// rows 1-4, for A/B tests of a change.
	refSandgate string
	// fdpass: "auto" uses `sandgate proxy --fdpass` with ProxyUseFdpass when
	// the binary has it, "yes" requires it, "no" never uses it.
	fdpass string
	// serveArgs are extra `sandgate serve` flags for every instance.
	serveArgs []string
	// cipher and mac are forced on both sides in the equal-footing rows
	// (mac "": the cipher's own, for AEAD ciphers).
	cipher, mac string
	// scratch is where the scratch dir goes: "disk" or "tmpfs".
	scratch string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "nc" {
		os.Exit(ncMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		os.Exit(relayMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "fwdsrv" {
		os.Exit(fwdsrvMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "sftpcpu" {
		os.Exit(sftpCPUMain(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

// ncMain is `sgbench nc HOST PORT`: a plain TCP ProxyCommand written in Go,
// so that the cost of a Go proxy process (which `sandgate proxy` also is)
// can be told apart from the cost of the CONNECT hop. It moves bytes with
// the same relay as `sandgate proxy` (internal/piperelay), so sshd behind
// it pays for the very hop sandgate's copying proxy adds (rows e4e, e4f, e5e, e5f).
func ncMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sgbench nc HOST PORT")
		return 2
	}
	c, err := net.Dial("tcp", net.JoinHostPort(args[0], args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench nc:", err)
		return 1
	}
	defer c.Close()
	if handled, err := piperelay.Relay(c, os.Stdin, os.Stdout); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, "sgbench nc:", err)
			return 1
		}
		return 0
	}
	go func() {
		_, _ = io.Copy(c, os.Stdin)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(os.Stdout, c)
	return 0
}

func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("sgbench", flag.ContinueOnError)
	fs.BoolVar(&c.quick, "quick", false, "small sizes and counts (under 2 minutes)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "check tools, start both servers once, print the plan; run no workload")
	fs.BoolVar(&c.keep, "keep", false, "keep the scratch dir (logs, configs)")
	fs.BoolVar(&c.hold, "hold", false, "start both servers, print how to reach them, and wait for Ctrl-C (for profiling by hand)")
	fs.StringVar(&c.repo, "repo", ".", "sandgate repository root")
	fs.StringVar(&c.sandgateBin, "sandgate", "", "sandgate binary (default <repo>/bin/sandgate)")
	fs.StringVar(&c.driver, "sandbox", "auto", "sandbox driver for rows 1-4, 6, 7, 10: auto, workdir or linux")
	drivers := fs.String("drivers", "workdir,linux", "drivers for row 5 (create -> first command); a driver whose serve fails is skipped")
	rows := fs.String("rows", "e,1,2,3,4,5,6,7,8,9,10,11,12,13,15,16", "rows to run: e (the equal-footing rows e1-e6, also one by one) and the stock-sshd rows 1-10, 11 (sandgate only: a create's steps, warm pool vs none), 12 (sandgate only: keystroke echo, browser terminal vs SSH shell), 13 (sandgate only: Session and SandboxClaim through a real kube-apiserver, 13a-b; 13c, only when named, --kube-many Sessions per node agent), 15 (sandgate only, linux driver: pause and resume in place) and 16 (sandgate only, linux driver: idle density); not by default: 14 (the soak, --soak-sessions sessions, ~10 minutes for 10,000 on 2 cores); rows 8's, 9's, 10's and 11's parts also one by one (8a,8b,8c; 9a,9b,9c,9d,9e,9f; 10a,10b; 11a,11b,11c,11d,11e)")
	size := fs.String("size", "", "bytes per transfer in rows 3-4 and 10b and per download in row 9 (default 1GiB, quick 64MiB); suffixes KiB MiB GiB")
	fs.IntVar(&c.reps, "reps", 0, "runs per side of each transfer, rows 3, 4, 9a-c and 10b (default 3)")
	fs.IntVar(&c.newConnN, "new-conn", 0, "runs per variant of row 1 and of 10b's fixed-cost breakdown (default 30, quick 10)")
	fs.IntVar(&c.kubeMany, "kube-many", 1000, "Sessions one node agent holds at once in row 13c")
	fs.IntVar(&c.execN, "exec", 0, "execs per side in rows 2 and 10a (default 200, quick 40)")
	fs.IntVar(&c.keysN, "keys", 0, "keystrokes per side in row 12 (default 300, quick 60)")
	fs.IntVar(&c.createN, "creates", 0, "creates per driver in row 5, per way in rows 8a and 9d (default 100, quick 20)")
	density := fs.String("density", "", "idle sessions in row 13, each count a run of its own (default 100,1000; quick 100)")
	fs.IntVar(&c.sessions, "sessions", 0, "concurrent sessions in row 6 (default 1000, quick 100)")
	fs.IntVar(&c.latN, "lat", 0, "execs per side while row 6's sessions are open (default 1000, quick 40)")
	fs.IntVar(&c.soakN, "soak-sessions", 0, "sessions row 14 churns (default 10000, quick 1000)")
	fs.IntVar(&c.pyN, "paramiko", 0, "run_command calls per side in row 7 (default 100, quick 20)")
	fs.IntVar(&c.pullReps, "pull-reps", 0, "first pulls per way in row 8b (default 3, quick 1)")
	pullSize := fs.String("pull-size", "50MB", "size of row 8b's random layer; suffixes MB (10^6) KiB MiB GiB")
	fs.IntVar(&c.imageSessions, "image-sessions", 0, "sessions on one image in row 8c (default 100, quick 20)")
	fs.StringVar(&c.tmpBase, "tmpdir", "", "scratch dir parent (default: by --scratch)")
	fs.StringVar(&c.scratch, "scratch", "disk", "filesystem of the scratch dir (sshd's home, sandgate's data dir and workspaces, the client's files): disk (/var/tmp) or tmpfs (/dev/shm; results go to latest-tmpfs.md)")
	fs.StringVar(&c.cipher, "cipher", "aes128-gcm@openssh.com", "cipher forced on both sides in the equal-footing rows")
	fs.StringVar(&c.mac, "mac", "", "MAC forced on both sides in the equal-footing rows (default: none beside an AEAD cipher)")
	fs.StringVar(&c.outDir, "out", "", "results dir (default <repo>/bench/results)")
	fs.StringVar(&c.name, "name", "", "results file name without extension (default latest, latest-quick or latest-tmpfs), e.g. create-breakdown")
	fs.StringVar(&c.python, "python", "python3", "Python for row 7")
	fs.Func("serve-arg", "extra `sandgate serve` flag for every instance (repeatable), e.g. --serve-arg=--sandbox-memory=4294967296", func(v string) error {
		c.serveArgs = append(c.serveArgs, v)
		return nil
	})
	fs.StringVar(&c.fdpass, "fdpass", "auto", "use `sandgate proxy --fdpass` + ProxyUseFdpass: auto (when the binary supports it), yes, no")
	fs.StringVar(&c.refSandgate, "ref-sandgate", "", "compare against this sandgate binary instead of sshd (rows 1-4 only; for A/B tests of a change)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.scratch != "disk" && c.scratch != "tmpfs" {
		return nil, fmt.Errorf("--scratch %q: want disk or tmpfs", c.scratch)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if c.repo, err = filepath.Abs(c.repo); err != nil {
		return nil, err
	}
	if c.sandgateBin == "" {
		c.sandgateBin = filepath.Join(c.repo, "bin", "sandgate")
	}
	if c.outDir == "" {
		c.outDir = filepath.Join(c.repo, "bench", "results")
	}
	c.drivers = splitList(*drivers)
	c.rows = map[string]bool{}
	for _, r := range splitList(*rows) {
		c.rows[r] = true
	}
	def := func(p *int, full, quick int) {
		if *p <= 0 {
			*p = full
			if c.quick {
				*p = quick
			}
		}
	}
	def(&c.reps, 3, 3)
	def(&c.newConnN, 30, 10)
	def(&c.execN, 200, 40)
	def(&c.keysN, 300, 60)
	def(&c.createN, 100, 20)
	def(&c.sessions, 1000, 100)
	def(&c.latN, 1000, 40)
	def(&c.pyN, 100, 20)
	def(&c.pullReps, 3, 1)
	def(&c.imageSessions, 100, 20)
	if *density == "" {
		*density = "100,1000"
		if c.quick {
			*density = "100"
		}
	}
	for _, v := range splitList(*density) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--density %q: want counts of sessions, like 100,1000", *density)
		}
		c.density = append(c.density, n)
	}
	if c.pullSize, err = parseSize(*pullSize); err != nil {
		return nil, err
	}
	c.size = 1 << 30
	if c.quick {
		c.size = 64 << 20
	}
	if *size != "" {
		if c.size, err = parseSize(*size); err != nil {
			return nil, err
		}
	}
	if c.self, err = os.Executable(); err != nil {
		return nil, err
	}
	if c.refSandgate != "" {
		if c.refSandgate, err = filepath.Abs(c.refSandgate); err != nil {
			return nil, err
		}
		for _, r := range []string{"e", "5", "6", "7", "8", "8a", "8b", "8c", "9", "9a", "9b", "9c", "9d", "10", "10a", "10b", "10c", "11", "11a", "11b", "11c", "11d", "11e", "13", "13a", "13b", "13c", "16"} {
			delete(c.rows, r)
		}
	}
	return c, nil
}

// wantRow says whether row id runs: asked for by itself, or one of its
// parts (8a for 8), or its whole row (8 for 8a).
func (c *config) wantRow(id string) bool {
	if strings.HasPrefix(id, "e") && c.rows["e"] {
		return true
	}
	if c.rows[id] || c.rows[strings.TrimRight(id, "abcdefghijklmnopqrstuvwxyz")] {
		return true
	}
	for r := range c.rows {
		if p, ok := strings.CutPrefix(r, id); ok && p != "" && strings.Trim(p, "abcdefghijklmnopqrstuvwxyz") == "" {
			return true
		}
	}
	return false
}

// rowLess orders row ids by number, then by part: 9d before 10.
func rowLess(a, b string) bool {
	if ea, eb := strings.HasPrefix(a, "e"), strings.HasPrefix(b, "e"); ea != eb {
		return ea // the equal-footing rows first
	} else if ea {
		a, b = a[1:], b[1:]
		if a == "" || b == "" {
			return a < b
		}
	}
	na, _ := strconv.Atoi(strings.TrimRight(a, "abcdefghijklmnopqrstuvwxyz"))
	nb, _ := strconv.Atoi(strings.TrimRight(b, "abcdefghijklmnopqrstuvwxyz"))
	if na != nb {
		return na < nb
	}
	return a < b
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if v, ok := strings.CutSuffix(s, u.suf); ok {
			s, mult = v, u.m
			break
		}
	}
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// tool is something the harness runs.
type tool struct {
	name     string
	path     string
	required bool
	why      string
}

// checkTools finds the tools; missing required ones are an error naming the package.
func checkTools(c *config) ([]tool, error) {
	tools := []tool{
		{name: "ssh", required: true, why: "OpenSSH client (Debian: openssh-client)"},
		{name: "sftp", required: true, why: "OpenSSH sftp (Debian: openssh-client)"},
		{name: "scp", required: true, why: "OpenSSH scp (Debian: openssh-client)"},
		{name: "ssh-keygen", required: true, why: "key generation (Debian: openssh-client)"},
		{name: sshdPath, required: true, why: "OpenSSH server (Debian: openssh-server)"},
		{name: c.sandgateBin, required: true, why: "the gateway (make build)"},
		{name: "nc", why: "plain TCP ProxyCommand for row 1 (Debian: netcat-openbsd); the Go one is used either way"},
		{name: c.python, why: "row 7 (Paramiko)"},
	}
	var missing []string
	for i := range tools {
		p, err := exec.LookPath(tools[i].name)
		if err != nil {
			if tools[i].required {
				missing = append(missing, fmt.Sprintf("%s: %s", tools[i].name, tools[i].why))
			}
			continue
		}
		tools[i].path = p
	}
	if len(missing) > 0 {
		return tools, fmt.Errorf("missing required tools:\n  %s", strings.Join(missing, "\n  "))
	}
	return tools, nil
}

// chooseTmp is the scratch dir's parent: one filesystem for both servers'
// files (sshd's home; sandgate's data dir, where the workspace images
// live), the disk unless --scratch tmpfs.
func chooseTmp(c *config) (string, error) {
	if c.tmpBase != "" {
		return c.tmpBase, nil
	}
	if c.scratch == "tmpfs" {
		var st syscall.Statfs_t
		need := uint64(4*c.size + 1<<30)
		if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Bavail*uint64(st.Bsize) < need {
			return "", fmt.Errorf("--scratch tmpfs: /dev/shm lacks %d MiB free", need>>20)
		}
		return "/dev/shm", nil
	}
	return "/var/tmp", nil
}

func run(args []string) int {
	c, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "sgbench:", err)
		return 2
	}
	start := time.Now()
	tools, err := checkTools(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench:", err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "sgbench: must run as root: the private sshd needs /run/sshd and privilege separation, and logs in as root with its own key")
		return 1
	}
	b := &bench{cfg: c, tools: map[string]string{}}
	for _, t := range tools {
		if t.path != "" {
			b.tools[t.name] = t.path
		}
	}
	printPlan(c, b)

	parent, err := chooseTmp(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench:", err)
		return 1
	}
	tmp, err := os.MkdirTemp(parent, "sgbench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench:", err)
		return 1
	}
	b.tmp = tmp
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	b.ctx = ctx
	code := 0
	if err := b.setup(); err != nil {
		fmt.Fprintln(os.Stderr, "sgbench: setup:", err)
		code = 1
	} else if c.hold {
		b.holdOpen()
	} else if c.dryRun {
		if err := b.smoke(); err != nil {
			fmt.Fprintln(os.Stderr, "sgbench: smoke test:", err)
			code = 1
		} else {
			rest := ""
			if c.wantRow("10") {
				rest = " and one REST command on sandgate"
			}
			fmt.Printf("dry run OK in %.1fs: tools found, driver built, sandgate (%s) and sshd started, one ssh exec through each%s; no workload run.\n",
				time.Since(start).Seconds(), b.sg.driver, rest)
		}
	} else {
		code = b.runAll(start)
	}
	b.teardown()
	if p, m := cleanupLeftovers(tmp); p+m > 0 {
		fmt.Fprintf(os.Stderr, "sgbench: cleaned up %d leftover sandbox processes and %d mounts\n", p, m)
	}
	if !c.keep || c.dryRun {
		os.RemoveAll(tmp)
	} else {
		fmt.Println("scratch dir kept:", tmp)
	}
	return code
}

func printPlan(c *config, b *bench) {
	mode := "full"
	if c.quick {
		mode = "quick"
	}
	fmt.Printf("sgbench plan (%s): sandgate %s --sandbox %s vs %s, same clients, A/B alternating\n", mode, c.sandgateBin, c.driver, sshdPath)
	var rows []string
	for r := range c.rows {
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rowLess(rows[i], rows[j]) })
	desc := rowDescriptions(c)
	for _, r := range rows {
		fmt.Printf("  row %s: %s\n", r, desc[r])
	}
	var found []string
	for _, k := range []string{"ssh", "sftp", "scp", "nc", c.python} {
		if p := b.tools[k]; p != "" {
			found = append(found, p)
		} else {
			found = append(found, k+" (missing)")
		}
	}
	fmt.Printf("  tools: %s\n", strings.Join(found, ", "))
}

// rowDescriptions is what the plan says of each row, by its id.
func rowDescriptions(c *config) map[string]string {
	size := fmt.Sprintf("%d MiB", c.size>>20)
	desc := map[string]string{
		"e":  fmt.Sprintf("equal footing (headline): cipher %s both sides, sshd with a TCP_NODELAY shim, one %s filesystem: e1 new connection, e2 exec on an open connection (%d), e3 sftp put/get and e4 cat up/down of %d MiB (%d runs, sync between), e5 ssh -L up/down; sandgate both via ssh-config (fd passing) and the copying proxy; e4e-f and e5e-f: the copying proxy vs sshd behind the same hop (sgbench nc, the same relay); e6 SSH over WebSocket (`proxy --transport websocket`) vs CONNECT and vs sshd behind the same hop", c.cipher, c.scratch, c.execN, c.size>>20, c.reps),
		"e6": fmt.Sprintf("equal footing: SSH over WebSocket (`sandgate proxy --transport websocket`) vs `--transport connect` vs sshd behind the same hop, rotating: new connection + `true` (%d per way), %d MiB up `cat > /dev/null` and down `cat file` (%d runs per way, sync between)", c.newConnN, c.size>>20, c.reps),
		"1":  fmt.Sprintf("new connection + `true` with ssh, %d runs per variant (sandgate proxy; sshd direct, via nc, via Go proxy; default KEX)", c.newConnN),
		"2":  fmt.Sprintf("exec `true` over a ControlMaster connection, %d per side", c.execN),
		"3":  fmt.Sprintf("sftp put/get and scp up/down of %s, %d runs per side", size, c.reps),
		"4":  fmt.Sprintf("%s through `cat > /dev/null` and `cat file` over exec, %d runs per side", size, c.reps),
		"5":  fmt.Sprintf("session create -> first command done (Go client), %d per driver in %v; sshd: new connection + exec", c.createN, c.drivers),
		"6":  fmt.Sprintf("%d concurrent sessions with an SSH connection each: gateway RSS per session; %d execs p50/p99 while open", c.sessions, c.latN),
		"7":  fmt.Sprintf("Paramiko run_command(`true`), %d per side (SDK SessionSSHClient vs plain paramiko)", c.pyN),
		"8a": fmt.Sprintf("sandgate only: create -> first command on a cached busybox image vs `default`, %d each, alternating (linux driver)", c.createN),
		"8b": fmt.Sprintf("sandgate only: first pull of busybox + a %s random layer from a loopback registry, %d per way (create waiting for the on-demand pull; `sandgate image pull`)", sizeLabel(c.pullSize), c.pullReps),
		"8c": fmt.Sprintf("sandgate only: disk per session, %d sessions on one image (du -x of <data>/sandboxes + images/refs)", c.imageSessions),
	}
	desc["8"] = "(8a) " + desc["8a"] + "\n  row 8b: " + desc["8b"] + "\n  row 8c: " + desc["8c"]
	desc["9a"] = fmt.Sprintf("sandgate only: %s over HTTP from a loopback server, curl in a session through its egress proxy (-p: CONNECT) vs curl on the host, %d runs each, rotating (linux driver)", size, c.reps)
	desc["9b"] = fmt.Sprintf("sandgate only: the same two at `curl --limit-rate %s`, %d runs each, alternating", limitRate, c.reps)
	desc["9c"] = fmt.Sprintf("sandgate only: reference, curl on the host through a minimal Go io.Copy relay, %d runs (rotating with 9a)", c.reps)
	desc["11"] = fmt.Sprintf("sandgate only: create -> first REST command, the default `--warm-pool` (auto) vs `--warm-pool 0`, %d each, alternating (11a), and each step of the create from its Server-Timing header, p50 and p99 (11b), DELETE answered with the default background teardown vs `--teardown-queue 0` (11c), and 11a with egress, a secret and resources (11d, alternating with 11a), and the issue's plain-client check: Python http.client, creates back to back, best of 3 runs of 60, and the command round trip (11e) (linux driver)", c.createN)
	desc["9d"] = fmt.Sprintf("sandgate only: create -> first command with egress + a secret vs plain `{}`, %d each, alternating (linux driver)", c.createN)
	desc["9e"] = fmt.Sprintf("sandgate only: %s over HTTP, curl in a session with no proxy (transparent egress) vs through the explicit proxy (-p), %d runs each, rotating; target >= 0.9x (linux driver)", size, c.reps)
	desc["9f"] = fmt.Sprintf("sandgate only: first DNS answer for a new allowed name, the sandbox's resolver vs a minimal UDP responder on host loopback, %d queries each (Python client), p50/p99; target: adds <= 1 ms (linux driver)", dnsQueries)
	desc["9"] = "(9a) " + desc["9a"] + "\n  row 9b: " + desc["9b"] + "\n  row 9c: " + desc["9c"] + "\n  row 9d: " + desc["9d"] + "\n  row 9e: " + desc["9e"] + "\n  row 9f: " + desc["9f"]
	desc["10a"] = fmt.Sprintf("sandgate only: REST `POST .../commands {\"command\": \"true\"}` on one keep-alive connection vs SSH exec `true` on one open connection (Go client), same session, %d each, alternating, p50/p99; then REST alternating with a ControlMaster mux client (breakdown)", c.execN)
	desc["10b"] = fmt.Sprintf("sandgate only: %s REST PUT/GET .../files with curl vs OpenSSH sftp put/get through sandgate proxy, same session, %d runs per side, alternating", size, c.reps)
	desc["10c"] = fmt.Sprintf("%d empty files made again 1.1 s after their removal (bash over SSH exec): the session's /workspace vs sshd's home, %d runs each, alternating", remakeN, max(3, c.execN/40))
	desc["10"] = "(10a) " + desc["10a"] + "\n  row 10b: " + desc["10b"] + "\n  row 10c: " + desc["10c"]
	desc["12"] = fmt.Sprintf("sandgate only: keystroke echo (one byte typed, echoed by bash's readline on a PTY), browser terminal WebSocket GET /v1/sessions/{id}/terminal vs an SSH shell (Go client), same session, %d each, alternating, p50/p99; target: the terminal adds <= 5 ms", c.keysN)
	desc["13"] = "sandgate only: a Session's create, and a SandboxClaim's fulfilment (warm pool marked sandgate), to the first REST command, through a real kube-apiserver (internal/kubetest) and the node agent's controller (13a, 13b; kube's TestKubeBench)"
	desc["13c"] = fmt.Sprintf("sandgate only: %d Sessions held by one node agent: each create -> Running, the agent's and the API server's memory", c.kubeMany)
	desc["16"] = fmt.Sprintf("sandgate only: idle density, %v idle sessions (linux driver, no warm pool): PSS of the sandbox processes per session, and the growth of the gateway's anonymous PSS per session", c.density)
	desc["14"] = fmt.Sprintf("sandgate only: the soak, go test -run TestSoak ./cmd/sandgate/ with %d sessions (--soak-sessions) at concurrency 50: create, one REST command, DELETE (egress, image, named workspace, plain); leaks and the gateway's RSS after it (linux driver)", soakSessions(c))
	desc["15"] = "sandgate only (linux driver): POST /pause of a session whose kernel holds 100 MiB and the memory left resident (15a), first REST command on it paused vs running (15b), `ssh true` on the main session paused vs running (15c), and fork ×4 of that session to the first REST command in each fork (15d; serve --checkpoint, criu 4.x)"
	return desc
}
