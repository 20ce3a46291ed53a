package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The equal-footing rows (e1-e5) are the headline: both servers get the
// same cipher and MAC (forced by the client config, checked against what
// each side negotiates), sshd gets TCP_NODELAY on its sockets from the
// start (a small LD_PRELOAD shim, built here with cc), and both write to
// the same filesystem (the scratch dir holds sshd's home and sandgate's
// data dir, so the workspace image's backing file too). sandgate is
// reached both ways a user can: `sandgate ssh-config` (the proxy passes
// the tunnelled socket to ssh: fd passing) and the plain copying
// `ProxyCommand sandgate proxy %h`.

// nodelayShim sets TCP_NODELAY on every TCP socket sshd accepts or
// connects, as OpenSSH itself does only once a session starts.
const nodelayShim = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void nodelay(int fd) {
	int v = 0;
	socklen_t l = sizeof v;
	if (fd < 0) return;
	if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) != 0 || v != IPPROTO_TCP) return;
	v = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v);
}

int accept(int s, struct sockaddr *a, socklen_t *l) {
	static int (*real)(int, struct sockaddr *, socklen_t *);
	if (!real) real = dlsym(RTLD_NEXT, "accept");
	int fd = real(s, a, l);
	nodelay(fd);
	return fd;
}

int accept4(int s, struct sockaddr *a, socklen_t *l, int f) {
	static int (*real)(int, struct sockaddr *, socklen_t *, int);
	if (!real) real = dlsym(RTLD_NEXT, "accept4");
	int fd = real(s, a, l, f);
	nodelay(fd);
	return fd;
}

int connect(int s, const struct sockaddr *a, socklen_t l) {
	static int (*real)(int, const struct sockaddr *, socklen_t);
	if (!real) real = dlsym(RTLD_NEXT, "connect");
	nodelay(s);
	return real(s, a, l);
}
`

// buildShim compiles the TCP_NODELAY shim into dir with cc.
func buildShim(dir string) (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", errors.New("the equal-footing rows (e1-e5) need a C compiler to build sshd's TCP_NODELAY shim: `cc` not found (Debian: apt-get install gcc); run other rows with --rows 1,2,...")
	}
	src := filepath.Join(dir, "nodelay.c")
	so := filepath.Join(dir, "nodelay.so")
	if err := os.WriteFile(src, []byte(nodelayShim), 0o600); err != nil {
		return "", err
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", so, src, "-ldl").CombinedOutput(); err != nil {
		return "", fmt.Errorf("cc (sshd's TCP_NODELAY shim): %v: %s", err, strings.TrimSpace(string(out)))
	}
	return so, nil
}

// setupEqual starts the equal-footing sshd (shim, ssh -L allowed).
func (b *bench) setupEqual() error {
	dir := filepath.Join(b.tmp, "sshd-eq")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	so, err := buildShim(dir)
	if err != nil {
		return err
	}
	b.shim = so
	if b.sdEq, err = prepareSSHD(dir, sshdOpts{preload: so, localForward: true}); err != nil {
		return err
	}
	return b.sdEq.start()
}

// eqCrypto is the ssh_config lines that force the equal-footing cipher
// and MAC on every host that uses them.
func (b *bench) eqCrypto() string {
	s := "  KexAlgorithms curve25519-sha256\n  Ciphers " + b.cfg.cipher + "\n"
	if b.cfg.mac != "" {
		s += "  MACs " + b.cfg.mac + "\n"
	}
	return s
}

// eqLabel says which cipher and MAC the equal-footing rows use.
func (b *bench) eqLabel() string {
	mac := b.cfg.mac
	if mac == "" {
		mac = "implicit (AEAD)"
		if !strings.Contains(b.cfg.cipher, "gcm") && !strings.Contains(b.cfg.cipher, "poly1305") {
			mac = "client default"
		}
	}
	return fmt.Sprintf("cipher %s, MAC %s, both sides", b.cfg.cipher, mac)
}

// eqHosts are the equal-footing ssh_config blocks.
func (b *bench) eqHosts(khSG string) string {
	if b.sdEq == nil {
		return ""
	}
	var s strings.Builder
	fd := ""
	if b.fdpass {
		fd = "--fdpass "
	}
	fmt.Fprintf(&s, "Host sg-eq\n  HostName %s\n  User sandbox\n  ProxyCommand %s proxy %s%%h\n  UserKnownHostsFile %s\n%s", b.sess.ID, b.cfg.sandgateBin, fd, khSG, b.eqCrypto())
	if b.fdpass {
		s.WriteString("  ProxyUseFdpass yes\n")
	}
	fmt.Fprintf(&s, "Host sg-eq-stdio\n  HostName %s\n  User sandbox\n  ProxyCommand %s proxy %%h\n  UserKnownHostsFile %s\n%s", b.sess.ID, b.cfg.sandgateBin, khSG, b.eqCrypto())
	if b.ws {
		fmt.Fprintf(&s, "Host %s\n  HostName %s\n  User sandbox\n  ProxyCommand %s proxy --transport websocket %%h\n  UserKnownHostsFile %s\n%s", wsHost, b.sess.ID, b.cfg.sandgateBin, khSG, b.eqCrypto())
	}
	hk := strings.TrimSpace(string(sshMarshal(b.sdEq.hostKey)))
	kh := filepath.Join(b.client, "known_hosts_sshd_eq")
	_ = os.WriteFile(kh, []byte(fmt.Sprintf("[localhost]:%d %s\n", b.sdEq.port, hk)), 0o600)
	fmt.Fprintf(&s, "Host sshd-eq\n  HostName localhost\n  AddressFamily inet\n  Port %d\n  User root\n  IdentityFile %s\n  UserKnownHostsFile %s\n%s", b.sdEq.port, b.sdEq.clientKey, kh, b.eqCrypto())
	// sshd-eq behind the hop sandgate's copying proxy adds: a second
	// process relaying ssh's pipes to a TCP socket, with the proxy's own
	// relay (sgbench nc uses internal/piperelay).
	fmt.Fprintf(&s, "Host %s\n  HostName localhost\n  AddressFamily inet\n  Port %d\n  User root\n  IdentityFile %s\n  UserKnownHostsFile %s\n  ProxyCommand %s nc %%h %%p\n%s",
		hopHost, b.sdEq.port, b.sdEq.clientKey, kh, b.cfg.self, b.eqCrypto())
	return s.String()
}

// hopHost is sshd-eq reached through `sgbench nc`, the same relay as
// `sandgate proxy`: the reference for rows e4e, e4f, e5e and e5f, which
// compare sandgate's copying proxy with sshd behind the same hop.
const hopHost = "sshd-eq-hop"

// hopRefName describes hopHost in the report.
const hopRefName = "`ProxyCommand sgbench nc %h %p` (the same relay as `sandgate proxy`), TCP_NODELAY shim"

// eqWays are the ways to reach sandgate in the equal-footing rows.
func (b *bench) eqWays() []struct{ host, label, short string } {
	ways := []struct{ host, label, short string }{}
	if b.fdpass {
		ways = append(ways, struct{ host, label, short string }{"sg-eq", "`sandgate ssh-config` (proxy --fdpass, ProxyUseFdpass)", "fd passing"})
	}
	return append(ways, struct{ host, label, short string }{"sg-eq-stdio", "`ProxyCommand sandgate proxy %h` (copying)", "copying proxy"})
}

// checkEqual fails unless every equal-footing host negotiates the
// configured cipher; it returns what each side negotiated.
func (b *bench) checkEqual() (string, error) {
	var parts []string
	for _, h := range []string{"sg-eq", "sg-eq-stdio", wsHost, "sshd-eq", hopHost} {
		if (h == "sg-eq" && !b.fdpass) || (h == wsHost && !b.ws) {
			continue
		}
		n := b.negotiated(h)
		if !strings.Contains(n, b.cfg.cipher) {
			return "", fmt.Errorf("%s negotiated %q, not cipher %s", h, n, b.cfg.cipher)
		}
		parts = append(parts, fmt.Sprintf("%s `%s`", h, n))
	}
	return strings.Join(parts, "; "), nil
}

func (b *bench) eqSync() { _ = exec.Command("sync").Run() }

// eqEnv runs f with the shim preloaded into the OpenSSH clients as well:
// a client that connects over TCP (to sshd) then has TCP_NODELAY from the
// start too, as the socket sandgate's proxy passes to ssh has. It does
// nothing on sandgate's side (the proxy is a static Go binary; with fd
// passing ssh makes no connection of its own).
func (b *bench) eqEnv(f func() error) error {
	saved := b.env
	b.env = append(append([]string(nil), saved...), "LD_PRELOAD="+b.shim)
	defer func() { b.env = saved }()
	return f()
}

// rowEqConn: e1 (new connection + true) and e2 (exec on an open
// ControlMaster connection).
func (b *bench) rowEqConn() error {
	r := b.report
	lbl := b.eqLabel()
	if b.cfg.wantRow("e1") {
		hosts := []string{"sshd-eq"}
		for _, w := range b.eqWays() {
			hosts = append(hosts, w.host)
		}
		samples, err := b.newConnSamples(hosts)
		if err != nil {
			return err
		}
		for i, w := range b.eqWays() {
			r.add(&Row{ID: fmt.Sprintf("e1%c", 'a'+i), Name: "new connection + `true` (ssh)", Stat: "median", Unit: "s",
				SG: NewStats(samples[w.host]), Ref: NewStats(samples["sshd-eq"]), SGName: w.label, RefName: "direct TCP, TCP_NODELAY shim", Note: lbl})
		}
	}
	if b.cfg.wantRow("e2") {
		sa, sb, err := b.muxExecs("sg-eq", "sshd-eq")
		if err != nil {
			return err
		}
		r.add(&Row{ID: "e2", Name: fmt.Sprintf("exec `true` on an open connection (ControlMaster), %d×", b.cfg.execN), Stat: "median", Unit: "s",
			SG: NewStats(sa), Ref: NewStats(sb), SGName: "ssh-config", RefName: "TCP_NODELAY shim", Note: lbl + "; each run is an `ssh -S` mux client process"})
	}
	return nil
}

// rowEqData: e3 (sftp put/get) and e4 (cat up/down an exec channel), each
// both ways to reach sandgate.
func (b *bench) rowEqData() error {
	local, err := b.makeBigFile()
	if err != nil {
		return err
	}
	down := filepath.Join(b.client, "down.bin")
	size := b.sizeName()
	lbl := b.eqLabel()
	// The downloads need the file on both sides.
	for _, h := range []string{"sg-eq-stdio", "sshd-eq"} {
		if _, err := b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > "+b.remote(h)); err != nil {
			return err
		}
	}
	var ts []transfer
	for i, w := range b.eqWays() {
		w := w
		sfx := string(rune('a' + 2*i))
		sfx2 := string(rune('b' + 2*i))
		if b.cfg.wantRow("e3") {
			ts = append(ts,
				transfer{id: "e3" + sfx, name: "sftp put " + size + " (" + w.short + ")", pair: [2]string{w.host, "sshd-eq"}, run: func(h string) (time.Duration, error) {
					return b.sftpBatch(h, fmt.Sprintf("put %s %s", local, b.remote(h)))
				}, after: b.checkRemote},
				transfer{id: "e3" + sfx2, name: "sftp get " + size + " (" + w.short + ")", pair: [2]string{w.host, "sshd-eq"}, run: func(h string) (time.Duration, error) {
					d, err := b.sftpBatch(h, fmt.Sprintf("get %s %s", b.remote(h), down))
					if err == nil {
						err = b.checkLocal(down)
					}
					return d, err
				}})
		}
		if b.cfg.wantRow("e4") {
			ts = append(ts,
				transfer{id: "e4" + sfx, name: size + " up an exec channel: `cat > /dev/null` (" + w.short + ")", pair: [2]string{w.host, "sshd-eq"}, run: func(h string) (time.Duration, error) {
					return b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > /dev/null")
				}},
				transfer{id: "e4" + sfx2, name: size + " down an exec channel: `cat file` (" + w.short + ")", pair: [2]string{w.host, "sshd-eq"}, run: func(h string) (time.Duration, error) {
					return b.runClient("", "", "ssh", "-F", b.sshCfg, h, "cat "+b.remote(h))
				}})
		}
	}
	if b.cfg.wantRow("e4") {
		// The copying proxy against sshd behind the same hop: what the hop
		// costs, apart from the gateway.
		ts = append(ts,
			transfer{id: "e4e", name: size + " up an exec channel: `cat > /dev/null` (copying proxy; sshd behind the same hop)", pair: [2]string{"sg-eq-stdio", hopHost}, refName: hopRefName, run: func(h string) (time.Duration, error) {
				return b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > /dev/null")
			}},
			transfer{id: "e4f", name: size + " down an exec channel: `cat file` (copying proxy; sshd behind the same hop)", pair: [2]string{"sg-eq-stdio", hopHost}, refName: hopRefName, run: func(h string) (time.Duration, error) {
				return b.runClient("", "", "ssh", "-F", b.sshCfg, h, "cat "+b.remote(h))
			}})
	}
	for i := range ts {
		ts[i].sync = true
		ts[i].sgName = b.wayLabel(ts[i].pair[0])
		if ts[i].refName == "" {
			ts[i].refName = "direct TCP, TCP_NODELAY shim"
		}
		ts[i].label = lbl
	}
	return b.transfers(ts)
}

func (b *bench) wayLabel(host string) string {
	for _, w := range b.eqWays() {
		if w.host == host {
			return w.label
		}
	}
	return host
}

// --- e5: ssh -L throughput ---------------------------------------------------

// fwdsrvMain is `sgbench fwdsrv ADDR`: a TCP server for row e5. Each
// connection sends an op byte and a big-endian uint64 size: 'u' sends
// size bytes, then gets one byte back; 'd' gets size bytes, then EOF. It
// prints "ready" once listening.
func fwdsrvMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: sgbench fwdsrv HOST:PORT")
		return 2
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench fwdsrv:", err)
		return 1
	}
	fmt.Println("ready")
	buf := make([]byte, 1<<20)
	for {
		c, err := ln.Accept()
		if err != nil {
			return 0
		}
		var hdr [9]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			c.Close()
			continue
		}
		n := int64(binary.BigEndian.Uint64(hdr[1:]))
		switch hdr[0] {
		case 'u':
			if m, err := io.CopyBuffer(io.Discard, io.LimitReader(c, n), buf); err == nil && m == n {
				_, _ = c.Write([]byte{1})
			}
		case 'd':
			for left := n; left > 0; {
				k := min(left, int64(len(buf)))
				if _, err := c.Write(buf[:k]); err != nil {
					break
				}
				left -= k
			}
		}
		c.Close()
	}
}

// fwdRun moves n bytes through the forward at port, up or down.
func fwdRun(port int, up bool, n int64) (time.Duration, error) {
	t0 := time.Now()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var hdr [9]byte
	hdr[0] = 'd'
	if up {
		hdr[0] = 'u'
	}
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	if up {
		for left := n; left > 0; {
			k := min(left, int64(len(buf)))
			if _, err := c.Write(buf[:k]); err != nil {
				return 0, err
			}
			left -= k
		}
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			return 0, fmt.Errorf("forward up: no ack: %w", err)
		}
	} else {
		m, err := io.CopyBuffer(io.Discard, c, buf)
		if err != nil {
			return 0, err
		}
		if m != n {
			return 0, fmt.Errorf("forward down: %d bytes, want %d", m, n)
		}
	}
	return time.Since(t0), nil
}

// startForward runs `ssh -N -L port:127.0.0.1:target host` until stop.
func (b *bench) startForward(host string, target int) (int, func(), error) {
	lp, err := freePort()
	if err != nil {
		return 0, nil, err
	}
	cmd := exec.Command("ssh", "-F", b.sshCfg, "-N", "-o", "ExitOnForwardFailure=yes", "-L", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:%d", lp, target), host)
	cmd.Env = b.env
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-done:
			return 0, nil, fmt.Errorf("ssh -L to %s exited", host)
		default:
		}
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", lp)); err == nil {
			c.Close()
			return lp, stop, nil
		}
	}
	stop()
	return 0, nil, fmt.Errorf("ssh -L to %s: no listener after 15s", host)
}

// rowEqForward is e5: ssh -L throughput to a server on the far side's
// loopback (in the sandbox; on the host for sshd), the same program
// (`sgbench fwdsrv`) on both, up and down.
func (b *bench) rowEqForward() error {
	// The server runs in the sandbox from the workspace.
	if _, err := b.sftpBatch("sg-eq-stdio", fmt.Sprintf("put %s sgbench", b.cfg.self)); err != nil {
		return err
	}
	c, err := b.sg.sshClient(b.sess)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	port := 40000 + os.Getpid()%20000
	out, err := s.StdoutPipe()
	if err != nil {
		return err
	}
	if err := s.Start(fmt.Sprintf("chmod +x sgbench && exec ./sgbench fwdsrv 127.0.0.1:%d", port)); err != nil {
		return err
	}
	if l, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(l) != "ready" {
		return fmt.Errorf("fwdsrv in the sandbox: %q %v", l, err)
	}
	defer func() { _ = s.Signal("KILL"); _ = c.Close() }()
	hport, err := freePort()
	if err != nil {
		return err
	}
	host := exec.Command(b.cfg.self, "fwdsrv", fmt.Sprintf("127.0.0.1:%d", hport))
	hout, err := host.StdoutPipe()
	if err != nil {
		return err
	}
	if err := host.Start(); err != nil {
		return err
	}
	defer func() { _ = host.Process.Kill(); _ = host.Wait() }()
	if l, err := bufio.NewReader(hout).ReadString('\n'); err != nil || strings.TrimSpace(l) != "ready" {
		return fmt.Errorf("fwdsrv on the host: %q %v", l, err)
	}
	refPort, stopRef, err := b.startForward("sshd-eq", hport)
	if err != nil {
		return err
	}
	defer stopRef()
	hopPort, stopHop, err := b.startForward(hopHost, hport)
	if err != nil {
		return err
	}
	defer stopHop()
	size := b.sizeName()
	// measure alternates runs through sgPort and refPort, both ways, and
	// reports them as rows ids[0] (up) and ids[1] (down).
	measure := func(ids [2]string, way, sgName string, sgPort, refPort int, refName string) error {
		for i, up := range []bool{true, false} {
			// Server-side CPU: the gateway process alone (the far end runs
			// in its sandbox), sshd's process tree (the far end is not in it).
			cpu := map[int][]float64{}
			cpuOf := func(p int) float64 {
				if p == sgPort {
					return cpuSeconds(b.sg.pid())
				}
				return treeCPU(b.sdEq.pid())
			}
			run := func(p int) func() (float64, error) {
				return func() (float64, error) {
					c0 := cpuOf(p)
					d, err := fwdRun(p, up, b.cfg.size)
					cpu[p] = append(cpu[p], cpuOf(p)-c0)
					return d.Seconds(), err
				}
			}
			if _, _, err := alternate(1, run(sgPort), run(refPort)); err != nil { // warm-up
				return err
			}
			cpu = map[int][]float64{}
			sa, sb, err := alternate(b.cfg.reps, run(sgPort), run(refPort))
			if err != nil {
				return err
			}
			dir := "up (client → far side)"
			if !up {
				dir = "down (far side → client)"
			}
			b.report.add(&Row{ID: ids[i], Name: fmt.Sprintf("`ssh -L` %s %s (%s)", size, dir, way), Stat: "median", Unit: "s", Bytes: b.cfg.size,
				SG: NewStats(sa), Ref: NewStats(sb), SGName: sgName + " → sandbox loopback", RefName: "`-L` to host loopback, " + refName,
				CPU: map[string]float64{"sandgateServer": NewStats(cpu[sgPort]).Median, "sshdServer": NewStats(cpu[refPort]).Median},
				Note: fmt.Sprintf("%s; the far end is `sgbench fwdsrv` on both sides; server CPU s per run (the gateway process; sshd's tree; client-side ssh not counted): sandgate %.2f, sshd %.2f",
					b.eqLabel(), NewStats(cpu[sgPort]).Median, NewStats(cpu[refPort]).Median)})
		}
		return nil
	}
	for _, w := range b.eqWays() {
		sgPort, stopSG, err := b.startForward(w.host, port)
		if err != nil {
			return err
		}
		ids := [2]string{"e5a", "e5b"}
		if w.host == "sg-eq-stdio" {
			ids = [2]string{"e5c", "e5d"}
		}
		err = measure(ids, w.short, w.label, sgPort, refPort, "TCP_NODELAY shim")
		if err == nil && w.host == "sg-eq-stdio" {
			// The copying proxy against sshd behind the same hop.
			err = measure([2]string{"e5e", "e5f"}, "copying proxy; sshd behind the same hop", w.label, sgPort, hopPort, hopRefName)
		}
		stopSG()
		if err != nil {
			return err
		}
	}
	return nil
}
