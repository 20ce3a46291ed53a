package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// --- row 9: per-session network egress (sandgate only) ----------------------
//
// 9a cfg.size over HTTP from a loopback server in this process: curl on the
//    host straight to it, and curl in a session through the session's egress
//    proxy (`curl -p`: CONNECT, a spliced tunnel), rotating with
//    9c's relay and the forwarder variant;
// 9b the same two at `curl --limit-rate 1G`, a fast real link;
// 9c a minimal userspace relay on the host (`sgbench relay`: Go, io.Copy
//    both ways, which splices, in a process of its own as the gateway is):
//    the floor of any relay hop on this machine;
// 9d row 5's create -> first command, a plain `{}` create alternating with
//    one that asks for egress and a secret, on the same gateway.
//
// The gateway is a linux-driver `sandgate serve` of its own that may reach
// 127.0.0.1 (--egress-allow-cidr) under the name big.test (--egress-resolve).

const (
	egressName   = "big.test"
	egressSecret = "BENCH_TOKEN"
	// limitRate is 9b's curl --limit-rate: 1 GiB/s, 8.6 Gbit/s.
	limitRate = "1G"
	// hostRef is what rows 9a-c compare against instead of sshd.
	hostRef = "sandgate only (OpenSSH has no counterpart): the reference column is curl on the host, no sandbox"
)

// blobServer serves size bytes from a memory buffer, with Content-Length,
// on 127.0.0.1.
type blobServer struct {
	ln   net.Listener
	srv  *http.Server
	size int64
}

func newBlobServer(size int64) (*blobServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 4<<20)
	_, _ = rand.NewChaCha8([32]byte{9}).Read(buf)
	s := &blobServer{ln: ln, size: size}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		if r.Method == http.MethodHead {
			return
		}
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			if _, err := w.Write(buf[:n]); err != nil {
				return
			}
			left -= n
		}
	})}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *blobServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func (s *blobServer) close() { _ = s.srv.Close() }

// tcpRelay accepts on 127.0.0.1 and copies each connection to and from
// target with io.Copy, which splices between TCP sockets on Linux.
type tcpRelay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func newTCPRelay(target string) (*tcpRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &tcpRelay{ln: ln, target: target, conns: map[net.Conn]bool{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *tcpRelay) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

func (r *tcpRelay) track(c net.Conn, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.conns[c] = true
	} else {
		delete(r.conns, c)
	}
}

func (r *tcpRelay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer c.Close()
			u, err := net.Dial("tcp", r.target)
			if err != nil {
				return
			}
			defer u.Close()
			r.track(c, true)
			r.track(u, true)
			defer r.track(c, false)
			defer r.track(u, false)
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(u, c)
				_ = u.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(c, u)
			_ = c.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}

// close stops accepting, ends open connections and waits for their copies.
func (r *tcpRelay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// relayMain is `sgbench relay HOST:PORT`: a tcpRelay in a process of its
// own, as the gateway is, so that it does not share a Go runtime with the
// server it relays (which costs it about 15% here). It prints its port and
// runs until stdin closes.
func relayMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: sgbench relay HOST:PORT")
		return 2
	}
	r, err := newTCPRelay(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "sgbench relay:", err)
		return 1
	}
	fmt.Println(r.port())
	_, _ = io.Copy(io.Discard, os.Stdin)
	r.close()
	return 0
}

// startRelay runs `sgbench relay target` and returns its port and a stop
// function.
func (b *bench) startRelay(target string) (int, func(), error) {
	cmd := exec.Command(b.cfg.self, "relay", target)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	stop := func() {
		in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	var port int
	if _, err := fmt.Fscanln(out, &port); err != nil {
		stop()
		return 0, nil, fmt.Errorf("sgbench relay: no port: %w", err)
	}
	return port, stop, nil
}

// curlArgs are the flags of every download: no output, fail on HTTP
// errors, print speed (bytes/s) and size.
func curlArgs(extra ...string) []string {
	return append([]string{"-sS", "-f", "--max-time", "600", "-o", "/dev/null", "-w", "%{speed_download} %{size_download}"}, extra...)
}

// parseCurl turns curl's "speed size" into seconds for want bytes.
func parseCurl(out []byte, want int64) (float64, error) {
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return 0, fmt.Errorf("curl printed %q", out)
	}
	speed, err1 := strconv.ParseFloat(f[0], 64)
	size, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || speed <= 0 {
		return 0, fmt.Errorf("curl printed %q", out)
	}
	if int64(size) != want {
		return 0, fmt.Errorf("curl got %d bytes, want %d", int64(size), want)
	}
	return float64(want) / speed, nil
}

// curlHost runs curl on the host, without proxy settings.
func (b *bench) curlHost(args ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 11*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "curl", curlArgs(args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + b.client, "LANG=C.UTF-8"}
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("curl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errBuf.String()))
	}
	return parseCurl(out, b.cfg.size)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// egressGateway starts a linux-driver gateway whose sessions may reach
// 127.0.0.1 as big.test, with one secret, BENCH_TOKEN.
func (b *bench) egressGateway() (*sandgate, error) {
	if help, _ := exec.Command(b.cfg.sandgateBin, "serve", "-h").CombinedOutput(); !bytes.Contains(help, []byte("-egress-resolve")) {
		return nil, fmt.Errorf("%s serve has no --egress-resolve (a build without egress)", b.cfg.sandgateBin)
	}
	dir := filepath.Join(b.tmp, "sandgate-egress")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	secrets := filepath.Join(dir, "secrets")
	if err := os.WriteFile(secrets, []byte(egressSecret+"=sgbench-"+randHex(16)+"\n"), 0o600); err != nil {
		return nil, err
	}
	args := append(append([]string{}, b.cfg.serveArgs...),
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", egressName+"=127.0.0.1", "--secrets-file", secrets)
	g, err := startSandgate(b.cfg.sandgateBin, dir, "linux", args)
	if err != nil {
		return nil, err
	}
	if g.driver != "linux" {
		g.stop()
		return nil, fmt.Errorf("serve --sandbox linux runs driver %q; egress needs the linux driver", g.driver)
	}
	return g, nil
}

func (b *bench) rowEgress() error {
	r := b.report
	skip := func(why string) {
		for _, id := range []string{"9a", "9b", "9c", "9d", "9e", "9f"} {
			if b.cfg.wantRow(id) {
				r.add(&Row{ID: id, Name: "per-session network egress", Skipped: why})
			}
		}
	}
	if _, err := exec.LookPath("curl"); err != nil {
		skip("curl not installed (Debian: curl)")
		return nil
	}
	srv, err := newBlobServer(b.cfg.size)
	if err != nil {
		return err
	}
	defer srv.close()
	g, err := b.egressGateway()
	if err != nil {
		skip(err.Error())
		return nil
	}
	defer g.stop()
	allow := fmt.Sprintf("%s:%d", egressName, srv.port())
	if b.cfg.wantRow("9a") || b.cfg.wantRow("9b") || b.cfg.wantRow("9c") {
		if err := b.egressThroughput(g, srv, allow); err != nil {
			return fmt.Errorf("9a-c: %w", err)
		}
	}
	if b.cfg.wantRow("9e") || b.cfg.wantRow("9f") {
		if err := b.rowTransparent(g, srv, allow); err != nil {
			return fmt.Errorf("9e-f: %w", err)
		}
	}
	if b.cfg.wantRow("9d") {
		if err := b.egressCreate(g, allow); err != nil {
			return fmt.Errorf("9d: %w", err)
		}
	}
	return nil
}

// egressThroughput downloads cfg.size with curl: on the host straight from
// srv, in a session through its egress proxy, on the host through a Go
// relay; then host and session at --limit-rate. Each set rotates its
// variants every round, as row 1 does.
func (b *bench) egressThroughput(g *sandgate, srv *blobServer, allow string) error {
	s, err := g.createWith(b.ctx, map[string]any{"egress": []string{allow}})
	if err != nil {
		return err
	}
	defer g.delete(s.ID)
	c, err := g.sshClient(s)
	if err != nil {
		return err
	}
	defer c.Close()
	relayPort, stopRelay, err := b.startRelay(srv.ln.Addr().String())
	if err != nil {
		return err
	}
	defer stopRelay()

	// gwCPU collects the gateway process's own CPU seconds per session run
	// (the proxy runs in it; the sandbox's curl is not its child).
	gwCPU := map[string][]float64{}
	inSession := func(key string, extra ...string) func() (float64, error) {
		cmd := "curl"
		for _, a := range curlArgs(extra...) {
			cmd += " " + shellQuote(a)
		}
		return func() (float64, error) {
			ss, err := c.NewSession()
			if err != nil {
				return 0, fmt.Errorf("new session: %w", err)
			}
			defer ss.Close()
			var errBuf bytes.Buffer
			ss.Stderr = &errBuf
			c0 := ownCPU(g.pid())
			out, err := ss.Output(cmd)
			gwCPU[key] = append(gwCPU[key], ownCPU(g.pid())-c0)
			if err != nil {
				return 0, fmt.Errorf("in the session: %s: %v: %s", cmd, err, strings.TrimSpace(errBuf.String()))
			}
			return parseCurl(out, b.cfg.size)
		}
	}
	url := fmt.Sprintf("http://%s/big", allow)
	direct := fmt.Sprintf("http://127.0.0.1:%d/big", srv.port())
	viaRelay := fmt.Sprintf("http://127.0.0.1:%d/big", relayPort)
	type variant struct {
		key string
		run func() (float64, error)
	}
	rotate := func(vs []variant) (map[string][]float64, error) {
		out := map[string][]float64{}
		for _, v := range vs { // warm-up: the proxy's first dial, page cache
			if _, err := v.run(); err != nil {
				return nil, err
			}
		}
		for k := range gwCPU {
			delete(gwCPU, k)
		}
		for i := 0; i < b.cfg.reps; i++ {
			for j := range vs {
				v := vs[(i+j)%len(vs)]
				x, err := v.run()
				if err != nil {
					return nil, err
				}
				out[v.key] = append(out[v.key], x)
			}
		}
		return out, nil
	}
	var full, limited map[string][]float64
	var fullCPU, fwdCPU float64
	if b.cfg.wantRow("9a") || b.cfg.wantRow("9c") {
		if full, err = rotate([]variant{
			{"host", func() (float64, error) { return b.curlHost(direct) }},
			{"sg", inSession("sg", "-p", url)},
			{"relay", func() (float64, error) { return b.curlHost(viaRelay) }},
			{"sg-fwd", inSession("sg-fwd", url)},
		}); err != nil {
			return err
		}
		fullCPU, fwdCPU = NewStats(gwCPU["sg"]).Median, NewStats(gwCPU["sg-fwd"]).Median
	}
	if b.cfg.wantRow("9b") {
		if limited, err = rotate([]variant{
			{"host", func() (float64, error) { return b.curlHost("--limit-rate", limitRate, direct) }},
			{"sg", inSession("sg", "--limit-rate", limitRate, "-p", url)},
		}); err != nil {
			return err
		}
	}

	size := b.sizeName()
	mbps := func(xs []float64) float64 { return float64(b.cfg.size) / NewStats(xs).Median / 1e6 }
	thr := func(a, h []float64) string {
		return fmt.Sprintf("MB/s sandgate/host = %.2f", mbps(a)/mbps(h))
	}
	perGiB := func(cpu float64) float64 { return cpu / (float64(b.cfg.size) / (1 << 30)) }
	sgVia := "curl -p in a session: CONNECT to the egress proxy, spliced tunnel"
	hostVia := "curl on the host, straight to the server"
	r := b.report
	if full != nil && b.cfg.wantRow("9a") {
		r.add(&Row{ID: "9a", Name: size + " over HTTP from a loopback server, unthrottled", Stat: "median", Unit: "s",
			SG: NewStats(full["sg"]), Ref: NewStats(full["host"]), Bytes: b.cfg.size, SGName: sgVia, RefKind: "host", RefName: hostVia,
			Note: fmt.Sprintf("%s; %s; time = size / curl's `%%{speed_download}`; on loopback the copy is CPU-bound and every userspace relay adds a hop (9c); gateway CPU %.2f s per GiB",
				hostRef, thr(full["sg"], full["host"]), perGiB(fullCPU))})
	}
	if limited != nil {
		r.add(&Row{ID: "9b", Name: size + " over HTTP, both at `curl --limit-rate " + limitRate + "` (1 GiB/s, 8.6 Gbit/s: a fast real link)", Stat: "median", Unit: "s",
			SG: NewStats(limited["sg"]), Ref: NewStats(limited["host"]), Bytes: b.cfg.size, SGName: sgVia, RefKind: "host", RefName: hostVia,
			Note: fmt.Sprintf("%s; %s", hostRef, thr(limited["sg"], limited["host"]))})
	}
	if full != nil && b.cfg.wantRow("9c") {
		r.add(&Row{ID: "9c", Name: size + " over HTTP through one userspace relay: the egress proxy vs a minimal one on the host", Stat: "median", Unit: "s",
			SG: NewStats(full["sg"]), Ref: NewStats(full["relay"]), Bytes: b.cfg.size, SGName: sgVia + " (9a's runs)", RefKind: "host",
			RefName: "curl on the host through `sgbench relay`, a Go TCP relay process (io.Copy both ways: splice)",
			Note: fmt.Sprintf("sandgate only; here the reference column is the minimal relay: MB/s sandgate/relay = %.2f; relay/host = %.2f, the floor of any userspace relay on this machine",
				mbps(full["sg"])/mbps(full["relay"]), mbps(full["relay"])/mbps(full["host"]))})
	}
	if full == nil {
		return nil
	}
	r.Extra = append(r.Extra,
		&Row{ID: "9a", Name: size + " through the egress proxy's HTTP forwarder (curl without -p: absolute-URI request), rotating with 9a", Stat: "median", Unit: "s",
			SG: NewStats(full["sg-fwd"]), Ref: NewStats(full["host"]), Bytes: b.cfg.size, SGName: "curl in a session, HTTP_PROXY", RefKind: "host", RefName: hostVia,
			Note: fmt.Sprintf("%s; gateway CPU %.2f s per GiB", thr(full["sg-fwd"], full["host"]), perGiB(fwdCPU))},
	)
	return nil
}

// egressCreate is row 5's create -> first command, a plain create and
// one with egress and a secret alternating on one gateway.
func (b *bench) egressCreate(g *sandgate, allow string) error {
	withEgress := map[string]any{"egress": []string{allow}, "secrets": []string{egressSecret}}
	reqs := []map[string]any{withEgress, nil}
	for i := 0; i < 3; i++ { // warm-up
		for _, req := range reqs {
			if _, err := b.createFirstWith(g, req); err != nil {
				return err
			}
		}
	}
	var eg, plain []phases
	for i := 0; i < b.cfg.createN; i++ {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, k := range order {
			p, err := b.createFirstWith(g, reqs[k])
			if err != nil {
				return err
			}
			if k == 0 {
				eg = append(eg, p)
			} else {
				plain = append(plain, p)
			}
		}
	}
	total := func(p phases) float64 { return p.total }
	egT, plT := pickPhase(eg, total), pickPhase(plain, total)
	via := "REST + CONNECT + SSH + exec (Go client)"
	body := fmt.Sprintf(`{"egress": ["%s:PORT"], "secrets": ["%s"]}`, egressName, egressSecret)
	name := "session create → first command done, with egress and a secret, `linux` driver: `" + body + "`"
	pname := "session create → first command done, plain `{}`, same gateway, alternating with the row above"
	ms := func(a, c float64) string { return fmt.Sprintf("%+.2f ms", (a-c)*1e3) }
	r := b.report
	r.add(&Row{ID: "9d", Name: name, Stat: "p50", Unit: "s", SG: egT, SGName: via,
		Note: fmt.Sprintf("%s; egress + secret − plain: p50 %s", sgOnly, ms(egT.Median, plT.Median))})
	r.add(&Row{ID: "9d", Name: name, Stat: "p99", Unit: "s", SG: egT, SGName: via,
		Note: fmt.Sprintf("%s; egress + secret − plain: p99 %s", sgOnly, ms(egT.P99, plT.P99))})
	r.add(&Row{ID: "9d", Name: pname, Stat: "p50", Unit: "s", SG: plT, SGName: via, Note: sgOnly})
	r.add(&Row{ID: "9d", Name: pname, Stat: "p99", Unit: "s", SG: plT, SGName: via, Note: sgOnly})
	for _, x := range []struct {
		label string
		ps    []phases
	}{{"egress + secret", eg}, {"plain", plain}} {
		r.Extra = append(r.Extra,
			&Row{ID: "9d", Name: "… " + x.label + ": of which REST `POST /v1/sessions`", Stat: "p50", Unit: "s", SG: pickPhase(x.ps, func(p phases) float64 { return p.create })},
			&Row{ID: "9d", Name: "… " + x.label + ": of which CONNECT + SSH handshake + auth", Stat: "p50", Unit: "s", SG: pickPhase(x.ps, func(p phases) float64 { return p.connect })},
			&Row{ID: "9d", Name: "… " + x.label + ": of which exec `true`", Stat: "p50", Unit: "s", SG: pickPhase(x.ps, func(p phases) float64 { return p.exec })},
		)
	}
	return nil
}

// ownCPU is pid's own user+system time, its children left out.
func ownCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(u+s) / clockTicks
}
