// Command ociimage packs a static sandgate binary into a container image
// of one layer, without a Docker daemon (go-containerregistry, as ko
// does), and writes it as a docker-archive tar that `docker load` and
// `podman load` read. `make dist` runs it for each binary it builds.
//
// Usage: go run ./internal/ociimage -arch ARCH -version V -o OUT.tar BINARY
//
// The image runs `sandgate serve` with its data dir at /var/lib/sandgate
// (a volume) on 0.0.0.0:8080; the linux driver needs the container to be
// privileged (docs/operator-guide.md).
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	arch := flag.String("arch", "amd64", "the binary's GOARCH")
	version := flag.String("version", "dev", "the image's tag and version label")
	out := flag.String("o", "", "the docker-archive tar to write")
	flag.Parse()
	if flag.NArg() != 1 || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: ociimage -arch ARCH -version V -o OUT.tar BINARY")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *arch, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

// created is SOURCE_DATE_EPOCH when set (a reproducible image), else 0.
func created() time.Time {
	if n, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(n, 0).UTC()
	}
	return time.Unix(0, 0).UTC()
}

// layerTar is the image's only layer: the binary, the data dir and /tmp.
func layerTar(bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []struct {
		name string
		mode int64
	}{{"usr/", 0o755}, {"usr/local/", 0o755}, {"usr/local/bin/", 0o755}, {"var/", 0o755}, {"var/lib/", 0o755},
		{"var/lib/sandgate/", 0o700}, {"tmp/", 0o1777}}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/sandgate", Mode: 0o755,
		Size: int64(len(bin)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func run(binPath, arch, version, out string) error {
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return err
	}
	t := created()
	lt, err := layerTar(bin, t)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(lt)), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: t}
	if arch == "arm64" {
		cf.Variant = "v8"
	}
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/local/bin/sandgate"},
		Cmd:        []string{"serve"},
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SANDGATE_DATA_DIR=/var/lib/sandgate",
			"SANDGATE_LISTEN=0.0.0.0:8080", "HOME=/var/lib/sandgate"},
		WorkingDir:   "/var/lib/sandgate",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		Volumes:      map[string]struct{}{"/var/lib/sandgate": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "sandgate",
			"org.opencontainers.image.version": version,
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.NewTag("sandgate:" + version)
	if err != nil {
		return fmt.Errorf("tag sandgate:%s: %w", version, err)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := tarball.Write(ref, img, f); err != nil {
		f.Close()
		os.Remove(out)
		return err
	}
	return f.Close()
}
