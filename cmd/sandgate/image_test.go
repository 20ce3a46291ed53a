//go:build linux

package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/images/imagestest"
)

// runImage runs `sandgate image ARGS --data-dir data` and returns its
// stdout, stderr and exit code.
func runImage(t *testing.T, data string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(sandgateBin, append([]string{"image"}, append(args, "--data-dir", data)...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// The `sandgate image` commands end to end: the built binary against a
// registry in this test process, on a data dir the test also opens, as a
// running gateway would.
func TestImageCommands_Root(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (layers keep image owners and whiteouts); run the suite as root")
	}
	// On 127.0.0.2, plain HTTP needs --insecure.
	reg := imagestest.NewRegistryAt(t, "127.0.0.2:0")
	img := imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/"},
		imagestest.BusyboxLayer(t),
		imagestest.TarLayer(t, imagestest.Entry{Name: "etc/.wh.os-release"}, imagestest.Entry{Name: "app/", Type: tar.TypeDir}))
	ref := reg.Push(t, "tools/busybox:1", img)
	digest, _ := img.Digest()
	data := t.TempDir()

	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	store, err := images.Open(data, images.WithTransport(tr))
	if err != nil {
		t.Fatal(err)
	}

	// pull, from the CLI and from this process at once.
	var wg sync.WaitGroup
	var inProcErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, inProcErr = store.Pull(context.Background(), ref, images.PullOptions{InsecureRegistries: []string{reg.Host}})
	}()
	out, stderr, code := runImage(t, data, "pull", "--insecure", ref)
	wg.Wait()
	if code != 0 || inProcErr != nil {
		t.Fatalf("pull: exit %d, %s%s; in process: %v", code, out, stderr, inProcErr)
	}
	if !regexp.MustCompile(`^pulled ` + regexp.QuoteMeta(ref) + ` \(` + digest.String() + `, 2 layers, [0-9.]+ MB\) in [0-9.]+m?s\n$`).MatchString(out) {
		t.Errorf("pull printed %q", out)
	}
	t.Logf("%s", out)

	// import of a docker save tar.
	saved := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("whatever:1")
	if err := tarball.WriteToFile(saved, tag, img); err != nil {
		t.Fatal(err)
	}
	out, stderr, code = runImage(t, data, "import", "--name", "local/saved:1", saved)
	if code != 0 || !strings.HasPrefix(out, "imported docker.io/local/saved:1 (sha256:") {
		t.Errorf("import: exit %d, %q %s", code, out, stderr)
	}
	if _, _, code := runImage(t, data, "import", saved); code != 2 {
		t.Errorf("import without --name: exit %d, want 2", code)
	}

	// ls, with a session on the pulled image.
	if _, err := store.Acquire("sess-cli", ref); err != nil {
		t.Fatal(err)
	}
	out, _, code = runImage(t, data, "ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") ||
		!regexp.MustCompile(`^`+regexp.QuoteMeta(ref)+` +`+digest.String()[:19]+` +2 +[0-9.]+ MB +\d{4}-\d\d-\d\d \d\d:\d\d +1$`).MatchString(lines[1]) {
		t.Errorf("ls: exit %d\n%s", code, out)
	}
	t.Logf("ls:\n%s", out)
	out, _, _ = runImage(t, data, "ls", "--json")
	var listed []struct {
		Name      string   `json:"name"`
		LayerDirs []string `json:"layerDirs"`
		Sessions  int      `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 2 || listed[0].Name != ref || listed[0].Sessions != 1 || len(listed[0].LayerDirs) != 2 {
		t.Errorf("ls --json: %v\n%s", err, out)
	}

	// rm: refused while the session holds the image, then forced.
	out, stderr, code = runImage(t, data, "rm", ref)
	if code != 1 || !strings.Contains(stderr, "sess-cli") || !strings.Contains(stderr, "--force") {
		t.Errorf("rm of an image in use: exit %d, %q %q", code, out, stderr)
	}
	out, stderr, code = runImage(t, data, "rm", ref, "--force")
	if code != 0 || !strings.HasPrefix(out, "removed "+ref) {
		t.Errorf("rm --force: exit %d, %q %q", code, out, stderr)
	}
	// prune keeps the session's layers (shared with the import anyway),
	// then frees them once nothing uses them.
	out, _, code = runImage(t, data, "prune")
	if code != 0 || out != "pruned 0 layers, freed 0 B\n" {
		t.Errorf("prune: exit %d, %q", code, out)
	}
	if _, _, code := runImage(t, data, "rm", "local/saved:1"); code != 0 {
		t.Errorf("rm local/saved:1: exit %d", code)
	}
	if err := store.Release("sess-cli"); err != nil {
		t.Fatal(err)
	}
	out, _, code = runImage(t, data, "prune")
	if code != 0 || !regexp.MustCompile(`^pruned 2 layers, freed [0-9.]+ MB\n$`).MatchString(out) {
		t.Errorf("prune: exit %d, %q", code, out)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "images", "layers", "sha256")); len(ents) != 0 {
		t.Errorf("layers left after prune: %v", ents)
	}

	// Failures: a clear reason, exit 1.
	_, stderr, code = runImage(t, data, "pull", reg.Ref("tools/missing:1"), "--insecure")
	if code != 1 || !strings.Contains(stderr, "404 Not Found") {
		t.Errorf("pull of a missing image: exit %d, %q", code, stderr)
	}
	t.Logf("404: %s", stderr)
	_, stderr, code = runImage(t, data, "pull", ref)
	if code != 1 || !strings.Contains(stderr, "server gave HTTP response to HTTPS client") {
		t.Errorf("pull from a plain HTTP registry without --insecure: exit %d, %q", code, stderr)
	}
	if _, stderr, code := runImage(t, data, "frobnicate"); code != 2 || !strings.Contains(stderr, "unknown command") {
		t.Errorf("unknown command: exit %d, %q", code, stderr)
	}
}
