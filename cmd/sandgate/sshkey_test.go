package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// gitSSHD serves a bare git repository (one commit, README "cloned over
// ssh") with OpenSSH's sshd on host loopback, letting in the public key
// file authz as root; it returns the repository's path and the port. It
// listens on each of also (host:port) too. sshd reads authz at each
// login, so the file may be written after this returns. A failed test
// logs sshd's output.
func gitSSHD(t *testing.T, authz string, also ...string) (repo, port string) {
	t.Helper()
	sshd := gwtest.RequireTool(t, "sshd")
	git := gwtest.RequireTool(t, "git")
	keygen := gwtest.RequireTool(t, "ssh-keygen")
	dir := t.TempDir()
	mustRun := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(cleanEnv(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	repo, work := filepath.Join(dir, "repo.git"), filepath.Join(dir, "work")
	mustRun(git, "init", "-q", "--bare", repo)
	mustRun(git, "init", "-q", work)
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("cloned over ssh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(git, "-C", work, "add", "README")
	mustRun(git, "-C", work, "commit", "-q", "-m", "first")
	mustRun(git, "-C", work, "push", "-q", repo, "HEAD:refs/heads/main")
	mustRun(git, "-C", repo, "symbolic-ref", "HEAD", "refs/heads/main")
	mustRun(keygen, "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "hostkey"))
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	ln.Close()
	conf := filepath.Join(dir, "sshd_config")
	listen := "ListenAddress 127.0.0.1:" + port + "\n"
	for _, a := range also {
		listen += "ListenAddress " + a + "\n"
	}
	if err := os.WriteFile(conf, []byte(listen+"HostKey "+filepath.Join(dir, "hostkey")+
		"\nAuthorizedKeysFile "+authz+"\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nPermitRootLogin prohibit-password\nPidFile none\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := exec.Command(sshd, "-D", "-e", "-f", conf)
	var dlog gwtest.Buffer
	d.Stderr = &dlog
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Process.Kill()
		d.Wait()
		if t.Failed() {
			t.Logf("sshd: %s", dlog.String())
		}
	})
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
			break
		}
		if i == 200 {
			t.Fatalf("sshd did not start: %s", dlog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return repo, port
}

// git22Addr is where the test's sshd listens on port 22 when it is free.
const git22Addr = "127.0.0.22:22"

// TestLinuxSSHKeySecret: an ssh-key secret is offered by the gateway's
// agent at SSH_AUTH_SOCK, so git clones over SSH with a key that is not
// readable anywhere in the sandbox; the agent signs only while the
// session has a connection open to the secret's host; a session without
// the secret has no agent (issue 42 item 2).
func TestLinuxSSHKeySecret(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	keygen := gwtest.RequireTool(t, "ssh-keygen")
	gwtest.RequireTool(t, "busybox")
	dir := t.TempDir()
	key := filepath.Join(dir, "deploy")
	if out, err := exec.Command(keygen, "-q", "-t", "ed25519", "-N", "", "-C", "deploy", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	// git.test:22 too, on an address of its own, where port 22 is free:
	// the clone of the issue, `git clone user@host:repo.git`, with no port.
	var also []string
	if ln, err := net.Listen("tcp", git22Addr); err == nil {
		ln.Close()
		also = append(also, git22Addr)
	} else {
		t.Logf("%s is taken (%v): no clone on port 22", git22Addr, err)
	}
	repo, port := gitSSHD(t, key+".pub", also...)
	echoPort := lineEcho(t)
	secrets := filepath.Join(dir, "secrets")
	if err := os.WriteFile(secrets, []byte("DEPLOY_KEY@git.test:"+port+",git22.test:22=ssh-key:"+key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, "--sandbox", "linux", "--egress-allow-cidr", "127.0.0.1/32", "--egress-allow-cidr", "127.0.0.22/32", "--secrets-file", secrets,
		"--egress-resolve", "git.test=127.0.0.1", "--egress-resolve", "echo.test=127.0.0.1", "--egress-resolve", "git22.test=127.0.0.22")

	// Asked for with a header, or as an environment variable: refused.
	for _, c := range []struct {
		secret any
		code   string
	}{
		{map[string]any{"name": "DEPLOY_KEY", "hosts": []string{"git.test:" + port}, "header": "X-Key"}, "invalid_secret"},
		{"DEPLOY_KEY", "secret_pinned"},
	} {
		var e apiError
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"git.test:" + port}, "secrets": []any{c.secret}}, &e); code != http.StatusBadRequest || e.Error.Code != c.code {
			t.Errorf("create with %v: %d %+v, want 400 %s", c.secret, code, e, c.code)
		}
	}

	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{
		"egress":  []string{"git.test:" + port, "echo.test:" + echoPort, "git22.test:22"},
		"secrets": []any{map[string]any{"name": "DEPLOY_KEY", "hosts": []string{"git.test:" + port, "git22.test:22"}}},
	}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	run := func(s sessionJSON, cmd string) (string, string, int) {
		t.Helper()
		return runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s), s.SessionID,
			"unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy; "+cmd)...)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, _ := run(s.sessionJSON, `ssh-add -L`); !strings.HasPrefix(out, strings.Join(strings.Fields(string(pub))[:2], " ")+" DEPLOY_KEY") {
		t.Fatalf("ssh-add -L in the sandbox: %q %q, want the key's public half", out, errOut)
	}
	if out, errOut, _ := run(s.sessionJSON, `stat -c '%u %a' "${SSH_AUTH_SOCK%/*}" "$SSH_AUTH_SOCK"`); out != "1000 700\n1000 755\n" {
		t.Errorf("the agent's directory and socket: %q %q, want the sandbox user's, the directory 0700", out, errOut)
	}
	sshCmd := "ssh -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=/tmp/known_hosts -o BatchMode=yes -o LogLevel=ERROR"
	if out, errOut, _ := run(s.sessionJSON, "GIT_SSH_COMMAND='"+sshCmd+"' git clone -q ssh://root@git.test:"+port+repo+
		" /workspace/clone && cat /workspace/clone/README"); out != "cloned over ssh\n" {
		t.Fatalf("git clone over ssh with the agent: %q %q", out, errOut)
	}
	// The scp-like form, its port from the ssh command.
	if out, errOut, _ := run(s.sessionJSON, "GIT_SSH_COMMAND='"+sshCmd+" -p "+port+"' git clone -q root@git.test:"+repo+
		" /workspace/clone2 && cat /workspace/clone2/README"); out != "cloned over ssh\n" {
		t.Fatalf("git clone root@git.test:repo with the agent: %q %q", out, errOut)
	}

	if len(also) > 0 {
		if out, errOut, _ := run(s.sessionJSON, "GIT_SSH_COMMAND='"+sshCmd+"' git clone -q root@git22.test:"+repo+
			" /workspace/clone22 && cat /workspace/clone22/README"); out != "cloned over ssh\n" {
			t.Errorf("git clone root@git22.test:repo (port 22) with the agent: %q %q", out, errOut)
		}
	}

	// Signing with no connection open to git.test, or with one open to
	// another host only, is refused; with one open to git.test it is not.
	sign := "ssh-add -L > /tmp/k.pub && echo data > /tmp/d && rm -f /tmp/d.sig && ssh-keygen -Y sign -f /tmp/k.pub -n file /tmp/d"
	if _, errOut, code := run(s.sessionJSON, sign); code == 0 {
		t.Errorf("the agent signed with no connection open to git.test")
	} else if !strings.Contains(errOut, "agent refused operation") {
		t.Errorf("refused signature: %q, want the agent's refusal", errOut)
	}
	hold := func(host, port string) string {
		return "(sleep 8 | busybox nc " + host + " " + port + " >/dev/null &) ; sleep 2; "
	}
	if _, _, code := run(s.sessionJSON, hold("echo.test", echoPort)+sign); code == 0 {
		t.Errorf("the agent signed with a connection open to echo.test only")
	}
	// With one open to git.test, it signs SSH logins only (the clones
	// above): an SSHSIG signature (a file's, a commit's) would outlive the
	// connection, and is refused.
	if _, _, code := run(s.sessionJSON, hold("git.test", port)+sign); code == 0 {
		t.Errorf("the agent signed a file (ssh-keygen -Y sign) while a connection to git.test was open")
	}
	var page struct {
		Events []struct{ Kind, Op, Result, Secret, Reason string } `json:"events"`
	}
	var refused, notLogin, signed bool
	for i := 0; i < 100 && !(refused && notLogin && signed); i++ {
		g.api(t, http.MethodGet, "/v1/audit?limit=1000&session="+s.SessionID, nil, &page)
		for _, e := range page.Events {
			if e.Kind == "egress" && e.Op == "ssh-agent" && e.Secret == "DEPLOY_KEY" {
				refused = refused || e.Result == "refused" && strings.Contains(e.Reason, "no open connection to git.test:"+port)
				notLogin = notLogin || e.Result == "refused" && strings.Contains(e.Reason, "not an SSH login")
				signed = signed || e.Result == "signed"
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !refused || !notLogin || !signed {
		t.Errorf("audit: refused %v, refused as no login %v, signed %v: %+v", refused, notLogin, signed, page.Events)
	}

	// Stopped and resumed (by the next command): the agent is back.
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/stop", nil, nil); code != http.StatusOK {
		t.Fatalf("stop: %d", code)
	}
	if out, errOut, _ := run(s.sessionJSON, `ssh-add -l`); !strings.Contains(out, "DEPLOY_KEY") {
		t.Errorf("ssh-add -l after a stop and resume: %q %q", out, errOut)
	}

	// The key is nowhere in the sandbox: not in its files (the workspace,
	// /tmp, /run, /etc, the home) nor any process's environment.
	dump, _, _ := run(s.sessionJSON, "tar -cf - /workspace /tmp /run /etc /home $HOME 2>/dev/null; cat /proc/[0-9]*/environ 2>/dev/null; env")
	if len(dump) < 1000 {
		t.Fatalf("the sandbox's files: only %d bytes", len(dump))
	}
	priv, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(priv)), "\n")
	for _, l := range lines[2 : len(lines)-1] { // the base64 of the private half (past the public key's)
		if strings.Contains(dump, l) {
			t.Errorf("the private key's base64 %q is readable in the sandbox", l)
		}
	}

	// A session without the secret has no agent.
	var plain egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"git.test:" + port}}, &plain); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	if out, _, _ := run(plain.sessionJSON, `echo "${SSH_AUTH_SOCK:-none}"; ls -d /tmp/sandgate-agent.* 2>/dev/null || echo nosocket`); out != "none\nnosocket\n" {
		t.Errorf("a session without an ssh-key secret: %q, want no agent", out)
	}
}
