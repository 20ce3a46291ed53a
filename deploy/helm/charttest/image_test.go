package charttest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImageMatchesChart builds the container image as `make dist` does
// (internal/ociimage, here around a stand-in file, as the image's shape
// does not depend on the binary), and checks that the chart's defaults
// run it as built: the tag it loads as (sandgate:VERSION, the chart's
// image.repository and appVersion), the entrypoint the chart's args
// follow (`serve ...`), the port the probes and Service reach, and the
// data dir the hostPath is mounted on.
func TestImageMatchesChart(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandgate")
	if err := os.WriteFile(bin, []byte("#!stand-in\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ch, err := Load(ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	version := ch.Metadata.AppVersion
	out := filepath.Join(dir, "image.tar")
	cmd := exec.Command("go", "run", "./internal/ociimage", "-arch", "amd64", "-version", version, "-o", out, bin)
	cmd.Dir = filepath.Join(ChartDir(), "..", "..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("internal/ociimage: %v\n%s", err, b)
	}
	tag, err := name.NewTag("sandgate:" + version)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("the image does not load as %s: %v", tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}

	objs, err := Render(ChartDir(), "sg", "sandgate", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	for _, o := range objs {
		if o.Kind() == "DaemonSet" {
			c = dig(o.Body, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
		}
	}
	if c == nil {
		t.Fatal("no DaemonSet")
	}
	if want := "sandgate:" + version; c["image"] != want {
		t.Errorf("chart image %v, want %s: what `docker load` of make dist's image gives", c["image"], want)
	}
	if got := cf.Config.Entrypoint; !slices.Equal(got, []string{"/usr/local/bin/sandgate"}) {
		t.Errorf("image entrypoint %v: the chart's args start at the subcommand (serve)", got)
	}
	if args := toStrings(c["args"]); len(args) == 0 || args[0] != "serve" {
		t.Errorf("chart args %v, want serve first", args)
	}
	port := dig(c, "ports").([]any)[0].(map[string]any)["containerPort"]
	if _, ok := cf.Config.ExposedPorts[fmt.Sprintf("%v/tcp", port)]; !ok {
		t.Errorf("chart port %v not among the image's exposed ports %v", port, cf.Config.ExposedPorts)
	}
	if _, ok := cf.Config.Volumes["/var/lib/sandgate"]; !ok {
		t.Errorf("image volumes %v lack /var/lib/sandgate", cf.Config.Volumes)
	}
	mounted := false
	for _, m := range c["volumeMounts"].([]any) {
		if m.(map[string]any)["mountPath"] == "/var/lib/sandgate" {
			mounted = true
		}
	}
	args := strings.Join(toStrings(c["args"]), " ")
	if !mounted || !strings.Contains(args, "--data-dir=/var/lib/sandgate") {
		t.Errorf("the chart does not mount its data dir on the image's /var/lib/sandgate (args %s)", args)
	}
	if !slices.Contains(cf.Config.Env, "SANDGATE_DATA_DIR=/var/lib/sandgate") {
		t.Errorf("image env %v", cf.Config.Env)
	}
}
