package thirdparty

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckUpstreamFailsOnOlderBase runs third_party/check-upstream as if
// go.mod required the release before the patched copy's base: the module
// proxy then lists a newer release, and the check must fail saying how to
// update. It needs the module proxy; it skips without it, except under
// CI=true.
func TestCheckUpstreamFailsOnOlderBase(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("go is not on PATH")
		}
		t.Skip("go is not on PATH")
	}
	version := strings.TrimSpace(string(run(t, "..", "go", "list", "-m", "-f", "{{.Version}}", xcryptoModule)))
	versions := strings.Fields(string(run(t, "..", "go", "list", "-m", "-versions", xcryptoModule)))
	older := ""
	for _, v := range versions[1:] {
		if v == version {
			break
		}
		if !strings.Contains(v, "-") {
			older = v
		}
	}
	if older == "" {
		msg := "the module proxy lists no release of " + xcryptoModule + " before " + version + ": " + strings.Join(versions, " ")
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	req := xcryptoModule + " " + version
	if !strings.Contains(string(gomod), req) {
		t.Fatalf("go.mod has no %q", req)
	}
	dir := t.TempDir()
	mod := filepath.Join(dir, "go.mod")
	if err := os.WriteFile(mod, []byte(strings.Replace(string(gomod), req, xcryptoModule+" "+older, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "../go.sum", filepath.Join(dir, "go.sum"))

	cmd := exec.Command("./check-upstream")
	cmd.Env = append(os.Environ(), "GOFLAGS=-modfile="+mod, "CI=true")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("check-upstream passed with go.mod requiring %s (the proxy has %s):\n%s", older, version, out)
	}
	for _, want := range []string{version + " is out", "go get " + xcryptoModule + "@", "third_party/update-x-crypto"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check-upstream's message lacks %q:\n%s", want, out)
		}
	}

}
