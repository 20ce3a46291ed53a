package thirdparty

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	xcryptoModule = "golang.org/x/crypto"
	xcryptoCopy   = "golang.org/x/crypto" // under third_party/
	xcryptoPatch  = "x-crypto.patch"
)

// TestXCryptoCopyIsUpstreamPlusPatch rebuilds the patched golang.org/x/crypto
// from the upstream module at the version go.mod requires and the recorded
// patch, and compares it with the copy the build uses, file by file. It
// fails when the copy was edited without the patch, and when the required
// version moved (upstream changed the patched functions, or any other file
// of the copy): then run third_party/update-x-crypto and mend the patch.
func TestXCryptoCopyIsUpstreamPlusPatch(t *testing.T) {
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not on PATH", tool)
			}
			t.Skipf("%s is not on PATH", tool)
		}
	}
	var mod struct {
		Version string
		Replace *struct{ Path string }
	}
	if err := json.Unmarshal(run(t, "..", "go", "list", "-m", "-json", xcryptoModule), &mod); err != nil {
		t.Fatal(err)
	}
	if mod.Replace == nil || filepath.Clean(mod.Replace.Path) != filepath.Join("third_party", xcryptoCopy) {
		t.Fatalf("go.mod must replace %s with ./third_party/%s; replace is %+v", xcryptoModule, xcryptoCopy, mod.Replace)
	}
	var dl struct{ Dir, Error string }
	out, err := exec.Command("go", "mod", "download", "-json", xcryptoModule+"@"+mod.Version).Output()
	if jerr := json.Unmarshal(out, &dl); err != nil || jerr != nil || dl.Dir == "" {
		msg := "cannot download upstream " + xcryptoModule + "@" + mod.Version + ": " + dl.Error
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}

	got := tree(t, xcryptoCopy)
	// Upstream's files for the packages the copy has (tests aside), then
	// the patch, in a scratch directory outside any git repository.
	want := t.TempDir()
	var dirs []string
	for _, name := range got {
		if dir := filepath.Dir(name); dir != "." && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(filepath.Join(dl.Dir, dir))
		if err != nil {
			t.Fatalf("upstream %s@%s has no %s: %v", xcryptoModule, mod.Version, dir, err)
		}
		for _, e := range entries {
			if e.Type().IsRegular() && !strings.HasSuffix(e.Name(), "_test.go") {
				copyFile(t, filepath.Join(dl.Dir, dir, e.Name()), filepath.Join(want, dir, e.Name()))
			}
		}
	}
	for _, f := range []string{"LICENSE", "PATENTS", "go.mod"} {
		copyFile(t, filepath.Join(dl.Dir, f), filepath.Join(want, f))
	}
	patch, err := filepath.Abs(xcryptoPatch)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := gitApply(want, patch); err != nil {
		t.Fatalf("%s no longer applies to upstream %s@%s (%v): %s\nrun third_party/update-x-crypto and mend the patch", xcryptoPatch, xcryptoModule, mod.Version, err, out)
	}

	wantFiles := tree(t, want)
	for _, name := range wantFiles {
		if !slices.Contains(got, name) {
			t.Errorf("third_party/%s lacks %s (upstream %s has it): run third_party/update-x-crypto", xcryptoCopy, name, mod.Version)
			continue
		}
		a, _ := os.ReadFile(filepath.Join(xcryptoCopy, name))
		b, _ := os.ReadFile(filepath.Join(want, name))
		if !bytes.Equal(a, b) {
			t.Errorf("third_party/%s/%s differs from upstream %s plus %s: run third_party/update-x-crypto (and put deliberate changes in the patch)", xcryptoCopy, name, mod.Version, xcryptoPatch)
		}
	}
	for _, name := range got {
		if !slices.Contains(wantFiles, name) {
			t.Errorf("third_party/%s/%s is neither upstream's nor the patch's", xcryptoCopy, name)
		}
	}
}

// gitApply applies patch (a/ and b/ prefixed paths) to the files in dir.
func gitApply(dir, patch string) ([]byte, error) {
	cmd := exec.Command("git", "apply", "-p1", patch)
	cmd.Dir = dir
	// Outside a repository git apply works like patch(1); make sure no
	// GIT_DIR from the environment points it at one.
	cmd.Env = append(os.Environ(), "GIT_DIR=", "GIT_WORK_TREE=", "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir))
	return cmd.CombinedOutput()
}

// tree lists the regular files under root, as slash paths relative to it.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}
