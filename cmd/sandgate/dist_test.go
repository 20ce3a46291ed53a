//go:build linux

package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// unitSettings reads dist/sandgate.service's Key=Value lines.
func unitSettings(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../dist/sandgate.service")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out
}

// The systemd unit's promises, checked by running the gateway as the
// unit would: with its capability bounding set and no_new_privs only,
// sessions run commands, snapshot their workspace, and outlive a stop
// (KillMode=process signals the gateway alone): the next start takes the
// running sandbox back. And no setting gives the service a mount
// namespace of its own, which would lose the sandboxes' mounts.
func TestSystemdUnit_Root(t *testing.T) {
	requireLinuxDriver(t)
	setpriv := gwtest.RequireTool(t, "setpriv")
	u := unitSettings(t)
	if u["KillMode"] != "process" || u["User"] != "root" || u["NoNewPrivileges"] != "yes" ||
		!strings.Contains(u["ExecStart"], "sandgate serve --data-dir /var/lib/sandgate") || u["StateDirectory"] != "sandgate" {
		t.Errorf("unit settings: %v", u)
	}
	for _, k := range []string{"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
		"ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "RootDirectory", "MountFlags"} {
		if _, ok := u[k]; ok {
			t.Errorf("%s gives the service a mount namespace of its own", k)
		}
	}
	caps := strings.Fields(u["CapabilityBoundingSet"])
	if len(caps) == 0 {
		t.Fatal("no CapabilityBoundingSet")
	}
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	if path, err := exec.LookPath("systemd-analyze"); err == nil {
		// With the binary under test in ExecStart (verify checks it exists).
		b, _ := os.ReadFile("../../dist/sandgate.service")
		unit := filepath.Join(t.TempDir(), "sandgate.service")
		os.WriteFile(unit, bytes.ReplaceAll(b, []byte("/usr/local/bin/sandgate"), []byte(sandgateBin)), 0o644)
		if out, err := exec.Command(path, "verify", unit).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("System has not been booted with systemd")) {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	// The gateway as the unit runs it: setpriv drops the capabilities
	// outside the bounding set and sets no_new_privs, then execs it.
	wrapper := filepath.Join(t.TempDir(), "sandgate")
	script := "#!/bin/sh\nexec " + setpriv + " --bounding-set " + bounding + " --no-new-privs " + sandgateBin + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	var g *gatewayProc
	serve := func(keep string) {
		t.Helper()
		g = &gatewayProc{DataDir: data, Token: "unit-key"}
		b := gwtest.StartBinary(t, wrapper, "serve", "--listen", "127.0.0.1:0", "--data-dir", data, "--api-key", g.Token,
			"--sandbox", "linux", "--keep-sandboxes-on-exit="+keep)
		g.URL, g.cmd, g.stdout, g.stderr, g.done = b.URL, b.Cmd, b.Stdout, b.Stderr, b.Done
	}
	serve("true")
	if code := g.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "w"}, nil); code != http.StatusCreated {
		t.Fatalf("create workspace: %d\n%s", code, g.stderr.String())
	}
	id, code, _ := createWith(t, g, g.Token, map[string]any{"workspace": "w"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d\n%s", code, g.stderr.String())
	}
	if a := runREST(t, g, id, map[string]any{"command": "echo kept > f; chmod 600 f; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo started"}); a.out() != "started\n" {
		t.Fatalf("command: %q", a.out())
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/snapshots", map[string]any{}, nil); code != http.StatusCreated && code != http.StatusOK {
		t.Errorf("snapshot under the unit's capabilities: %d\n%s", code, g.stderr.String())
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM) // as systemctl stop, KillMode=process
	<-g.done
	if code := g.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("stop: exit %d\n%s", code, g.stderr.String())
	}
	serve("false")
	t.Cleanup(func() { g.stop(t) })
	if a := runREST(t, g, id, map[string]any{"command": "cat f; pgrep -x sleep >/dev/null && echo still-running"}); a.out() != "kept\nstill-running\n" {
		t.Errorf("after a restart: %q\n%s", a.out(), g.stderr.String())
	}
	deleteSession(t, g, g.Token, id, "")
}

// make dist: static linux/amd64 and linux/arm64 binaries, each with a
// CycloneDX SBOM and a container image (docker-archive), SHA256SUMS that
// sha256sum -c accepts, and the unit. The amd64 image, imported into the
// gateway's own image store, runs its sandgate in a session.
func TestMakeDist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two release binaries")
	}
	gwtest.RequireTool(t, "make")
	gwtest.RequireTool(t, "sha256sum")
	dir := t.TempDir()
	cmd := exec.Command("make", "-s", "-C", "../..", "dist", "DIST_DIR="+dir, "VERSION=v0.0.0-test")
	cmd.Env = cleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, out)
	}
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		bin := filepath.Join(dir, "sandgate-v0.0.0-test-linux-"+arch)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s: not static (%v)", arch, p.Type)
			}
		}
		if f.Machine != machine {
			t.Errorf("%s: machine %v", arch, f.Machine)
		}
		f.Close()
		// The small sandbox init (cmd/sandgate-init) is embedded: only its
		// own main has this usage line.
		if b, err := os.ReadFile(bin); err != nil || !bytes.Contains(b, []byte(smallInitUsage)) {
			t.Errorf("%s: the small sandbox init is not embedded (%v)", arch, err)
		}
		var sbom struct {
			BOMFormat string `json:"bomFormat"`
			Metadata  struct {
				Component struct{ Name, Version string }
			}
			Components []struct{ Name, Version, Purl string }
		}
		b, err := os.ReadFile(bin + ".cdx.json")
		if err != nil || json.Unmarshal(b, &sbom) != nil || sbom.BOMFormat != "CycloneDX" ||
			sbom.Metadata.Component.Name != "sandgate" || sbom.Metadata.Component.Version != "v0.0.0-test" || len(sbom.Components) < 10 {
			t.Errorf("%s SBOM: %v %+v", arch, err, sbom.Metadata)
		}
		found := false
		for _, c := range sbom.Components {
			found = found || (c.Name == "golang.org/x/crypto" && strings.HasPrefix(c.Purl, "pkg:golang/golang.org/x/crypto@"))
		}
		if !found {
			t.Errorf("%s SBOM does not list golang.org/x/crypto", arch)
		}
	}
	sums, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if n := strings.Count(string(sums), "\n"); n != 7 {
		t.Errorf("SHA256SUMS has %d lines:\n%s", n, sums)
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c: %v\n%s", err, out)
	}
	if out, err := exec.Command(filepath.Join(dir, "sandgate-v0.0.0-test-linux-amd64"), "version").Output(); err != nil || string(out) != "sandgate v0.0.0-test\n" {
		t.Errorf("version: %q %v", out, err)
	}

	// The image: docker-archive (docker load, podman load), one layer with
	// the binary, configured to serve; its binary is the release's.
	imgPath := filepath.Join(dir, "sandgate-v0.0.0-test-linux-amd64.image.tar")
	img, err := tarball.ImageFromPath(imgPath, nil)
	if err != nil {
		t.Fatalf("dist image: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/sandgate" ||
		strings.Join(cf.Config.Cmd, " ") != "serve" || !slices.Contains(cf.Config.Env, "SANDGATE_DATA_DIR=/var/lib/sandgate") ||
		cf.Config.Labels["org.opencontainers.image.version"] != "v0.0.0-test" {
		t.Errorf("dist image config: %+v %+v", cf, cf.Config)
	}
	tr := tar.NewReader(mutate.Extract(img))
	var inImage []byte
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "usr/local/bin/sandgate" {
			inImage, _ = io.ReadAll(tr)
		}
	}
	if bin, _ := os.ReadFile(filepath.Join(dir, "sandgate-v0.0.0-test-linux-amd64")); !bytes.Equal(bin, inImage) {
		t.Errorf("the image's /usr/local/bin/sandgate (%d bytes) is not the release binary (%d bytes)", len(inImage), len(bin))
	}
	// The gateway's own image store reads it as docker load would.
	if os.Geteuid() == 0 {
		out, errOut, code := runImage(t, t.TempDir(), "import", "--name", "sandgate:v0.0.0-test", imgPath)
		if code != 0 || !strings.HasPrefix(out, "imported docker.io/library/sandgate:v0.0.0-test") {
			t.Errorf("image import of the dist image: exit %d %s%s", code, out, errOut)
		}
	}
}
