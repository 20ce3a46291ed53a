//go:build linux

package linuxns_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
)

// Each test asserts the safe outcome of what a sandbox user may try; the
// numbers refer to the list in the linux driver's issue.

func TestLinuxSandboxBasics(t *testing.T) {
	// The gateway's own environment, as a login over SSH would have set
	// it, must not reach a command: its SSH_CLIENT is the tunnel's.
	t.Setenv("SSH_CLIENT", "192.0.2.1 22 22")
	t.Setenv("SANDGATE_TEST_HOST_ONLY", "leak")
	s := linuxStack(t)
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	h := inspect(t, s, id)
	if h.hostUID < 100000 {
		t.Errorf("sandbox user is host uid %d, want >= 100000", h.hostUID)
	}
	tests := []struct {
		name, cmd, stdout string
		code              int
		signal            string
	}{
		{"uid", "id -u; id -un", "1000\nsandbox\n", 0, ""},
		{"hostname is the short id", "hostname", sandbox.ShortID(id) + "\n", 0, ""},
		{"home and cwd", `echo "$HOME $(pwd)"`, "/workspace /workspace\n", 0, ""},
		{"clean environment", `echo "$USER:$SHELL:${SANDGATE_TEST_HOST_ONLY-unset}:${SANDGATE_SESSION-unset}:${SSH_CLIENT%% *}"`, "sandbox:/bin/bash:unset:unset:127.0.0.1\n", 0, ""},
		{"exit code", "exit 42", "", 42, ""},
		{"not found", "no-such-command-xyz 2>/dev/null", "", 127, ""},
		{"signal", "kill -TERM $$", "", 143, "TERM"},
		{"sigkill", "kill -KILL $$", "", 137, "KILL"},
		{"cgroup namespace", "cat /proc/self/cgroup | cut -d: -f3 | sort -u", "/\n", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := gwtest.Exec(t, c, tt.cmd)
			if r.Code != tt.code || r.Signal != tt.signal || r.Stdout != tt.stdout {
				t.Fatalf("%q: stdout %q exit %d/%q, want %q %d/%q (stderr %q)", tt.cmd, r.Stdout, r.Code, r.Signal, tt.stdout, tt.code, tt.signal, r.Stderr)
			}
		})
	}

	t.Run("one sandbox per session", func(t *testing.T) {
		// A background job, /tmp and the workspace outlive the exec that
		// made them, and every exec runs in the same namespaces.
		r := gwtest.Exec(t, c, "sleep 100007 >/dev/null 2>&1 & echo kept > /tmp/kept; echo ws > /workspace/ws; readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/net")
		if r.Code != 0 {
			t.Fatalf("exec: %+v", r)
		}
		// The job may still be between its fork and its exec of sleep.
		r2 := gwtest.Exec(t, c, "for i in $(seq 50); do n=$(ps -eo args | grep -c '^sleep 100007'); [ $n = 1 ] && break; sleep 0.1; done; echo $n; "+
			"cat /tmp/kept /workspace/ws; readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/net")
		want := "1\nkept\nws\n" + r.Stdout
		if r2.Stdout != want {
			t.Fatalf("second exec saw %q, want %q", r2.Stdout, want)
		}
		// The host sees the workspace at Workdir, owned by the sandbox user.
		fi, err := os.Stat(filepath.Join(h.workdir, "ws"))
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != h.hostUID {
			t.Fatalf("workspace file owned by host uid %d, want %d", uid, h.hostUID)
		}
	})
}

// 1. Secrets and the host's files are out of reach.
func TestLinuxReadOnlyHostAndSecrets(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	denied := regexp.MustCompile(`(?i)permission denied|read-only file system`)
	for _, cmd := range []string{
		"cat /etc/shadow",
		"cat /etc/gshadow",
		"cat /etc/ssh/ssh_host_ed25519_key",
		"ls /etc/ssl/private",
		"touch /usr/bin/sandgate-was-here",
		"touch /etc/sandgate-was-here",
		"touch /sandgate-was-here",
		"mkdir /home",
		"touch /dev/sandgate-was-here",
		"echo x > /proc/sys/kernel/hostname",
	} {
		r := gwtest.Exec(t, c, cmd)
		if r.Code == 0 || !denied.MatchString(r.Stderr) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want permission denied or read-only", cmd, r.Code, r.Stdout, r.Stderr)
		}
	}
	for _, p := range []string{"/usr/bin/sandgate-was-here", "/etc/sandgate-was-here", "/sandgate-was-here"} {
		if _, err := os.Stat(p); err == nil {
			os.Remove(p)
			t.Errorf("%s reached the host", p)
		}
	}
	r := gwtest.Exec(t, c, "touch /workspace/ok /tmp/ok /dev/shm/ok && grep -c . /etc/passwd && head -c 20 /etc/hostname")
	if r.Code != 0 {
		t.Fatalf("writes to /workspace, /tmp and /dev/shm: %+v", r)
	}
	if n, _ := strconv.Atoi(strings.SplitN(r.Stdout, "\n", 2)[0]); n > 3 {
		t.Errorf("/etc/passwd has %d entries; want the sandbox's own (root, sandbox, nobody)", n)
	}
}

// 2. Only the sandbox's own processes are visible.
func TestLinuxProcessIsolation(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	r := gwtest.Exec(t, c, "ps -eo pid=,args=")
	var others []string
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch {
		case f[0] == "1" && strings.Contains(line, "sandbox-init"):
		case strings.Contains(line, "ps -eo"):
		default:
			others = append(others, line)
		}
	}
	if len(others) > 0 {
		t.Errorf("ps shows processes that are not the sandbox's: %q", others)
	}
	r = gwtest.Exec(t, c, "ls /proc | grep -c '^[0-9]'")
	if n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout)); n == 0 || n > 5 {
		t.Errorf("/proc lists %s processes, want the init, the shell and ls", r.Stdout)
	}
	r = gwtest.Exec(t, c, "cat /proc/1/environ")
	if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
		t.Errorf("/proc/1/environ: %+v; want permission denied", r)
	}
	r = gwtest.Exec(t, c, "tr '\\0' ' ' </proc/1/cmdline; ls /proc/1/root/ 2>&1; cat /proc/1/mountinfo >/dev/null 2>&1 || echo no-mountinfo")
	if !strings.Contains(r.Stdout, "sandbox-init") || strings.Contains(r.Stdout, "usr") {
		t.Errorf("pid 1 should be the sandbox's init, its root out of reach: %q", r.Stdout)
	}
}

// 3. A fork bomb stays in its sandbox.
func TestLinuxForkBombIsContained(t *testing.T) {
	s := linuxStack(t)
	bomb := s.CreateSession(t, nil).SessionID
	other := s.CreateSession(t, nil).SessionID
	h := inspect(t, s, bomb)
	cb, co := s.SSH(t, bomb), s.SSH(t, other)
	sess, err := cb.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Start(`bomb() { bomb | bomb & }; bomb`); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return len(h.survivors()) > 200 }) {
		t.Logf("the bomb reached %d processes", len(h.survivors()))
	}
	time.Sleep(time.Second)
	if n := len(h.survivors()); n > sandbox.DefaultPids+1 {
		t.Errorf("the bomb has %d processes; the pids limit is %d", n, sandbox.DefaultPids)
	}
	for i := range 3 {
		resp, err := http.Get(s.URL + "/healthz")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("gateway /healthz during the bomb: %v", err)
		}
		resp.Body.Close()
		if r := gwtest.Exec(t, co, "echo fine"); r.Stdout != "fine\n" {
			t.Fatalf("second session during the bomb (%d): %+v", i, r)
		}
	}
	events, _ := os.ReadFile("/sys/fs/cgroup/pids/sandgate/" + bomb + "/procs/pids.events")
	t.Logf("pids.events: %s", bytes.TrimSpace(events))
	start := time.Now()
	deleteSession(t, s, bomb)
	t.Logf("delete with the bomb running took %v", time.Since(start))
	h.checkGone(t)
}

// 4. A memory bomb is OOM-killed in its sandbox, which goes on working.
func TestLinuxMemoryBombIsKilled(t *testing.T) {
	s := linuxStack(t)
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	// tail keeps the one endless line in memory.
	r := gwtest.Exec(t, c, "head -c 2000m /dev/zero | tail")
	if r.Code != 137 && r.Signal != "KILL" {
		t.Fatalf("memory bomb: exit %d/%q, want 137 or KILL (stderr %q)", r.Code, r.Signal, r.Stderr)
	}
	oom, _ := os.ReadFile("/sys/fs/cgroup/memory/sandgate/" + id + "/procs/memory.oom_control")
	if len(oom) > 0 && !regexp.MustCompile(`oom_kill [1-9]`).Match(oom) {
		t.Errorf("memory.oom_control shows no OOM kill: %s", oom)
	}
	if r := gwtest.Exec(t, c, "echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("session after the memory bomb: %+v", r)
	}
	// A bomb started as a direct exec is reported as a signal.
	r = gwtest.Exec(t, c, "exec tail /dev/zero")
	if r.Signal != "KILL" {
		t.Fatalf("exec'd memory bomb: exit %d/%q, want signal KILL", r.Code, r.Signal)
	}
}

// 5. Nothing a session starts survives its deletion.
func TestLinuxEscapedProcessesDieOnDelete(t *testing.T) {
	s := linuxStack(t)
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	h := inspect(t, s, id)
	for _, cmd := range []string{
		"setsid nohup sleep 100001 >/dev/null 2>&1 &",
		"(sleep 100002 >/dev/null 2>&1 &) &",
		`nohup sh -c 'trap "" HUP TERM; exec sleep 100003' >/dev/null 2>&1 &`,
	} {
		if r := gwtest.Exec(t, c, cmd); r.Code != 0 {
			t.Fatalf("%q: %+v", cmd, r)
		}
	}
	marked := func() []hostProc {
		var out []hostProc
		for _, p := range hostProcesses() {
			if p.uid == h.hostUID && p.state != "Z" && regexp.MustCompile(`^sleep 10000[123]$`).MatchString(p.args) {
				out = append(out, p)
			}
		}
		return out
	}
	if !waitFor(5*time.Second, func() bool { return len(marked()) == 3 }) {
		t.Fatalf("want the 3 escaped sleeps running on the host, got %+v", marked())
	}
	deleteSession(t, s, id)
	if left := marked(); len(left) > 0 {
		t.Fatalf("survived DELETE: %+v", left)
	}
	h.checkGone(t)
}

// 6. There is no network but loopback.
func TestLinuxNoNetwork(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1/" + u.Port(), "169.254.169.254/80", "1.1.1.1/53"} {
		r := gwtest.Exec(t, c, "timeout 5 bash -c 'echo > /dev/tcp/"+addr+"'")
		if r.Code == 0 || r.Code == 124 {
			t.Errorf("connect to %s: exit %d (stderr %q), want an immediate failure", addr, r.Code, r.Stderr)
		}
	}
	r := gwtest.Exec(t, c, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
	if r.Stdout != "lo\n" {
		t.Errorf("interfaces: %q, want lo only", r.Stdout)
	}
	r = gwtest.Exec(t, c, "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"lo works\")' 2>/dev/null || echo no-python")
	if r.Stdout != "lo works\n" && r.Stdout != "no-python\n" {
		t.Errorf("loopback inside the sandbox: %+v", r)
	}
}

// 7. Two sessions see nothing of each other.
func TestLinuxSessionsAreIsolated(t *testing.T) {
	s := linuxStack(t)
	a, b := s.CreateSession(t, nil).SessionID, s.CreateSession(t, nil).SessionID
	ca, cb := s.SSH(t, a), s.SSH(t, b)
	r := gwtest.Exec(t, ca, "echo secret > /workspace/secret-a; echo secret > /tmp/secret-a; echo secret > /dev/shm/secret-a; sleep 100004 >/dev/null 2>&1 &")
	if r.Code != 0 {
		t.Fatal(r)
	}
	r = gwtest.Exec(t, cb, "ls -a /workspace /tmp /dev/shm; ps -eo args; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '")
	if strings.Contains(r.Stdout, "secret-a") || strings.Contains(r.Stdout, "100004") {
		t.Fatalf("session b sees session a: %q", r.Stdout)
	}
	ha, hb := inspect(t, s, a), inspect(t, s, b)
	if ha.pidNS == hb.pidNS || ha.hostUID == hb.hostUID {
		t.Fatalf("sessions share a pid namespace or host uid: %+v %+v", ha, hb)
	}
}

// 8. Nothing gains privileges.
func TestLinuxNoPrivileges(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	r := gwtest.Exec(t, c, "grep -E '^(NoNewPrivs|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status | tr -s '\\t' ' '")
	want := "CapInh: 0000000000000000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nCapAmb: 0000000000000000\nNoNewPrivs: 1\n"
	if r.Stdout != want {
		t.Errorf("status:\n%s\nwant:\n%s", r.Stdout, want)
	}
	for _, cmd := range []string{
		"su -c true root </dev/null",  // setuid root: no effect, and no shadow to read
		"mount -t tmpfs none /tmp",    // setuid root on Debian
		"unshare -r true",             // no nested user namespaces
		"unshare -Ur id -u",           // (the same, spelled as users do)
		"chown 0 /workspace",          // not the owner of uid 0's files
		"newgrp root </dev/null",      // setuid root
		"nsenter -t 1 -m true",        // no entering the init's namespaces
		"kill -9 1",                   // no signalling the init
		"cat /sys/fs/cgroup/pids.max", // no cgroupfs
	} {
		r := gwtest.Exec(t, c, cmd+" 2>&1; echo rc=$?")
		if strings.HasSuffix(r.Stdout, "rc=0\n") {
			t.Errorf("%q succeeded: %q", cmd, r.Stdout)
		}
	}
	r = gwtest.Exec(t, c, "for b in /usr/bin/su /usr/bin/mount /usr/bin/passwd; do [ -u $b ] && $b --help >/dev/null 2>&1; done; id -u; id -G")
	if r.Stdout != "1000\n1000\n" {
		t.Errorf("after setuid binaries: %q", r.Stdout)
	}
}

// 9. Only stdio (or the terminal) reaches a command.
func TestLinuxOnlyStdioFDs(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	check := func(t *testing.T, out, what string) {
		t.Helper()
		var fds []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[len(f)-2] != "->" {
				continue
			}
			fd, target := f[len(f)-3], f[len(f)-1]
			if strings.HasPrefix(target, "/proc/") && strings.HasSuffix(target, "/fd") {
				continue // ls reading the directory
			}
			fds = append(fds, fd+"="+regexp.MustCompile(`\[\d+\]`).ReplaceAllString(target, ""))
		}
		if strings.Join(fds, " ") != what {
			t.Errorf("open descriptors: %q, want %q (ls: %s)", fds, what, out)
		}
	}
	check(t, gwtest.Exec(t, c, "ls -l /proc/self/fd").Stdout, "0=pipe: 1=pipe: 2=pipe:")

	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm", 24, 80, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	out, _ := sess.Output("ls -l /proc/self/fd")
	check(t, strings.ReplaceAll(string(out), "\r", ""), "0=/dev/pts/0 1=/dev/pts/0 2=/dev/pts/0")
}

// 10. SFTP runs inside the sandbox, as its user.
func TestLinuxSFTP(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	fc := gwtest.SFTP(t, c)
	wd, err := fc.Getwd()
	if err != nil || wd != "/workspace" {
		t.Fatalf("start dir %q (%v), want /workspace", wd, err)
	}
	if rp, err := fc.RealPath("."); err != nil || rp != "/workspace" {
		t.Fatalf("realpath . = %q (%v)", rp, err)
	}
	f, err := fc.Create("up.txt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("uploaded\n")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r := gwtest.Exec(t, c, "stat -c '%u:%g %n' /workspace/up.txt; cat /workspace/up.txt")
	if r.Stdout != "1000:1000 /workspace/up.txt\nuploaded\n" {
		t.Fatalf("exec sees the upload as %q", r.Stdout)
	}
	if fi, err := fc.Stat("/usr/bin"); err != nil || !fi.IsDir() {
		t.Fatalf("stat /usr/bin: %v", err)
	}
	if err := fc.Symlink("/etc/shadow", "shadow-link"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"shadow-link", "/etc/shadow", "/workspace/../etc/shadow", "/proc/1/environ"} {
		f, err := fc.Open(p)
		if err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if len(b) > 0 {
				t.Errorf("read %s over SFTP: %q", p, b)
			}
			continue
		}
		if !os.IsPermission(err) && !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("open %s: %v, want permission denied", p, err)
		}
	}
	for _, p := range []string{"/etc/sandgate-was-here", "/usr/sandgate-was-here", "/sandgate-was-here"} {
		if f, err := fc.Create(p); err == nil {
			f.Close()
			t.Errorf("created %s over SFTP", p)
		}
	}
}

// Terminals: tty, window size, resize.
func TestLinuxPTY(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm-256color", 40, 100, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	// SSH_TTY names the terminal, as OpenSSH sets it; a client cannot set it.
	if err := sess.Setenv("SSH_TTY", "/dev/null"); err == nil {
		t.Log("the gateway took a client's SSH_TTY (it is not allowed by default)")
	}
	out, err := sess.Output("tty; stty size; echo $TERM; ls -ln $(tty) | cut -d' ' -f3; echo $SSH_TTY")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.ReplaceAll(string(out), "\r", ""); got != "/dev/pts/0\n40 100\nxterm-256color\n1000\n/dev/pts/0\n" {
		t.Fatalf("pty: %q", got)
	}

	sess2, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	if err := sess2.RequestPty("xterm", 24, 80, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	sess2.Stdout = &buf
	if err := sess2.Start(`for i in $(seq 100); do [ "$(stty size)" = "50 120" ] && echo RESIZED && exit 0; sleep 0.05; done; stty size; exit 1`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := sess2.WindowChange(50, 120); err != nil {
		t.Fatal(err)
	}
	if err := sess2.Wait(); err != nil || !strings.Contains(buf.String(), "RESIZED") {
		t.Fatalf("window change: %v, output %q", err, buf.String())
	}

	// An interactive login shell on a terminal.
	sh, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if err := sh.RequestPty("xterm", 24, 80, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	in, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var shOut bytes.Buffer
	sh.Stdout = &shOut
	if err := sh.Shell(); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(in, "echo shell-$((6*7)); exit 3\n")
	err = sh.Wait()
	if ee, ok := err.(*gossh.ExitError); !ok || ee.ExitStatus() != 3 || !strings.Contains(shOut.String(), "shell-42") {
		t.Fatalf("login shell: %v, output %q", err, shOut.String())
	}
}

// Signal requests reach the command.
func TestLinuxSignals(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var out gwtest.Buffer
	sess.Stdout = &out
	if err := sess.Start("echo started; exec sleep 60"); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return strings.Contains(out.String(), "started") }) {
		t.Fatal("command did not start")
	}
	time.Sleep(50 * time.Millisecond)
	if err := sess.Signal(gossh.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	err = sess.Wait()
	if ee, ok := err.(*gossh.ExitError); !ok || ee.Signal() != "USR1" {
		t.Fatalf("wait: %v, want exit-signal USR1", err)
	}
}

// The driver reports what this host enforces (serve logs it and shows it in /readyz).
func TestLinuxReport(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	rep := d.Report()
	if rep["driver"] != "linux" || rep["network"] != "none (loopback only)" {
		t.Fatalf("report: %v", rep)
	}
	limits := rep["limits"].(map[string]any)
	for _, name := range []string{"memory", "pids", "cpu", "tmp", "workspace"} {
		l, ok := limits[name].(map[string]any)
		if !ok {
			t.Fatalf("report lacks %s: %v", name, rep)
		}
		if l["enforced"] != true {
			t.Logf("%s is not enforced on this host: %v", name, l["reason"])
		}
	}
	t.Logf("report: %v", rep)
}

// TestLinuxEtcSurvivesHostRenames: the host replacing its /etc files by
// rename (as useradd, passwd, vipw and package installs do) while a
// sandbox runs must not show the sandbox a file it hid or replaced. The
// host files are renamed over with copies of themselves (same content,
// owner and mode), so the host is unchanged but for the inodes.
func TestLinuxEtcSurvivesHostRenames(t *testing.T) {
	s := linuxStack(t)
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	want := gwtest.Exec(t, c, "cat /etc/passwd /etc/group").Stdout
	if strings.Contains(want, "daemon:") || !strings.Contains(want, "sandbox:x:1000:") {
		t.Fatalf("the sandbox's passwd and group before any rename:\n%s", want)
	}
	secrets := []string{"/etc/shadow", "/etc/gshadow", "/etc/ssh/ssh_host_ed25519_key", "/etc/ssh/ssh_host_rsa_key"}
	var renamed []string
	for _, p := range append([]string{"/etc/passwd", "/etc/group"}, secrets...) {
		if _, err := os.Stat(p); err == nil {
			renameOverItself(t, p)
			renamed = append(renamed, p)
		}
	}
	if len(renamed) < 4 {
		t.Fatalf("renamed only %v on the host: the test needs passwd, group, shadow and an SSH host key (openssh-server)", renamed)
	}
	if got := gwtest.Exec(t, c, "cat /etc/passwd /etc/group").Stdout; got != want {
		t.Errorf("after the host renamed over its passwd and group, the sandbox sees:\n%s\nwant:\n%s", got, want)
	}
	if r := gwtest.Exec(t, c, "id -un; id -gn"); r.Stdout != "sandbox\nsandbox\n" {
		t.Errorf("id after the renames: %+v", r)
	}
	for _, p := range secrets {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		r := gwtest.Exec(t, c, "stat -c '%s %a' "+p+"; cat "+p)
		if r.Code == 0 || !strings.HasPrefix(r.Stdout, "0 0\n") || !strings.Contains(r.Stderr, "Permission denied") {
			t.Errorf("%s after the host renamed over it: %+v; want an empty, unreadable entry", p, r)
		}
	}
}

// renameOverItself replaces the host file p by a copy of itself, by
// rename, keeping content, owner and mode.
func renameOverItself(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(p), ".sandgate-test-"+filepath.Base(p))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := errors.Join(os.Chown(tmp, int(st.Uid), int(st.Gid)), os.Chmod(tmp, fi.Mode().Perm()), os.Rename(tmp, p)); err != nil {
		os.Remove(tmp)
		t.Fatalf("rename over %s: %v", p, err)
	}
}
