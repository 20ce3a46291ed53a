package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
)

func sshMarshal(k ssh.PublicKey) []byte { return ssh.MarshalAuthorizedKey(k) }

// execTrue runs `true` on a new session channel of c.
func execTrue(c *ssh.Client) error { return execRun(c, "true") }

// execRun runs command on a new channel of c.
func execRun(c *ssh.Client, command string) error {
	s, err := c.NewSession()
	if err != nil {
		return fmt.Errorf("new session: %w", err)
	}
	defer s.Close()
	if err := s.Run(command); err != nil {
		return fmt.Errorf("exec %s: %w", command, err)
	}
	return nil
}

// alternate runs a and b n times each, flipping the order every round so
// that neither side always goes first.
func alternate(n int, a, b func() (float64, error)) (sa, sb []float64, err error) {
	for i := 0; i < n; i++ {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		x, err := first()
		if err != nil {
			return sa, sb, err
		}
		y, err := second()
		if err != nil {
			return sa, sb, err
		}
		if i%2 == 1 {
			x, y = y, x
		}
		sa, sb = append(sa, x), append(sb, y)
	}
	return sa, sb, nil
}

func timed(f func() (time.Duration, error)) func() (float64, error) {
	return func() (float64, error) {
		d, err := f()
		return d.Seconds(), err
	}
}

// --- row 1: new connection + true ---------------------------------------

// newConnSamples times newConnN `ssh host true` runs per host, rotating
// the hosts' order each round, after one warm-up each (page cache, host
// key files): seconds by host.
func (b *bench) newConnSamples(hosts []string) (map[string][]float64, error) {
	for _, h := range hosts {
		if _, err := b.ssh(h, "true"); err != nil {
			return nil, err
		}
	}
	samples := map[string][]float64{}
	for i := 0; i < b.cfg.newConnN; i++ {
		for j := range hosts {
			h := hosts[(i+j)%len(hosts)]
			d, err := b.ssh(h, "true")
			if err != nil {
				return nil, err
			}
			samples[h] = append(samples[h], d.Seconds())
		}
	}
	return samples, nil
}

func (b *bench) rowNewConn() error {
	hosts := []string{"sg", "sshd", "sshd-go", "sg-defkex", "sshd-defkex"}
	if b.ref != nil {
		hosts = hosts[:2]
	} else if b.tools["nc"] != "" {
		hosts = append(hosts, "sshd-nc")
	}
	if b.fdpass && b.ref == nil {
		hosts = append(hosts, "sg-stdio")
	}
	samples, err := b.newConnSamples(hosts)
	if err != nil {
		return err
	}
	sg := NewStats(samples["sg"])
	via := "sandgate proxy"
	if b.fdpass {
		via = "sandgate proxy --fdpass"
	}
	r := b.report
	if b.ref != nil {
		r.add(&Row{ID: "1a", Name: "new connection + `true` (ssh)", Stat: "median", Unit: "s", SG: sg, Ref: NewStats(samples["sshd"])})
		return nil
	}
	r.add(&Row{ID: "1a", Name: "new connection + `true` (ssh)", Stat: "median", Unit: "s", SG: sg, Ref: NewStats(samples["sshd"]),
		SGName: "ProxyCommand " + via, RefName: "direct TCP",
		Note: "OpenSSH turns TCP_NODELAY on only once a session starts, so small handshake packets wait for delayed ACKs (~40 ms each); sandgate's sockets are Go's, NODELAY from the start"})
	if s, ok := samples["sshd-nc"]; ok {
		r.add(&Row{ID: "1b", Name: "new connection + `true` (ssh)", Stat: "median", Unit: "s", SG: sg, Ref: NewStats(s),
			SGName: "ProxyCommand " + via, RefName: "ProxyCommand nc", Note: "same hop count; nc leaves Nagle on towards sshd"})
	} else {
		r.add(&Row{ID: "1b", Name: "new connection + `true` via nc", Skipped: "nc not installed (Debian: netcat-openbsd)"})
	}
	r.add(&Row{ID: "1c", Name: "new connection + `true` (ssh)", Stat: "median", Unit: "s", SG: sg, Ref: NewStats(samples["sshd-go"]),
		SGName: "ProxyCommand " + via, RefName: "ProxyCommand sgbench nc (Go TCP proxy)",
		Note: "a Go proxy (NODELAY towards sshd, same start-up cost as sandgate proxy): shows how much of sshd's time is Nagle"})
	if st, ok := samples["sg-stdio"]; ok {
		r.Extra = append(r.Extra, &Row{ID: "1x", Name: "new connection + `true`: proxy copying (no --fdpass) vs direct sshd", Stat: "median", Unit: "s",
			SG: NewStats(st), Ref: NewStats(samples["sshd"]), SGName: "ProxyCommand sandgate proxy", RefName: "direct TCP"})
	}
	r.add(&Row{ID: "1d", Name: "new connection + `true`, default KEX", Stat: "median", Unit: "s", SG: NewStats(samples["sg-defkex"]), Ref: NewStats(samples["sshd-defkex"]),
		SGName: via, RefName: "direct", Note: "OpenSSH 9.2 default KEX: sntrup761x25519 where the server has it (sshd), else curve25519"})
	return nil
}

// --- row 2: exec over ControlMaster ---------------------------------------

func (b *bench) startMaster(host string) (sock string, stop func(), err error) {
	sock = filepath.Join(b.client, "cm-"+host)
	cmd := exec.Command("ssh", "-F", b.sshCfg, "-M", "-S", sock, "-N", host)
	cmd.Env = b.env
	cmd.Stdin = nil
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = func() {
		_ = exec.Command("ssh", "-F", b.sshCfg, "-S", sock, "-O", "exit", host).Run()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(sock); err == nil {
			return sock, stop, nil
		}
		select {
		case <-done:
			return "", nil, fmt.Errorf("ControlMaster for %s exited", host)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	return "", nil, fmt.Errorf("ControlMaster for %s: no socket after 15s", host)
}

// muxExecs times execN `ssh -S sock host true` runs against a
// ControlMaster of each host, alternating, after 3 warm-ups: the
// seconds of each run on hostA and on hostB.
func (b *bench) muxExecs(hostA, hostB string) (sa, sb []float64, err error) {
	sockA, stopA, err := b.startMaster(hostA)
	if err != nil {
		return nil, nil, err
	}
	defer stopA()
	sockB, stopB, err := b.startMaster(hostB)
	if err != nil {
		return nil, nil, err
	}
	defer stopB()
	mux := func(sock, host string) func() (float64, error) {
		return timed(func() (time.Duration, error) {
			return b.runClient("", "", "ssh", "-F", b.sshCfg, "-S", sock, host, "true")
		})
	}
	a, c := mux(sockA, hostA), mux(sockB, hostB)
	if _, _, err := alternate(3, a, c); err != nil { // warm-up
		return nil, nil, err
	}
	return alternate(b.cfg.execN, a, c)
}

func (b *bench) rowControlMaster() error {
	sa, sb, err := b.muxExecs("sg", "sshd")
	if err != nil {
		return err
	}
	b.report.add(&Row{ID: "2", Name: fmt.Sprintf("exec `true` on an open connection (ControlMaster), %d×", b.cfg.execN), Stat: "median", Unit: "s",
		SG: NewStats(sa), Ref: NewStats(sb), Note: "each run is an `ssh -S` mux client process"})
	return nil
}

// --- rows 3 and 4: bulk transfers ------------------------------------------

// makeBigFile writes size pseudo-random bytes (incompressible, fast to make).
func (b *bench) makeBigFile() (string, error) {
	if b.bigFile != "" {
		return b.bigFile, nil
	}
	p := filepath.Join(b.client, "big.bin")
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	buf := make([]byte, 1<<20)
	for left := b.cfg.size; left > 0; {
		n := int64(len(buf))
		if left < n {
			n = left
		}
		_, _ = rng.Read(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return "", err
		}
		left -= n
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	b.bigFile = p
	return p, nil
}

// remote is the path of the big file on each side: relative to the sandbox
// workspace on sandgate, absolute in the sshd user's HOME.
func (b *bench) remote(host string) string {
	switch {
	case strings.HasPrefix(host, "sg") || (b.ref != nil && host == "sshd"):
		return "big.bin"
	case host == "sshd-eq", host == hopHost:
		return filepath.Join(b.sdEq.home, "big.bin")
	}
	return filepath.Join(b.sd.home, "big.bin")
}

func (b *bench) checkLocal(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.Size() != b.cfg.size {
		return fmt.Errorf("%s has %d bytes, want %d", p, st.Size(), b.cfg.size)
	}
	return os.Remove(p)
}

func (b *bench) checkRemote(host string) error {
	cmd := exec.Command("ssh", "-F", b.sshCfg, host, "stat -c %s "+b.remote(host))
	cmd.Env = b.env
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("stat remote on %s: %w", host, err)
	}
	n, _ := strconv.ParseInt(string(trimNL(out)), 10, 64)
	if n != b.cfg.size {
		return fmt.Errorf("remote file on %s has %d bytes, want %d", host, n, b.cfg.size)
	}
	return nil
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

type transfer struct {
	id, name string
	run      func(host string) (time.Duration, error)
	after    func(host string) error
	// pair is the two hosts compared (default sg, sshd).
	pair [2]string
	// sync runs sync(1), untimed, before every run, so that no run pays
	// for the writeback of the one before it.
	sync            bool
	sgName, refName string
	label           string // what the note starts with (the equal-footing cipher)
}

// serverPID is the process whose CPU time (its reaped children included)
// is the server side's cost: the gateway, or sshd's listener.
func (b *bench) serverPID(host string) int {
	switch {
	case strings.HasPrefix(host, "sg"):
		return b.sg.pid()
	case host == "sshd-eq", host == hopHost:
		return b.sdEq.pid()
	case b.ref != nil:
		return b.ref.pid()
	}
	return b.sd.pid()
}

func (b *bench) transfers(ts []transfer) error {
	for _, t := range ts {
		if t.pair[0] == "" {
			t.pair = [2]string{"sg", "sshd"}
		}
		cpu := map[string][2][]float64{}
		measure := func(h string) func() (float64, error) {
			return func() (float64, error) {
				if t.sync {
					b.eqSync()
				}
				pid := b.serverPID(h)
				before := pidSet(descendants(pid))
				c0 := treeCPU(pid)
				d, err := t.run(h)
				client := b.lastClientCPU
				settle(pid, before, 2*time.Second)
				c := cpu[h]
				c[0] = append(c[0], treeCPU(pid)-c0)
				c[1] = append(c[1], client)
				cpu[h] = c
				return d.Seconds(), err
			}
		}
		sa, sb, err := alternate(b.cfg.reps, measure(t.pair[0]), measure(t.pair[1]))
		if err != nil {
			return err
		}
		if t.after != nil {
			for _, h := range t.pair {
				if err := t.after(h); err != nil {
					return err
				}
			}
		}
		med := func(xs []float64) float64 { return NewStats(xs).Median }
		a, r := t.pair[0], t.pair[1]
		note := fmt.Sprintf("CPU s per run, server / client side (client: ssh, and its ProxyCommand only when that ends first and ssh reaps it): sandgate %.2f / %.2f, sshd %.2f / %.2f",
			med(cpu[a][0]), med(cpu[a][1]), med(cpu[r][0]), med(cpu[r][1]))
		if t.label != "" {
			note = t.label + "; " + note
		}
		b.report.add(&Row{ID: t.id, Name: t.name, Stat: "median", Unit: "s", SG: NewStats(sa), Ref: NewStats(sb), Bytes: b.cfg.size,
			SGName: t.sgName, RefName: t.refName,
			CPU: map[string]float64{"sandgateServer": med(cpu[a][0]), "sandgateClient": med(cpu[a][1]),
				"sshdServer": med(cpu[r][0]), "sshdClient": med(cpu[r][1])},
			Note: note})
	}
	return nil
}

func (b *bench) sizeName() string {
	if b.cfg.size%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", b.cfg.size>>30)
	}
	return fmt.Sprintf("%d MiB", b.cfg.size>>20)
}

// sftpBatch runs OpenSSH's sftp to host with the one batch command line.
func (b *bench) sftpBatch(host, line string) (time.Duration, error) {
	bf := filepath.Join(b.client, "batch-"+host)
	if err := os.WriteFile(bf, []byte(line+"\n"), 0o600); err != nil {
		return 0, err
	}
	return b.runClient("", "", "sftp", "-F", b.sshCfg, "-b", bf, host)
}

func (b *bench) rowSFTP() error {
	local, err := b.makeBigFile()
	if err != nil {
		return err
	}
	down := filepath.Join(b.client, "down.bin")
	batch := b.sftpBatch
	size := b.sizeName()
	return b.transfers([]transfer{
		{id: "3a", name: "sftp upload " + size, run: func(h string) (time.Duration, error) {
			return batch(h, fmt.Sprintf("put %s %s", local, b.remote(h)))
		}, after: b.checkRemote},
		{id: "3b", name: "sftp download " + size, run: func(h string) (time.Duration, error) {
			d, err := batch(h, fmt.Sprintf("get %s %s", b.remote(h), down))
			if err == nil {
				err = b.checkLocal(down)
			}
			return d, err
		}},
		{id: "3c", name: "scp upload " + size + " (SFTP protocol)", run: func(h string) (time.Duration, error) {
			return b.runClient("", "", "scp", "-F", b.sshCfg, local, h+":"+b.remote(h))
		}, after: b.checkRemote},
		{id: "3d", name: "scp download " + size + " (SFTP protocol)", run: func(h string) (time.Duration, error) {
			d, err := b.runClient("", "", "scp", "-F", b.sshCfg, h+":"+b.remote(h), down)
			if err == nil {
				err = b.checkLocal(down)
			}
			return d, err
		}},
	})
}

func (b *bench) rowCat() error {
	local, err := b.makeBigFile()
	if err != nil {
		return err
	}
	if !b.cfg.rows["3"] { // the download needs the remote file
		for _, h := range []string{"sg", "sshd"} {
			if _, err := b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > "+b.remote(h)); err != nil {
				return err
			}
		}
	}
	size := b.sizeName()
	return b.transfers([]transfer{
		{id: "4a", name: size + " up an exec channel: `cat > /dev/null`", run: func(h string) (time.Duration, error) {
			return b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > /dev/null")
		}},
		{id: "4b", name: size + " down an exec channel: `cat file`", run: func(h string) (time.Duration, error) {
			return b.runClient("", "", "ssh", "-F", b.sshCfg, h, "cat "+b.remote(h))
		}},
		{id: "4c", name: size + " up `cat > /dev/null`, both sides forced to aes128-gcm", run: func(h string) (time.Duration, error) {
			return b.runClient(local, "", "ssh", "-F", b.sshCfg, "-c", "aes128-gcm@openssh.com", h, "cat > /dev/null")
		}},
		{id: "4d", name: size + " down `cat file`, both sides forced to aes128-gcm", run: func(h string) (time.Duration, error) {
			return b.runClient("", "", "ssh", "-F", b.sshCfg, "-c", "aes128-gcm@openssh.com", h, "cat "+b.remote(h))
		}},
	})
}

// --- row 5: create -> first command ------------------------------------------

type phases struct{ create, connect, exec, total float64 }

// createFirst times POST /v1/sessions, CONNECT + SSH handshake, and exec true.
func (b *bench) createFirst(g *sandgate) (phases, error) { return b.createFirstOn(g, "") }

// createFirstOn is createFirst for a session on image ("" is the default).
func (b *bench) createFirstOn(g *sandgate, image string) (phases, error) {
	var req map[string]any
	if image != "" {
		req = map[string]any{"image": image}
	}
	return b.createFirstWith(g, req)
}

// createFirstWith is createFirst with request body req (nil: `{}`).
func (b *bench) createFirstWith(g *sandgate, req map[string]any) (phases, error) {
	var p phases
	t0 := time.Now()
	s, err := g.createWith(b.ctx, req)
	if err != nil {
		return p, err
	}
	t1 := time.Now()
	c, err := g.sshClient(s)
	if err != nil {
		g.delete(s.ID)
		return p, err
	}
	t2 := time.Now()
	err = execTrue(c)
	t3 := time.Now()
	c.Close()
	g.delete(s.ID)
	p = phases{t1.Sub(t0).Seconds(), t2.Sub(t1).Seconds(), t3.Sub(t2).Seconds(), t3.Sub(t0).Seconds()}
	return p, err
}

func (b *bench) sshdFirst() (phases, error) {
	var p phases
	t0 := time.Now()
	c, err := b.sd.sshClient()
	if err != nil {
		return p, err
	}
	t1 := time.Now()
	err = execTrue(c)
	t2 := time.Now()
	c.Close()
	return phases{0, t1.Sub(t0).Seconds(), t2.Sub(t1).Seconds(), t2.Sub(t0).Seconds()}, err
}

func (b *bench) instance(driver string) (*sandgate, error) {
	if driver == b.sg.driver {
		return b.sg, nil
	}
	for _, g := range b.others {
		if g.driver == driver {
			return g, nil
		}
	}
	g, err := startSandgate(b.cfg.sandgateBin, filepath.Join(b.tmp, "sandgate-"+driver), driver, b.cfg.serveArgs)
	if err != nil {
		return nil, err
	}
	b.others = append(b.others, g)
	if g.driver != driver {
		return nil, fmt.Errorf("serve --sandbox %s runs driver %q", driver, g.driver)
	}
	return g, nil
}

func (b *bench) rowCreate() error {
	r := b.report
	var ref []phases
	for _, drv := range b.cfg.drivers {
		g, err := b.instance(drv)
		if err != nil {
			r.add(&Row{ID: "5-" + drv, Name: "create → first command (" + drv + ")", Skipped: err.Error()})
			continue
		}
		var sgp, sdp []phases
		for i := 0; i < 3; i++ { // warm-up
			if _, err := b.createFirst(g); err != nil {
				return err
			}
		}
		for i := 0; i < b.cfg.createN; i++ {
			if i%2 == 0 {
				p, err := b.createFirst(g)
				if err != nil {
					return err
				}
				q, err := b.sshdFirst()
				if err != nil {
					return err
				}
				sgp, sdp = append(sgp, p), append(sdp, q)
			} else {
				q, err := b.sshdFirst()
				if err != nil {
					return err
				}
				p, err := b.createFirst(g)
				if err != nil {
					return err
				}
				sgp, sdp = append(sgp, p), append(sdp, q)
			}
		}
		ref = append(ref, sdp...)
		pick := func(ps []phases, f func(phases) float64) *Stats {
			xs := make([]float64, len(ps))
			for i, p := range ps {
				xs[i] = f(p)
			}
			return NewStats(xs)
		}
		total := func(p phases) float64 { return p.total }
		sgT, sdT := pick(sgp, total), pick(sdp, total)
		name := fmt.Sprintf("session create → first command done, `%s` driver", drv)
		note := "sshd has no create step: its side is a new connection + exec with the same Go client"
		r.add(&Row{ID: "5-" + drv, Name: name, Stat: "p50", Unit: "s", SG: sgT, Ref: sdT, SGName: "REST + CONNECT + SSH + exec", RefName: "TCP + SSH + exec", Note: note})
		r.add(&Row{ID: "5-" + drv, Name: name, Stat: "p99", Unit: "s", SG: sgT, Ref: sdT, SGName: "REST + CONNECT + SSH + exec", RefName: "TCP + SSH + exec"})
		r.Extra = append(r.Extra,
			&Row{ID: "5-" + drv, Name: "… of which REST `POST /v1/sessions`", Stat: "p50", Unit: "s", SG: pick(sgp, func(p phases) float64 { return p.create })},
			&Row{ID: "5-" + drv, Name: "… of which CONNECT + SSH handshake + auth", Stat: "p50", Unit: "s", SG: pick(sgp, func(p phases) float64 { return p.connect }), Ref: pick(sdp, func(p phases) float64 { return p.connect }), SGName: "tunnel", RefName: "TCP"},
			&Row{ID: "5-" + drv, Name: "… of which exec `true` (channel open → exit-status → close)", Stat: "p50", Unit: "s", SG: pick(sgp, func(p phases) float64 { return p.exec }), Ref: pick(sdp, func(p phases) float64 { return p.exec })},
		)
	}
	return nil
}

// --- row 6: many concurrent sessions ------------------------------------------

// parallel runs f(i) for i < n with at most par at once; the first error wins.
func parallel(n, par int, f func(i int) error) error {
	var wg sync.WaitGroup
	var first atomic.Value
	sem := make(chan struct{}, par)
	for i := 0; i < n; i++ {
		if first.Load() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				first.CompareAndSwap(nil, err)
			}
		}(i)
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		return e.(error)
	}
	return nil
}

func (b *bench) rowMany() error {
	n := b.cfg.sessions
	g, err := startSandgate(b.cfg.sandgateBin, filepath.Join(b.tmp, "sandgate-many"), b.sg.driver, b.cfg.serveArgs)
	if err != nil {
		return err
	}
	defer g.stop()
	time.Sleep(time.Second)
	rss0 := rssBytes(g.pid())
	sess := make([]*session, n)
	if err := parallel(n, 8, func(i int) error {
		s, err := g.create(b.ctx)
		sess[i] = s
		return err
	}); err != nil {
		return fmt.Errorf("create %d sessions: %w", n, err)
	}
	time.Sleep(time.Second)
	rss1 := rssBytes(g.pid())
	sgClients := make([]*ssh.Client, n)
	defer func() {
		for _, c := range sgClients {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := parallel(n, 16, func(i int) error {
		c, err := g.sshClient(sess[i])
		sgClients[i] = c
		return err
	}); err != nil {
		return fmt.Errorf("open %d SSH connections to sandgate: %w", n, err)
	}
	time.Sleep(2 * time.Second)
	rss2 := rssBytes(g.pid())
	_, childPSS := treeMemory(descendants(g.pid()))

	sdClients := make([]*ssh.Client, n)
	defer func() {
		for _, c := range sdClients {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := parallel(n, 16, func(i int) error {
		c, err := b.sd.sshClient()
		sdClients[i] = c
		return err
	}); err != nil {
		return fmt.Errorf("open %d SSH connections to sshd: %w", n, err)
	}
	time.Sleep(2 * time.Second)
	sdRSS, sdPSS := treeMemory(descendants(b.sd.pid()))

	ia, ib := 0, 0
	sa, sb, err := alternate(b.cfg.latN,
		func() (float64, error) {
			c := sgClients[(ia*7919)%n]
			ia++
			t0 := time.Now()
			err := execTrue(c)
			return time.Since(t0).Seconds(), err
		},
		func() (float64, error) {
			c := sdClients[(ib*7919)%n]
			ib++
			t0 := time.Now()
			err := execTrue(c)
			return time.Since(t0).Seconds(), err
		})
	if err != nil {
		return err
	}
	rss3 := rssBytes(g.pid())

	one := func(v float64) *Stats { return NewStats([]float64{v}) }
	per := func(v int64) float64 { return float64(v) / float64(n) }
	r := b.report
	r.add(&Row{ID: "6a", Name: fmt.Sprintf("memory per idle connected session, %d open", n), Stat: "value", Unit: "B",
		SG: one(per(rss2 - rss0)), Ref: one(per(sdPSS)), SGName: "gateway VmRSS delta / session", RefName: "PSS of sshd's per-connection processes",
		Note: fmt.Sprintf("gateway RSS %s → %s (sessions only) → %s (connected) → %s (after execs); sshd RSS sum %s/conn; sandbox processes PSS %s/session",
			formatValue(float64(rss0), "B"), formatValue(float64(rss1), "B"), formatValue(float64(rss2), "B"), formatValue(float64(rss3), "B"),
			formatValue(per(sdRSS), "B"), formatValue(per(childPSS), "B"))})
	lat := fmt.Sprintf("exec `true` latency with %d connections open", n)
	r.add(&Row{ID: "6b", Name: lat, Stat: "p50", Unit: "s", SG: NewStats(sa), Ref: NewStats(sb), SGName: "Go client", RefName: "Go client"})
	r.add(&Row{ID: "6c", Name: lat, Stat: "p99", Unit: "s", SG: NewStats(sa), Ref: NewStats(sb), SGName: "Go client", RefName: "Go client"})
	r.Extra = append(r.Extra,
		&Row{ID: "6a", Name: "… gateway RSS per session, no connection", Stat: "value", Unit: "B", SG: one(per(rss1 - rss0))},
		&Row{ID: "6a", Name: "… gateway RSS per SSH connection on top", Stat: "value", Unit: "B", SG: one(per(rss2 - rss1))},
	)
	return nil
}

// --- row 7: Paramiko ---------------------------------------------------------

type pyResult struct {
	Samples []float64 `json:"samples"`
	Skip    string    `json:"skip"`
	Error   string    `json:"error"`
	Via     string    `json:"via"`
}

func (b *bench) paramiko(args ...string) (*pyResult, error) {
	script := filepath.Join(b.cfg.repo, "bench", "paramiko_bench.py")
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.cfg.python, append([]string{script}, args...)...)
	cmd.Env = append(append([]string{}, b.env...), "PYTHONPATH="+filepath.Join(b.cfg.repo, "sdk-python", "src"), "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var res pyResult
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		if err == nil {
			err = jerr
		}
		return nil, fmt.Errorf("paramiko_bench.py: %v: %s", err, out)
	}
	if res.Error != "" {
		return nil, errors.New("paramiko_bench.py: " + res.Error)
	}
	return &res, nil
}

func (b *bench) rowParamiko() error {
	if b.tools[b.cfg.python] == "" {
		b.report.add(&Row{ID: "7", Name: "Paramiko run_command", Skipped: b.cfg.python + " not found"})
		return nil
	}
	chunks := 4
	per := max(1, b.cfg.pyN/chunks)
	var sa, sb []float64
	via := ""
	hk := string(trimNL(sshMarshal(b.sd.hostKey)))
	for i := 0; i < chunks; i++ {
		sgArgs := []string{"--mode", "sdk", "--api-url", b.sg.url, "--token", b.sg.token, "--session", b.sess.ID, "--n", strconv.Itoa(per)}
		sdArgs := []string{"--mode", "plain", "--host", "127.0.0.1", "--port", strconv.Itoa(b.sd.port), "--user", "root",
			"--key", b.sd.clientKey, "--host-key", hk, "--n", strconv.Itoa(per)}
		order := [][]string{sgArgs, sdArgs}
		if i%2 == 1 {
			order = [][]string{sdArgs, sgArgs}
		}
		for _, args := range order {
			res, err := b.paramiko(args...)
			if err != nil {
				return err
			}
			if res.Skip != "" {
				b.report.add(&Row{ID: "7", Name: "Paramiko run_command(`true`) on an open client", Skipped: res.Skip})
				return nil
			}
			if args[1] == "sdk" {
				sa = append(sa, res.Samples...)
				via = res.Via
			} else {
				sb = append(sb, res.Samples...)
			}
		}
	}
	b.report.add(&Row{ID: "7", Name: "Paramiko run_command(`true`) on an open client", Stat: "median", Unit: "s",
		SG: NewStats(sa), Ref: NewStats(sb), SGName: via, RefName: "plain paramiko exec_command"})
	return nil
}
