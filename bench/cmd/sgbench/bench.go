package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// bench holds what every row shares: the servers, the client config, the
// scratch dir and the report.
type bench struct {
	cfg   *config
	ctx   context.Context
	tools map[string]string
	tmp   string

	sg      *sandgate // main instance, rows 1-4, 5 (its driver), 7
	sess    *session  // main session
	sd      *sshd
	sdEq    *sshd  // equal footing: TCP_NODELAY shim, ssh -L allowed
	shim    string // the TCP_NODELAY shim (LD_PRELOAD)
	others  []*sandgate
	sshCfg  string
	env     []string // client environment
	client  string   // client scratch dir
	report  *Report
	bigFile string

	ref     *sandgate // --ref-sandgate: stands in for sshd in rows 1-4
	refSess *session

	lastClientCPU float64 // user+sys seconds of the last runClient, its children included
	fdpass        bool    // sg hosts use `sandgate proxy --fdpass` and ProxyUseFdpass
	ws            bool    // the binary's proxy has --transport websocket (row e6)
}

// proxySupportsWebSocket asks the binary whether its proxy has
// --transport websocket.
func proxySupportsWebSocket(bin string) bool {
	out, _ := exec.Command(bin, "proxy", "-h").CombinedOutput()
	return bytes.Contains(out, []byte("-transport")) && bytes.Contains(out, []byte("websocket"))
}

// proxySupportsFdpass asks the binary whether its proxy has --fdpass.
func proxySupportsFdpass(bin string) bool {
	out, _ := exec.Command(bin, "proxy", "-h").CombinedOutput()
	return bytes.Contains(out, []byte("-fdpass"))
}

func (b *bench) setup() error {
	c := b.cfg
	b.client = filepath.Join(b.tmp, "client")
	if err := os.MkdirAll(filepath.Join(b.client, "home"), 0o700); err != nil {
		return err
	}
	var err error
	if b.sd, err = prepareSSHD(filepath.Join(b.tmp, "sshd"), sshdOpts{}); err != nil {
		return err
	}
	if err := b.sd.start(); err != nil {
		return err
	}
	if c.wantRow("e") || wantAnyE(c) {
		if err := b.setupEqual(); err != nil {
			return err
		}
	}
	if b.sg, err = startSandgate(c.sandgateBin, filepath.Join(b.tmp, "sandgate"), c.driver, c.serveArgs); err != nil {
		return err
	}
	if b.sess, err = b.sg.create(b.ctx); err != nil {
		return err
	}
	if c.refSandgate != "" {
		if b.ref, err = startSandgate(c.refSandgate, filepath.Join(b.tmp, "sandgate-ref"), c.driver, c.serveArgs); err != nil {
			return err
		}
		if b.refSess, err = b.ref.create(b.ctx); err != nil {
			return err
		}
	}
	switch c.fdpass {
	case "yes":
		if !proxySupportsFdpass(c.sandgateBin) {
			return fmt.Errorf("--fdpass yes: %s proxy has no --fdpass", c.sandgateBin)
		}
		b.fdpass = true
	case "auto":
		b.fdpass = proxySupportsFdpass(c.sandgateBin)
	}
	b.ws = proxySupportsWebSocket(c.sandgateBin)
	b.env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(b.client, "home"),
		"LANG=C.UTF-8",
		"SANDBOX_API_URL=" + b.sg.url,
		"SANDBOX_API_TOKEN=" + b.sg.token,
	}
	return b.writeSSHConfig()
}

// writeSSHConfig writes the OpenSSH client config every row uses, one Host
// per way in. ssh_config keeps the first value it sees, so specific blocks
// come before `Host *`.
func (b *bench) writeSSHConfig() error {
	khSG := filepath.Join(b.client, "known_hosts_sandgate")
	khSD := filepath.Join(b.client, "known_hosts_sshd")
	if err := os.WriteFile(khSG, []byte(b.sess.KHLine+"\n"), 0o600); err != nil {
		return err
	}
	hk := strings.TrimSpace(string(sshMarshal(b.sd.hostKey)))
	kh := fmt.Sprintf("[localhost]:%d %s\n[127.0.0.1]:%d %s\nsshd-bench %s\n", b.sd.port, hk, b.sd.port, hk, hk)
	if err := os.WriteFile(khSD, []byte(kh), 0o600); err != nil {
		return err
	}
	nc := b.tools["nc"]
	var s strings.Builder
	kex := "  KexAlgorithms curve25519-sha256\n"
	sgStdio := func(name, extra string) {
		fmt.Fprintf(&s, "Host %s\n  HostName %s\n  User sandbox\n  ProxyCommand %s proxy %%h\n  UserKnownHostsFile %s\n%s", name, b.sess.ID, b.cfg.sandgateBin, khSG, extra)
	}
	sg := sgStdio
	if b.fdpass {
		sg = func(name, extra string) {
			fmt.Fprintf(&s, "Host %s\n  HostName %s\n  User sandbox\n  ProxyCommand %s proxy --fdpass %%h\n  ProxyUseFdpass yes\n  UserKnownHostsFile %s\n%s", name, b.sess.ID, b.cfg.sandgateBin, khSG, extra)
		}
		sgStdio("sg-stdio", kex)
	}
	// sshd is reached by name, as sandgate is (its HostName is the session
	// id): OpenSSH's client does name-only work for a named host at every
	// start (getservbyname through NSS here, ~0.2 ms), which would
	// otherwise land on sandgate's side of row 2 alone. IPv4 only, as sshd
	// listens on 127.0.0.1.
	sd := func(name, extra string) {
		fmt.Fprintf(&s, "Host %s\n  HostName localhost\n  AddressFamily inet\n  Port %d\n  User root\n  UserKnownHostsFile %s\n%s", name, b.sd.port, khSD, extra)
	}
	sg("sg", kex)
	sg("sg-defkex", "")
	if b.ref != nil {
		khRef := filepath.Join(b.client, "known_hosts_ref")
		if err := os.WriteFile(khRef, []byte(b.refSess.KHLine+"\n"), 0o600); err != nil {
			return err
		}
		fd, extra := "", kex
		if b.fdpass && proxySupportsFdpass(b.cfg.refSandgate) {
			fd, extra = "--fdpass ", kex+"  ProxyUseFdpass yes\n"
		}
		fmt.Fprintf(&s, "Host sshd\n  HostName %s\n  User sandbox\n  ProxyCommand %s proxy %s--api-url %s --token %s %%h\n  UserKnownHostsFile %s\n%s",
			b.refSess.ID, b.cfg.refSandgate, fd, b.ref.url, b.ref.token, khRef, extra)
	} else {
		sd("sshd", kex)
	}
	sd("sshd-defkex", "")
	s.WriteString(b.eqHosts(khSG))
	if nc != "" {
		sd("sshd-nc", kex+"  HostKeyAlias sshd-bench\n  ProxyCommand "+nc+" %h %p\n")
	}
	sd("sshd-go", kex+"  HostKeyAlias sshd-bench\n  ProxyCommand "+b.cfg.self+" nc %h %p\n")
	fmt.Fprintf(&s, `Host *
  BatchMode yes
  StrictHostKeyChecking yes
  GlobalKnownHostsFile /dev/null
  UpdateHostKeys no
  IdentitiesOnly yes
  IdentityFile %s
  LogLevel ERROR
  ControlMaster no
  ControlPath none
  Compression no
  ForwardAgent no
  ForwardX11 no
  ServerAliveInterval 0
  ConnectTimeout 30
`, b.sd.clientKey)
	b.sshCfg = filepath.Join(b.client, "ssh_config")
	return os.WriteFile(b.sshCfg, []byte(s.String()), 0o600)
}

func (b *bench) teardown() {
	for _, g := range b.others {
		g.stop()
	}
	b.sg.stop()
	b.ref.stop()
	b.sd.stop()
	b.sdEq.stop()
}

// runClient runs an OpenSSH client (or any command) with the client
// environment; stdin/stdout are file paths, "" meaning /dev/null.
func (b *bench) runClient(stdin, stdout string, name string, args ...string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = b.env
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	if stdin != "" {
		f, err := os.Open(stdin)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		cmd.Stdin = f
	}
	if stdout != "" {
		f, err := os.Create(stdout)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		cmd.Stdout = f
	}
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	b.lastClientCPU = 0
	if cmd.ProcessState != nil {
		// wait4 reports the child's usage together with the descendants it
		// reaped: ssh plus its ProxyCommand, sftp/scp plus their ssh.
		b.lastClientCPU = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	if err != nil {
		msg := strings.TrimSpace(errBuf.String())
		if len(msg) > 400 {
			msg = msg[:400]
		}
		return d, fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, msg)
	}
	return d, nil
}

func (b *bench) ssh(host string, args ...string) (time.Duration, error) {
	return b.runClient("", "", "ssh", append([]string{"-F", b.sshCfg, host}, args...)...)
}

// smoke is the dry run's check that both servers answer the real clients
// (and, for row 10, that sandgate's REST data plane runs a command).
func (b *bench) smoke() error {
	hosts := []string{"sg", "sshd"}
	if b.sdEq != nil {
		hosts = append(hosts, "sg-eq", "sg-eq-stdio", "sshd-eq", hopHost)
		if b.ws {
			hosts = append(hosts, wsHost)
		}
	}
	for _, h := range hosts {
		if _, err := b.ssh(h, "true"); err != nil {
			return fmt.Errorf("ssh %s: %w", h, err)
		}
	}
	c, err := b.sg.sshClient(b.sess)
	if err != nil {
		return fmt.Errorf("go ssh client via tunnel: %w", err)
	}
	defer c.Close()
	if err := execTrue(c); err != nil {
		return err
	}
	d, err := b.sd.sshClient()
	if err != nil {
		return fmt.Errorf("go ssh client to sshd: %w", err)
	}
	defer d.Close()
	if err := execTrue(d); err != nil {
		return err
	}
	if b.cfg.wantRow("10") {
		if err := b.restSmoke(); err != nil {
			return fmt.Errorf("REST command: %w", err)
		}
	}
	return nil
}

func (b *bench) proxyDesc() string {
	if b.fdpass {
		return "`ProxyCommand sandgate proxy --fdpass %h` + `ProxyUseFdpass yes` (the proxy hands ssh the tunnelled socket and exits)"
	}
	return "`ProxyCommand sandgate proxy %h` (the proxy copies stdin/stdout to the tunnel)"
}

// holdOpen prints how to reach both servers and waits for a signal.
func (b *bench) holdOpen() {
	env := strings.Join(b.env[3:], " ")
	fmt.Printf("servers up. sandgate pid %d (%s), session %s; sshd pid %d on %s\n", b.sg.pid(), b.sg.url, b.sess.ID, b.sd.pid(), b.sd.addr())
	fmt.Printf("  env %s ssh -F %s sg true\n", env, b.sshCfg)
	fmt.Printf("  env %s ssh -F %s sshd true\n", env, b.sshCfg)
	fmt.Printf("  remote dirs: sandgate %s/data/sessions/%s, sshd %s\n", b.sg.dir, b.sess.ID, b.sd.home)
	fmt.Println("Ctrl-C (SIGINT/SIGTERM) to stop.")
	<-b.ctx.Done()
}

var kexRE = regexp.MustCompile(`debug1: kex: (algorithm|server->client cipher): (\S+)`)

// negotiated reports the KEX and cipher an ssh to host settles on.
func (b *bench) negotiated(host string) string {
	cmd := exec.Command("ssh", "-v", "-F", b.sshCfg, "-o", "LogLevel=DEBUG1", host, "true")
	cmd.Env = b.env
	out, _ := cmd.CombinedOutput()
	var parts []string
	for _, m := range kexRE.FindAllStringSubmatch(string(out), -1) {
		parts = append(parts, m[2])
	}
	return strings.Join(parts, ", ")
}

type rowFunc struct {
	id string
	fn func() error
}

func (b *bench) runAll(start time.Time) int {
	c := b.cfg
	mode := "full"
	if c.quick {
		mode = "quick"
	}
	b.report = &Report{Started: start, Mode: mode, Driver: b.sg.driver, RefLabel: "sshd"}
	if len(c.serveArgs) > 0 {
		b.report.note("extra `sandgate serve` flags: %s", strings.Join(c.serveArgs, " "))
	}
	if b.ref != nil {
		b.report.RefLabel = "ref sandgate"
		b.report.note("--ref-sandgate %s: the sshd column is that second sandgate (A/B test of a change), not OpenSSH", c.refSandgate)
	}
	b.report.Machine = machineInfo(c.sandgateBin, c.repo, c.python, b.tmp)
	r := b.report
	r.Setup = append(r.Setup,
		fmt.Sprintf("sandgate: `sandgate serve --sandbox %s --rate-limit 0 --idle-timeout 0` (log level info, to a file); OpenSSH reaches it with %s; SSH auth `none` on the authorised tunnel", b.sg.driver, b.proxyDesc()),
		fmt.Sprintf("sshd: Debian's `%s -D -e -f <tmp>/sshd_config`, 127.0.0.1 only, own host key, root login by ed25519 key, `UsePAM no`, `Subsystem sftp internal-sftp`, `HOME` set (SetEnv) to a dir with an empty .bashrc so bash -c does not run root's rc (both servers set SSH_CLIENT, so Debian's bash reads /etc/bash.bashrc and ~/.bashrc on both sides; the sandbox's workspace has no .bashrc), and `LANG=C.UTF-8` as in sandgate's sandbox environment (loading the locale costs bash ~0.2 ms per start)", sshdPath),
		"clients: the same OpenSSH `ssh`/`sftp`/`scp` with one `-F` config for both; both hosts are named (sandgate by its session id, sshd as `localhost`, IPv4), as the client does extra work for a named host at every start; `KexAlgorithms curve25519-sha256` pinned on both sides except in row 1d; ciphers are the client's defaults",
		fmt.Sprintf("negotiated: sandgate `%s`; sshd `%s`; default KEX: sandgate `%s`, sshd `%s`",
			b.negotiated("sg"), b.negotiated("sshd"), b.negotiated("sg-defkex"), b.negotiated("sshd-defkex")),
		"Go client rows (5, 6, 10a): golang.org/x/crypto/ssh with curve25519-sha256, auth none on sandgate's tunnel and an ed25519 key on sshd",
	)
	if b.sdEq != nil {
		var neg string
		err := b.eqEnv(func() (err error) { neg, err = b.checkEqual(); return err })
		if err != nil {
			fmt.Fprintln(os.Stderr, "sgbench: equal footing:", err)
			return 1
		}
		r.Setup = append(r.Setup,
			fmt.Sprintf("**equal footing (rows e1-e5, the headline)**: %s, forced by the client config (`Ciphers`%s) and checked: %s. sshd (a second instance, same config plus `AllowTcpForwarding local`) runs with `LD_PRELOAD` of a TCP_NODELAY shim built here with cc (setsockopt after accept/accept4 and before connect on TCP sockets). The OpenSSH clients get the same shim in these rows (with fd passing, ssh's socket to sandgate is the proxy's, NODELAY already). Both write to one filesystem, the scratch dir's (%s): sshd's home and sandgate's data dir, where the linux driver's workspace images live. Transfers run `sync` (untimed) before every run. Rows e4e, e4f, e5e and e5f compare the copying proxy with the same sshd reached through `ProxyCommand sgbench nc %%h %%p`, which relays with the very code of `sandgate proxy` (internal/piperelay): the same hop on both sides, to show what the hop itself costs; the target rows are e4c, e4d, e5c and e5d. Row e6 puts sandgate's WebSocket transport (`ProxyCommand sandgate proxy --transport websocket %%h`) beside its CONNECT transport and beside that same sshd hop, the three rotating", b.eqLabel(), map[bool]string{true: ", `MACs`", false: ""}[c.mac != ""], neg, b.report.Machine.TmpFS),
		)
	}
	rows := []rowFunc{
		{"e12", func() error { return b.eqEnv(b.rowEqConn) }},
		{"e34", func() error { return b.eqEnv(b.rowEqData) }},
		{"e5", func() error { return b.eqEnv(b.rowEqForward) }},
		{"e6", func() error { return b.eqEnv(b.rowEqWebSocket) }},
		{"1", b.rowNewConn},
		{"2", b.rowControlMaster},
		{"3", b.rowSFTP},
		{"4", b.rowCat},
		{"5", b.rowCreate},
		{"6", b.rowMany},
		{"7", b.rowParamiko},
		{"8", b.rowImages},
		{"9", b.rowEgress},
		{"10", b.rowREST},
		{"11", b.rowCreateTrace},
		{"12", b.rowKeystroke},
		{"13", b.rowKube},
		{"15", b.rowPause},
		{"16", b.rowDensity},
		{"14", b.rowSoak},
	}
	for _, row := range rows {
		if !b.wantGroup(row.id) {
			continue
		}
		if b.ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		fmt.Printf("row %s ...", row.id)
		if err := row.fn(); err != nil {
			fmt.Printf(" failed: %v\n", err)
			r.add(&Row{ID: row.id, Name: "row " + row.id, Skipped: err.Error()})
			continue
		}
		fmt.Printf(" done in %.1fs\n", time.Since(t0).Seconds())
	}
	r.Machine.LoadEnd = loadavg()
	r.Duration = time.Since(start).Round(time.Second).String()
	r.finish()
	md := r.Markdown()
	fmt.Println()
	fmt.Println(md)
	base := "latest"
	if c.quick {
		base = "latest-quick"
	}
	if c.scratch == "tmpfs" && c.tmpBase == "" {
		base += "-tmpfs"
	}
	if c.name != "" {
		base = c.name
	}
	mdPath, jsPath, err := r.Write(c.outDir, base)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench: write results:", err)
		return 1
	}
	fmt.Printf("wrote %s and %s\n", mdPath, jsPath)
	return 0
}

// wantAnyE says whether any equal-footing row runs.
func wantAnyE(c *config) bool {
	for _, id := range []string{"e1", "e2", "e3", "e4", "e5", "e6"} {
		if c.wantRow(id) {
			return true
		}
	}
	return false
}

// wantGroup says whether a row function runs: "e12" runs e1 and e2,
// "e34" e3 and e4.
func (b *bench) wantGroup(id string) bool {
	switch id {
	case "e12":
		return b.sdEq != nil && (b.cfg.wantRow("e1") || b.cfg.wantRow("e2"))
	case "e34":
		return b.sdEq != nil && (b.cfg.wantRow("e3") || b.cfg.wantRow("e4"))
	case "e5":
		return b.sdEq != nil && b.cfg.wantRow("e5")
	case "e6":
		return b.sdEq != nil && b.cfg.wantRow("e6")
	}
	return b.cfg.wantRow(id)
}
