package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// ssh-config on a fresh HOME with no ~/.ssh: it creates ~/.ssh (0700)
// and a config (0600) holding one marked block, which a second run
// replaces (the user's own lines stay), --dry-run prints without writing,
// --remove deletes; the block names sandgate on PATH (or --binary); and
// OpenSSH reaches a session through it.
func TestSSHConfigIdempotentFreshHome(t *testing.T) {
	sshBin := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	home := t.TempDir()
	bindir := t.TempDir()
	if err := os.Symlink(sandgateBin, filepath.Join(bindir, "sandgate")); err != nil {
		t.Fatal(err)
	}
	env := append(g.clientEnv(), "HOME="+home, "PATH="+bindir+":"+os.Getenv("PATH"))
	sshDir := filepath.Join(home, ".ssh")
	cfgFile := filepath.Join(sshDir, "config")

	// --dry-run prints the block and writes nothing.
	out, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--dry-run")
	if code != 0 || !strings.Contains(out, sshConfigBegin) || !strings.Contains(out, "Host sbx-*") {
		t.Fatalf("--dry-run: %d %q %q", code, out, errOut)
	}
	if strings.Contains(out, "sbx--") {
		t.Errorf("the comment's typo is back: %q", out)
	}
	if _, err := os.Stat(sshDir); !os.IsNotExist(err) {
		t.Fatalf("--dry-run created %s: %v", sshDir, err)
	}

	for i := 0; i < 2; i++ {
		if out, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config"); code != 0 || out != "" {
			t.Fatalf("run %d: exit %d stdout %q stderr %q", i, code, out, errOut)
		}
	}
	if fi, err := os.Stat(sshDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("~/.ssh: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(cfgFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("~/.ssh/config: %v", err)
	}
	cfg, _ := os.ReadFile(cfgFile)
	if n := strings.Count(string(cfg), sshConfigBegin); n != 1 {
		t.Fatalf("%d blocks after two runs:\n%s", n, cfg)
	}
	if want := "ProxyCommand " + filepath.Join(bindir, "sandgate") + " proxy"; !strings.Contains(string(cfg), want) {
		t.Errorf("the block does not name sandgate on PATH (%s):\n%s", want, cfg)
	}

	// The user's own lines, before and after, survive a rerun and --remove.
	own := "Host mine\n    User me\n"
	if err := os.WriteFile(cfgFile, []byte(own+"\n"+string(cfg)+"# after\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--binary", "/opt/sg/sandgate"); code != 0 {
		t.Fatalf("rerun: %d %s", code, errOut)
	}
	cfg, _ = os.ReadFile(cfgFile)
	if !strings.HasPrefix(string(cfg), own) || !strings.HasSuffix(string(cfg), "# after\n") || strings.Count(string(cfg), sshConfigBegin) != 1 ||
		!strings.Contains(string(cfg), "ProxyCommand /opt/sg/sandgate proxy") {
		t.Fatalf("rerun with --binary:\n%s", cfg)
	}
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config"); code != 0 {
		t.Fatalf("rerun: %d %s", code, errOut)
	}

	// OpenSSH through the block (-F: ssh reads the passwd entry's home,
	// not $HOME).
	id := g.createSession(t).SessionID
	out, errOut, code = runClient(t, env, nil, sshBin, "-F", cfgFile, "-o", "BatchMode=yes", "-o", "IdentityFile=/dev/null", id, "echo via-config")
	if code != 0 || out != "via-config\n" {
		t.Fatalf("ssh via the block: %d %q %s", code, out, errOut)
	}

	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--remove"); code != 0 {
		t.Fatalf("--remove: %d %s", code, errOut)
	}
	cfg, _ = os.ReadFile(cfgFile)
	if string(cfg) != own+"\n# after\n" {
		t.Errorf("after --remove: %q", cfg)
	}
	if _, err := os.Stat(filepath.Join(sshDir, "sandgate_known_hosts")); !os.IsNotExist(err) {
		t.Errorf("--remove left the known_hosts file: %v", err)
	}
	if _, _, code := runClient(t, env, nil, sandgateBin, "ssh-config", "-h"); code != 0 {
		t.Errorf("ssh-config -h: exit %d", code)
	}
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--bogus"); code != 2 || !strings.Contains(errOut, "--help") {
		t.Errorf("ssh-config --bogus: exit %d %q", code, errOut)
	}
}

// `make install` puts sandgate in PREFIX/bin.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	prefix := t.TempDir()
	cmd := exec.Command("make", "-s", "-C", "../..", "install", "PREFIX="+prefix, "BIN="+sandgateBin)
	cmd.Env = cleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(prefix, "bin", "sandgate"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed sandgate: %v %v", fi, err)
	}
	out, err := exec.Command(filepath.Join(prefix, "bin", "sandgate"), "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "sandgate ") {
		t.Errorf("installed sandgate version: %q %v", out, err)
	}
}

// TestSSHConfigBeforeHostStar: the block goes before the user's first
// Host (or Match) line, so an earlier "Host *" turning host key checks
// off does not override its pinning (ssh takes each option's first
// value); global lines above stay above, and a rerun keeps its place.
func TestSSHConfigBeforeHostStar(t *testing.T) {
	sshBin := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	home := t.TempDir()
	env := append(g.clientEnv(), "HOME="+home)
	cfgFile := filepath.Join(home, ".ssh", "config")
	if err := os.MkdirAll(filepath.Dir(cfgFile), 0o700); err != nil {
		t.Fatal(err)
	}
	global := "# mine\nServerAliveCountMax 5\n\n"
	star := "  HOST=*\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
	if err := os.WriteFile(cfgFile, []byte(global+star), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--binary", sandgateBin); code != 0 {
			t.Fatalf("run %d: %d %s", i, code, errOut)
		}
	}
	cfg, _ := os.ReadFile(cfgFile)
	if !strings.HasPrefix(string(cfg), global+sshConfigBegin) || !strings.HasSuffix(string(cfg), sshConfigEnd+"\n\n"+star) || strings.Count(string(cfg), sshConfigBegin) != 1 {
		t.Fatalf("the block is not between the global lines and Host *:\n%s", cfg)
	}
	out, errOut, code := runClient(t, env, nil, sshBin, "-G", "-F", cfgFile, "sbx-abcdefghijklmnopqrst")
	if code != 0 {
		t.Fatalf("ssh -G: %d %s", code, errOut)
	}
	kh := filepath.Join(home, ".ssh", "sandgate_known_hosts")
	if !strings.Contains(out, "\nstricthostkeychecking true\n") || !strings.Contains(out, "\nuserknownhostsfile "+kh+"\n") {
		t.Errorf("ssh's effective options for a session do not pin its keys:\n%s", out)
	}
}

// TestSSHConfigKnownHostsNotOurs: ssh-config never replaces nor deletes a
// known_hosts file it did not write (--known-hosts ~/.ssh/known_hosts),
// and writes its own with a header line.
func TestSSHConfigKnownHostsNotOurs(t *testing.T) {
	g := startGateway(t)
	home := t.TempDir()
	env := append(g.clientEnv(), "HOME="+home)
	users := filepath.Join(home, ".ssh", "known_hosts")
	if err := os.MkdirAll(filepath.Dir(users), 0o700); err != nil {
		t.Fatal(err)
	}
	const theirs = "github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
	if err := os.WriteFile(users, []byte(theirs), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--known-hosts", users); code != 1 || !strings.Contains(errOut, "did not write it") {
		t.Errorf("ssh-config over the user's known_hosts: %d %q", code, errOut)
	}
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--remove", "--known-hosts", users); code != 0 {
		t.Errorf("--remove: %d %q", code, errOut)
	}
	if b, err := os.ReadFile(users); err != nil || string(b) != theirs {
		t.Fatalf("the user's known_hosts changed: %q %v", b, err)
	}
	mine := filepath.Join(home, "kh")
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--known-hosts", mine); code != 0 {
		t.Fatalf("ssh-config: %d %s", code, errOut)
	}
	b, _ := os.ReadFile(mine)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) < 2 || lines[0] != knownHostsHeader || !strings.HasPrefix(lines[1], "sbx-*,*.sandgate ssh-") {
		t.Errorf("the known_hosts written:\n%s", b)
	}
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--remove", "--known-hosts", mine); code != 0 {
		t.Fatalf("--remove: %d %s", code, errOut)
	}
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Errorf("--remove left its own known_hosts: %v", err)
	}
}

// TestKnownHostsFileParsesKeys: a host key the gateway sends is parsed
// and written afresh; one that is not exactly one key (a second line, an
// option) is refused.
func TestKnownHostsFileParsesKeys(t *testing.T) {
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
	got, err := knownHostsFile("sbx-*", []string{key + " a comment"})
	if err != nil || got != knownHostsHeader+"\nsbx-* "+key+"\n" {
		t.Errorf("knownHostsFile = %q %v", got, err)
	}
	for _, bad := range []string{
		key + "\n@cert-authority * " + key,
		key + "\r\n* " + key,
		`command="x" ` + key,
		"not a key",
		"",
	} {
		if got, err := knownHostsFile("sbx-*", []string{bad}); err == nil {
			t.Errorf("%q accepted: %q", bad, got)
		}
	}
}

// TestSSHConfigTransportWebSocket: ssh-config --transport websocket (and
// auto) writes the transport into the ProxyCommand, without fdpass, and
// OpenSSH reaches a session through the block behind a front end that
// refuses CONNECT; a bad transport is a usage error.
func TestSSHConfigTransportWebSocket(t *testing.T) {
	sshBin := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	front := noConnectFront(t, g)
	home := t.TempDir()
	env := append(cleanEnv(), "HOME="+home, "SANDBOX_API_URL="+front.URL, "SANDBOX_API_TOKEN="+g.Token)
	cfgFile := filepath.Join(home, ".ssh", "config")
	id := g.createSession(t).SessionID
	for _, tr := range []string{"websocket", "auto"} {
		out, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--binary", sandgateBin, "--transport", tr, "--dry-run")
		if code != 0 || !strings.Contains(out, " proxy --api-url "+front.URL+" --transport "+tr+" %h\n") || strings.Contains(out, "fdpass") || strings.Contains(out, "ProxyUseFdpass") {
			t.Fatalf("--transport %s --dry-run: %d %q %q", tr, code, out, errOut)
		}
		if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config", "--binary", sandgateBin, "--transport", tr); code != 0 {
			t.Fatalf("--transport %s: %d %s", tr, code, errOut)
		}
		out, errOut, code = runClient(t, env, nil, sshBin, "-F", cfgFile, "-o", "BatchMode=yes", "-o", "IdentityFile=/dev/null", id, "echo via-"+tr)
		if code != 0 || out != "via-"+tr+"\n" {
			t.Fatalf("ssh via the %s block: %d %q %s", tr, code, out, errOut)
		}
	}
	// The environment twin, as proxy's.
	out, _, code := runClient(t, append(env, "SANDBOX_TRANSPORT=websocket"), nil, sandgateBin, "ssh-config", "--dry-run")
	if code != 0 || !strings.Contains(out, "--transport websocket") {
		t.Errorf("SANDBOX_TRANSPORT=websocket: %d %q", code, out)
	}
	// connect, the default, is written too (the proxy would take
	// SANDBOX_TRANSPORT from ssh's environment) and keeps fdpass over
	// http; so is the default with SANDBOX_TRANSPORT unset.
	for _, args := range [][]string{{"--transport", "connect"}, nil} {
		out, _, code = runClient(t, append(env, "SANDBOX_API_URL="+g.URL, "SANDBOX_TRANSPORT="), nil, sandgateBin, append([]string{"ssh-config", "--dry-run"}, args...)...)
		if code != 0 || !strings.Contains(out, " --transport connect --fdpass %h\n") {
			t.Errorf("ssh-config %v: %d %q", args, code, out)
		}
	}
	// A connect block (with --fdpass) works whatever SANDBOX_TRANSPORT
	// the environment ssh runs the proxy in has.
	direct := slices.Concat(env, []string{"SANDBOX_API_URL=" + g.URL})
	if _, errOut, code := runClient(t, direct, nil, sandgateBin, "ssh-config", "--binary", sandgateBin, "--transport", "connect"); code != 0 {
		t.Fatalf("--transport connect: %d %s", code, errOut)
	}
	out, errOut, code := runClient(t, slices.Concat(direct, []string{"SANDBOX_TRANSPORT=websocket"}), nil, sshBin, "-F", cfgFile, "-o", "BatchMode=yes", "-o", "IdentityFile=/dev/null", id, "echo via-connect")
	if code != 0 || out != "via-connect\n" {
		t.Errorf("ssh via the connect block with SANDBOX_TRANSPORT=websocket: %d %q %s", code, out, errOut)
	}
	_, errOut, code = runClient(t, env, nil, sandgateBin, "ssh-config", "--dry-run", "--transport", "bogus")
	if code != 2 || !strings.Contains(errOut, "unknown transport") {
		t.Errorf("--transport bogus: %d %q", code, errOut)
	}
}
