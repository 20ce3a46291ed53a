package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/readyfile"
)

const sshdPath = "/usr/sbin/sshd"

// sandgate is one `sandgate serve` process.
type sandgate struct {
	bin     string
	dir     string
	url     string
	token   string
	driver  string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	http    *http.Client
}

// startSandgate runs `sandgate serve` with a fresh data dir under dir.
func startSandgate(bin, dir, driver string, extra []string) (*sandgate, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	g := &sandgate{bin: bin, dir: dir, token: "bench-" + randHex(8), logPath: filepath.Join(dir, "sandgate.log"), done: make(chan struct{})}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--api-key", g.token, "--sandbox", driver, "--rate-limit", "0",
		"--max-sessions", "5000", "--max-sessions-per-tenant", "5000", "--idle-timeout", "0",
		"--sandbox-workspace-size", strconv.FormatInt(16<<30, 10),
		"--ready-file", filepath.Join(dir, "ready")}
	if help, _ := exec.Command(bin, "serve", "-h").CombinedOutput(); bytes.Contains(help, []byte("-keep-sandboxes-on-exit")) {
		// Sandboxes must not outlive the benchmark (the default keeps them
		// running for the next start).
		args = append(args, "--keep-sandboxes-on-exit=false")
	}
	args = append(args, extra...)
	logf, err := os.Create(g.logPath)
	if err != nil {
		return nil, err
	}
	g.cmd = exec.Command(bin, args...)
	g.cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir, "LANG=C.UTF-8"}
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start sandgate: %w", err)
	}
	go func() {
		_ = g.cmd.Wait()
		logf.Close()
		close(g.done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g.url, err = readyfile.Wait(ctx, filepath.Join(dir, "ready"), g.done)
	if err != nil {
		g.stop()
		return nil, fmt.Errorf("sandgate serve --sandbox %s did not get ready: %w: %s", driver, err, tailFile(g.logPath, 3))
	}
	g.http = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	// /readyz names the driver in use (auto resolves to one) to a caller
	// with a token.
	var ready struct {
		Sandbox string `json:"sandbox"`
	}
	req, err := http.NewRequest(http.MethodGet, g.url+"/readyz", nil)
	if err != nil {
		g.stop()
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := g.http.Do(req)
	if err == nil {
		_ = json.NewDecoder(resp.Body).Decode(&ready)
		resp.Body.Close()
	}
	g.driver = ready.Sandbox
	if g.driver == "" {
		g.driver = driver
	}
	return g, nil
}

func (g *sandgate) pid() int { return g.cmd.Process.Pid }

// stop sends SIGTERM and waits, then SIGKILLs the process group.
func (g *sandgate) stop() {
	if g == nil || g.cmd == nil || g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(3 * time.Minute):
		_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
		<-g.done
	}
}

type session struct {
	ID      string
	HostKey ssh.PublicKey
	KHLine  string
}

// create makes a session: POST /v1/sessions.
func (g *sandgate) create(ctx context.Context) (*session, error) { return g.createOn(ctx, "") }

// createOn makes a session on image ref ("" is the gateway's default).
func (g *sandgate) createOn(ctx context.Context, image string) (*session, error) {
	var req map[string]any
	if image != "" {
		req = map[string]any{"image": image}
	}
	return g.createWith(ctx, req)
}

// createWith makes a session with request body req (nil: `{}`).
func (g *sandgate) createWith(ctx context.Context, req map[string]any) (*session, error) {
	reqBody := "{}"
	if len(req) > 0 {
		b, err := json.Marshal(req)
		if err != nil {
			return nil, err
		}
		reqBody = string(b)
	}
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/sessions", strings.NewReader(reqBody))
	hreq.Header.Set("Authorization", "Bearer "+g.token)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := g.http.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("create session: %d %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	var s struct {
		SessionID string `json:"sessionId"`
		SSH       struct {
			KnownHostsLine string `json:"knownHostsLine"`
		} `json:"ssh"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	_, _, key, _, _, err := ssh.ParseKnownHosts([]byte(s.SSH.KnownHostsLine))
	if err != nil {
		return nil, fmt.Errorf("knownHostsLine %q: %w", s.SSH.KnownHostsLine, err)
	}
	createdMu.Lock()
	created = append(created, s.SessionID)
	createdMu.Unlock()
	return &session{ID: s.SessionID, HostKey: key, KHLine: s.SSH.KnownHostsLine}, nil
}

// created lists every session the harness made, for cleanupLeftovers.
var (
	createdMu sync.Mutex
	created   []string
)

// cleanupLeftovers kills processes still in one of our sessions' cgroups
// and detaches mounts left under dir: a safety net for sandboxes that
// survived their gateway (a crash, or a SIGKILL after a slow shutdown).
// It touches nothing else: only pids whose cgroup names one of our session
// ids, only mount points below our scratch dir.
func cleanupLeftovers(dir string) (procs, mounts int) {
	createdMu.Lock()
	ids := map[string]bool{}
	for _, id := range created {
		ids[id] = true
	}
	createdMu.Unlock()
	if len(ids) > 0 {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if err != nil {
				continue
			}
			for _, f := range strings.FieldsFunc(string(cg), func(r rune) bool { return r == '/' || r == '\n' || r == ':' }) {
				if ids[f] {
					if syscall.Kill(pid, syscall.SIGKILL) == nil {
						procs++
					}
					break
				}
			}
		}
	}
	mi, _ := os.ReadFile("/proc/thread-self/mountinfo")
	var points []string
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	// Deepest first.
	for i := len(points) - 1; i >= 0; i-- {
		if syscall.Unmount(points[i], syscall.MNT_DETACH) == nil {
			mounts++
		}
	}
	return procs, mounts
}

func (g *sandgate) delete(id string) {
	req, _ := http.NewRequest(http.MethodDelete, g.url+"/v1/sessions/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	if resp, err := g.http.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// dial opens a CONNECT tunnel to session id (TCP_NODELAY is Go's default).
func (g *sandgate) dial(id string) (net.Conn, error) {
	host := strings.TrimPrefix(g.url, "http://")
	conn, err := net.DialTimeout("tcp", host, 30*time.Second)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	req := "CONNECT /v1/sessions/" + id + " HTTP/1.1\r\nHost: " + host + "\r\nProxy-Authorization: Bearer " + g.token + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("CONNECT: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return nil, fmt.Errorf("CONNECT: %s", resp.Status)
	}
	_ = conn.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// sshClientConfig is the Go client's config: the same KEX as the OpenSSH
// runs, the host key pinned.
func sshClientConfig(user string, hostKey ssh.PublicKey, auth []ssh.AuthMethod) *ssh.ClientConfig {
	cfg := &ssh.ClientConfig{
		User:              user,
		Auth:              auth,
		HostKeyCallback:   ssh.FixedHostKey(hostKey),
		HostKeyAlgorithms: []string{hostKey.Type()},
		Timeout:           60 * time.Second,
	}
	cfg.KeyExchanges = []string{"curve25519-sha256"}
	return cfg
}

// sgClient connects the Go SSH client to session s through a tunnel.
func (g *sandgate) sshClient(s *session) (*ssh.Client, error) {
	conn, err := g.dial(s.ID)
	if err != nil {
		return nil, err
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, s.ID, sshClientConfig("sandbox", s.HostKey, nil))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// sshd is a private OpenSSH server on loopback.
type sshd struct {
	dir        string
	home       string
	port       int
	hostKey    ssh.PublicKey
	clientKey  string // private key file for OpenSSH clients
	signer     ssh.Signer
	configPath string
	logPath    string
	cmd        *exec.Cmd
	done       chan struct{}
	// preload, when set, is an LD_PRELOAD library for the sshd process
	// (the equal-footing rows' TCP_NODELAY shim).
	preload string
}

// sshdOpts are what the equal-footing sshd adds to the stock one.
type sshdOpts struct {
	preload      string // LD_PRELOAD for sshd
	localForward bool   // AllowTcpForwarding local (row e5: ssh -L)
}

// prepareSSHD writes keys and the config; start runs it.
func prepareSSHD(dir string, opts sshdOpts) (*sshd, error) {
	d := &sshd{dir: dir, home: filepath.Join(dir, "home"), logPath: filepath.Join(dir, "sshd.log"), done: make(chan struct{}), preload: opts.preload}
	forward := "no"
	if opts.localForward {
		forward = "local"
	}
	if err := os.MkdirAll(d.home, 0o755); err != nil {
		return nil, err
	}
	// A trivial rc: bash reads ~/.bashrc for `bash -c` under sshd (SSH_CLIENT
	// set; sandgate sets it too); HOME points here, not at root's slow
	// .bashrc.
	for _, f := range []string{".bashrc", ".profile", ".bash_profile"} {
		if err := os.WriteFile(filepath.Join(d.home, f), nil, 0o644); err != nil {
			return nil, err
		}
	}
	hostKeyFile := filepath.Join(dir, "ssh_host_ed25519_key")
	d.clientKey = filepath.Join(dir, "client_ed25519")
	for _, f := range []string{hostKeyFile, d.clientKey} {
		if err := writeEd25519(f); err != nil {
			return nil, err
		}
	}
	hk, err := readPub(hostKeyFile + ".pub")
	if err != nil {
		return nil, err
	}
	d.hostKey = hk
	pem, err := os.ReadFile(d.clientKey)
	if err != nil {
		return nil, err
	}
	if d.signer, err = ssh.ParsePrivateKey(pem); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(d.signer.PublicKey()), 0o600); err != nil {
		return nil, err
	}
	if d.port, err = freePort(); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`# sgbench: private sshd, loopback only
ListenAddress 127.0.0.1
Port %d
HostKey %s
PidFile %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding %s
AllowAgentForwarding no
PermitUserRC no
MaxStartups 10000
MaxSessions 100
LoginGraceTime 120
Subsystem sftp internal-sftp
SetEnv HOME=%s LANG=C.UTF-8
`, d.port, hostKeyFile, filepath.Join(dir, "sshd.pid"), filepath.Join(dir, "authorized_keys"), forward, d.home)
	d.configPath = filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(d.configPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	// Privilege separation needs /run/sshd.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		return nil, fmt.Errorf("create /run/sshd (sshd's privilege separation dir; run as root): %w", err)
	}
	if out, err := exec.Command(sshdPath, "-t", "-f", d.configPath).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sshd -t: %v: %s", err, bytes.TrimSpace(out))
	}
	return d, nil
}

func (d *sshd) addr() string { return fmt.Sprintf("127.0.0.1:%d", d.port) }

func (d *sshd) start() error {
	logf, err := os.Create(d.logPath)
	if err != nil {
		return err
	}
	d.cmd = exec.Command(sshdPath, "-D", "-e", "-f", d.configPath)
	if d.preload != "" {
		// sshd re-executes itself per connection with this environment;
		// the sessions' environment it builds afresh (no LD_PRELOAD).
		d.cmd.Env = append(os.Environ(), "LD_PRELOAD="+d.preload)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start sshd: %w", err)
	}
	go func() {
		_ = d.cmd.Wait()
		logf.Close()
		close(d.done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			return fmt.Errorf("sshd exited at start: %s", tailFile(d.logPath, 3))
		default:
		}
		if c, err := net.DialTimeout("tcp", d.addr(), time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.stop()
	return fmt.Errorf("sshd did not listen on %s: %s", d.addr(), tailFile(d.logPath, 3))
}

func (d *sshd) pid() int { return d.cmd.Process.Pid }

// stop ends the listener and every connection process it forked (they are
// in its process group; sshd's children call setsid only for ptys).
func (d *sshd) stop() {
	if d == nil || d.cmd == nil || d.cmd.Process == nil {
		return
	}
	for _, p := range descendants(d.cmd.Process.Pid) {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
}

func (d *sshd) sshClient() (*ssh.Client, error) {
	return ssh.Dial("tcp", d.addr(), sshClientConfig("root", d.hostKey, []ssh.AuthMethod{ssh.PublicKeys(d.signer)}))
}

func writeEd25519(path string) error {
	_ = os.Remove(path)
	_ = os.Remove(path + ".pub")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sgbench", "-f", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ssh-keygen: %v: %s", err, out)
	}
	return nil
}

func readPub(path string) (ssh.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(b)
	return k, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func tailFile(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	ls := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, " | ")
}

// --- process memory -------------------------------------------------------

// procStatusKB reads a "Field:   123 kB" line of /proc/pid/status.
func procStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// rssBytes is a process's VmRSS.
func rssBytes(pid int) int64 { return procStatusKB(pid, "VmRSS") * 1024 }

// pssBytes is a process's proportional set size (shared pages split
// between the processes sharing them).
func pssBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pss:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n * 1024
			}
		}
	}
	return 0
}

// cpuSeconds is pid's user+system time plus that of its reaped children.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime, stime, cutime, cstime are fields 14-17.
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, s := range f[11:15] {
		n, _ := strconv.ParseInt(s, 10, 64)
		ticks += n
	}
	return float64(ticks) / clockTicks
}

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// treeCPU is the CPU time of pid and every live descendant, each with its
// reaped children: a sandbox init that outlives the command still counts
// the command's time once the command has been reaped.
func treeCPU(pid int) float64 {
	t := cpuSeconds(pid)
	for _, d := range descendants(pid) {
		t += cpuSeconds(d)
	}
	return t
}

// settle waits (at most max) until every process below pid was already
// there in before: the run's own processes have exited and been reaped.
func settle(pid int, before map[int]bool, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		extra := false
		for _, d := range descendants(pid) {
			if !before[d] {
				extra = true
				break
			}
		}
		if !extra {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pidSet(pids []int) map[int]bool {
	m := make(map[int]bool, len(pids))
	for _, p := range pids {
		m[p] = true
	}
	return m
}

// descendants lists every process below pid.
func descendants(pid int) []int {
	parent := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pp := int(procStatusKB(p, "PPid"))
		parent[pp] = append(parent[pp], p)
	}
	var out []int
	var walk func(int)
	seen := map[int]bool{}
	walk = func(p int) {
		for _, c := range parent[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				walk(c)
			}
		}
	}
	walk(pid)
	return out
}

// treeMemory sums RSS and PSS over pids.
func treeMemory(pids []int) (rss, pss int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, p := range pids {
		wg.Add(1)
		sem <- struct{}{}
		go func(p int) {
			defer wg.Done()
			r, s := rssBytes(p), pssBytes(p)
			mu.Lock()
			rss += r
			pss += s
			mu.Unlock()
			<-sem
		}(p)
	}
	wg.Wait()
	return
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
