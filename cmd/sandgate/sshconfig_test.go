package main

import (
	"os"
	"os/exec"
	"path/filepath"
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
