package main

import (
	"bytes"
	"crypto/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

func TestOpenSSHExec(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	opts := append(g.sshOpts(t, s), s.SessionID)
	tests := []struct {
		cmd, stdout, stderr string
		code                int
	}{
		{"uname -s", "Linux\n", "", 0},
		{"echo out; echo err >&2; exit 3", "out\n", "err\n", 3},
		{"exit 0", "", "", 0},
		{"no-such-command-xyz 2>/dev/null", "", "", 127},
	}
	for _, tt := range tests {
		out, errOut, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, tt.cmd)...)
		if out != tt.stdout || errOut != tt.stderr || code != tt.code {
			t.Errorf("ssh %q = (%q, %q, %d), want (%q, %q, %d)", tt.cmd, out, errOut, code, tt.stdout, tt.stderr, tt.code)
		}
	}
	// stdin reaches the command, EOF included.
	out, _, code := runClient(t, g.clientEnv(), strings.NewReader("a\nb\n"), ssh, append(opts, "wc -l")...)
	if strings.TrimSpace(out) != "2" || code != 0 {
		t.Errorf("wc -l = %q, %d", out, code)
	}
}

func TestOpenSSHPTYShell(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	opts := append(g.sshOpts(t, s), "-tt", s.SessionID)
	out, _, code := runClient(t, g.clientEnv(), strings.NewReader("tty; echo sum=$((40+2))\nexit 4\n"), ssh, opts...)
	if code != 4 || !strings.Contains(out, "sum=42") || !strings.Contains(out, "/dev/pts/") {
		t.Fatalf("ssh -tt: code %d, output %q", code, out)
	}
}

func TestOpenSSHSFTPBatch(t *testing.T) {
	sftp := gwtest.RequireTool(t, "sftp")
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	dir := t.TempDir()
	data := make([]byte, 3<<20)
	rand.Read(data)
	local := filepath.Join(dir, "local.bin")
	os.WriteFile(local, data, 0o644)
	batch := strings.Join([]string{
		"put " + local + " up.bin",
		"mkdir d",
		"rename up.bin d/moved.bin",
		"ln -s d/moved.bin link.bin",
		"chmod 600 d/moved.bin",
		"ls -l d",
		"get link.bin " + filepath.Join(dir, "back.bin"),
		"put " + local + " gone.bin",
		"rm gone.bin",
		"mkdir empty",
		"rmdir empty",
		"ls",
	}, "\n") + "\n"
	batchFile := filepath.Join(dir, "batch")
	os.WriteFile(batchFile, []byte(batch), 0o644)
	out, errOut, code := runClient(t, g.clientEnv(), nil, sftp, append(g.sshOpts(t, s), "-b", batchFile, s.SessionID)...)
	if code != 0 {
		t.Fatalf("sftp -b: %d\n%s\n%s", code, out, errOut)
	}
	back, _ := os.ReadFile(filepath.Join(dir, "back.bin"))
	if !bytes.Equal(back, data) {
		t.Fatal("get returned different bytes")
	}
	if !strings.Contains(out, "-rw-------") || !strings.Contains(out, "moved.bin") {
		t.Fatalf("ls -l output: %s", out)
	}
	out, _, _ = runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s), s.SessionID, "ls; readlink link.bin; stat -c %a d/moved.bin")...)
	if out != "d\nlink.bin\nd/moved.bin\n600\n" {
		t.Fatalf("state after batch: %q", out)
	}
	// Escapes are denied: each batch line must fail.
	for _, cmd := range []string{"get ../../etc/passwd", "get /etc/passwd"} {
		os.WriteFile(batchFile, []byte(cmd+" "+filepath.Join(dir, "x")+"\n"), 0o644)
		_, _, code := runClient(t, g.clientEnv(), nil, sftp, append(g.sshOpts(t, s), "-b", batchFile, s.SessionID)...)
		if code == 0 {
			t.Errorf("sftp %q succeeded", cmd)
		}
		if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
			t.Errorf("sftp %q wrote a local file", cmd)
		}
	}
}

func TestOpenSSHSCP(t *testing.T) {
	scp := gwtest.RequireTool(t, "scp")
	g := startGateway(t)
	s := g.createSession(t)
	dir := t.TempDir()
	data := make([]byte, 2<<20)
	rand.Read(data)
	local := filepath.Join(dir, "in.bin")
	os.WriteFile(local, data, 0o644)
	for _, mode := range [][]string{nil, {"-O"}} { // SFTP protocol, then legacy scp
		opts := append(g.sshOpts(t, s), mode...)
		if _, e, code := runClient(t, g.clientEnv(), nil, scp, append(opts, local, s.SessionID+":remote.bin")...); code != 0 {
			t.Fatalf("scp %v up: %d %s", mode, code, e)
		}
		out := filepath.Join(dir, "out.bin")
		os.Remove(out)
		if _, e, code := runClient(t, g.clientEnv(), nil, scp, append(opts, s.SessionID+":remote.bin", out)...); code != 0 {
			t.Fatalf("scp %v down: %d %s", mode, code, e)
		}
		if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
			t.Fatalf("scp %v round trip differs", mode)
		}
	}
}

func TestProxyErrors(t *testing.T) {
	g := startGateway(t)
	s := g.createSession(t)
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	badToken := append(cleanEnv(), "SANDBOX_API_URL="+g.URL+"/v1", "SANDBOX_API_TOKEN=wrong")
	tests := []struct {
		name string
		env  []string
		id   string
		want string
	}{
		{"401", badToken, s.SessionID, "401"},
		{"410", g.clientEnv(), s.SessionID, "410"}, // deleted: session_gone
		{"404", g.clientEnv(), "sbx-aaaaaaaaaaaaaaaaaaaa", "404"},
	}
	for _, tt := range tests {
		out, errOut, code := runClient(t, tt.env, strings.NewReader(""), sandgateBin, "proxy", tt.id)
		if code == 0 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%s: code %d stdout %q stderr %q", tt.name, code, out, errOut)
		}
	}
}

func TestSSHConfigPinsHostKey(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	dir := t.TempDir()
	kh := filepath.Join(dir, "known_hosts")
	cfgFile := filepath.Join(dir, "config")
	_, errOut, code := runClient(t, g.clientEnv(), nil, sandgateBin, "ssh-config", "--known-hosts", kh, "--config", cfgFile)
	if code != 0 {
		t.Fatalf("ssh-config: %d %s", code, errOut)
	}
	cfg, _ := os.ReadFile(cfgFile)
	if !strings.Contains(string(cfg), "StrictHostKeyChecking yes") || strings.Contains(string(cfg), "StrictHostKeyChecking no") {
		t.Fatalf("config: %s", cfg)
	}
	out, errOut, code := runClient(t, g.clientEnv(), nil, ssh, "-F", cfgFile, "-o", "BatchMode=yes", "-o", "IdentityFile=/dev/null", s.SessionID, "echo pinned")
	if code != 0 || out != "pinned\n" {
		t.Fatalf("ssh via ssh-config: %d %q %s", code, out, errOut)
	}
	// A wrong pinned key must fail.
	os.WriteFile(kh, []byte("sbx-* ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO56iLWyvPMdaczB4NxeIAfCyaqnF0bLEb65a0AnjIMJ\n"), 0o644)
	if _, _, code := runClient(t, g.clientEnv(), nil, ssh, "-F", cfgFile, "-o", "BatchMode=yes", s.SessionID, "true"); code == 0 {
		t.Fatal("ssh accepted a host key that does not match the pinned one")
	}
}

func TestGeneratedAPIKeyPrintedOnce(t *testing.T) {
	dataDir := t.TempDir()
	g := &gatewayProc{DataDir: dataDir, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	g.start(t, []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--sandbox", "workdir", "--keep-sandboxes-on-exit=false"})
	out := g.stdout.String()
	_, token, ok := strings.Cut(strings.TrimSpace(out), "export SANDBOX_API_TOKEN=")
	if !ok || token == "" {
		t.Fatalf("no export line on stdout: %q", out)
	}
	g.Token = token
	g.createSession(t)
	g.stop(t)

	g2 := &gatewayProc{DataDir: dataDir, Token: token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	g2.start(t, []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--sandbox", "workdir", "--keep-sandboxes-on-exit=false"})
	if strings.Contains(g2.stdout.String(), token) || strings.Contains(g2.stderr.String(), token) {
		t.Fatal("the API key was printed again, or logged")
	}
	g2.createSession(t)
}

func TestIdleExpiryLeavesNothing(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t, "--idle-timeout", "2s")
	s := g.createSession(t)
	opts := append(g.sshOpts(t, s), s.SessionID)
	// Output that flows keeps the session alive past the idle limit.
	out, _, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "for i in 1 2 3 4; do echo $i; sleep 1; done")...)
	if code != 0 || out != "1\n2\n3\n4\n" {
		t.Fatalf("streaming exec: %d %q", code, out)
	}
	// So does a command in progress, silent or not, over SSH or REST: the
	// session is held until it ends.
	if out, _, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "sleep 4; echo done")...); code != 0 || out != "done\n" {
		t.Fatalf("a silent SSH command longer than the idle limit: %d %q", code, out)
	}
	if code, out := runCommand(t, g, s.SessionID, "sleep 4; echo done"); code != http.StatusOK || out != "done\n" {
		t.Fatalf("a REST command longer than the idle limit: %d %q", code, out)
	}
	if _, _, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "setsid nohup sleep 1000 >/dev/null 2>&1 & (sleep 1000 &) ; true")...); code != 0 {
		t.Fatalf("background start: %d", code)
	}
	// Poll with list: a GET of the session is activity and would keep it alive.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var list struct{ Total int }
		g.api(t, http.MethodGet, "/v1/sessions", nil, &list)
		if list.Total == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("idle session did not expire")
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	g.assertNoLeftovers(t)
	if !strings.Contains(g.stderr.String(), "session_expired") {
		t.Fatal("no session_expired log")
	}
}

func TestGracefulShutdownTellsShellUsers(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t, "--shutdown-timeout", "1s")
	s := g.createSession(t)
	pr, pw, _ := os.Pipe()
	defer pw.Close()
	cmd := newCmd(g.clientEnv(), ssh, append(g.sshOpts(t, s), "-tt", s.SessionID)...)
	cmd.Stdin = pr
	var out gwtest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	pw.WriteString("echo ready-$((1+1))\n")
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), "ready-2") {
		if time.Now().After(deadline) {
			t.Fatalf("shell not ready: %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatal("ssh client still connected after gatewayProc shutdown")
	}
	if !strings.Contains(out.String(), "shutting down") {
		t.Errorf("client was not told: %q", out.String())
	}
	g.stop(t)
}
