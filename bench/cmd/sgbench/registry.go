package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/sandgate/sandgate/images/imagestest"
)

// loopRegistry is go-containerregistry's in-memory registry on an httptest
// server at 127.0.0.1, plain HTTP: what images/imagestest.NewRegistry
// builds, without a testing.TB.
type loopRegistry struct {
	host string // 127.0.0.1:PORT
	srv  *httptest.Server
	tr   *http.Transport
}

func newLoopRegistry() *loopRegistry {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	return &loopRegistry{host: strings.TrimPrefix(srv.URL, "http://"), srv: srv,
		tr: http.DefaultTransport.(*http.Transport).Clone()}
}

func (r *loopRegistry) close() {
	if r == nil {
		return
	}
	r.tr.CloseIdleConnections()
	r.srv.CloseClientConnections()
	r.srv.Close()
}

// push writes img as HOST/repoAndTag and returns that reference.
func (r *loopRegistry) push(repoAndTag string, img v1.Image) (string, error) {
	ref := r.host + "/" + repoAndTag
	n, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(n, img, remote.WithTransport(r.tr)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, nil
}

// tarLayer is a gzip (fastest level) layer of entries.
func tarLayer(entries ...imagestest.Entry) (v1.Layer, error) {
	b, err := imagestest.BuildTar(entries...)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
}

// busyboxPath is where Debian's busybox-static puts its static binary.
const busyboxPath = "/bin/busybox"

// busyboxApplets get a symlink in /bin of the busybox layer.
var busyboxApplets = []string{"sh", "true", "false", "ls", "cat", "echo", "id", "env", "pwd", "mkdir", "rm", "du", "df", "sleep"}

// busyboxLayer is /bin/busybox (static, from the host) with applet
// symlinks, /etc, /tmp and /workspace.
func busyboxLayer() (v1.Layer, error) {
	b, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("busybox for the image's base layer: %w (Debian: apt-get install busybox-static)", err)
	}
	es := []imagestest.Entry{{Name: "bin/", Type: tar.TypeDir}, {Name: "bin/busybox", Body: string(b), Mode: 0o755}}
	for _, a := range busyboxApplets {
		es = append(es, imagestest.Entry{Name: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	es = append(es, imagestest.Entry{Name: "etc/", Type: tar.TypeDir}, imagestest.Entry{Name: "etc/os-release", Body: "ID=sgbench\n"},
		imagestest.Entry{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777}, imagestest.Entry{Name: "workspace/", Type: tar.TypeDir})
	return tarLayer(es...)
}

// randomLayer is one file at path of size incompressible bytes from seed.
func randomLayer(path string, size int, seed uint64) (v1.Layer, error) {
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(data); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	return tarLayer(imagestest.Entry{Name: path, Body: string(data)})
}

// benchImage is an image for linux/GOARCH of layers, bottom first.
func benchImage(layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/workspace"}
	return mutate.ConfigFile(img, cf)
}

// diskUsage is what `du -sx` counts under dir: allocated blocks (not the
// apparent size, which a sparse workspace image inflates), without
// crossing into mounts (a session's workspace is mounted inside its dir).
// apparent is the sum of the sizes, for comparison. A missing dir is 0.
func diskUsage(dir string) (alloc, apparent int64, err error) {
	var root syscall.Stat_t
	if err := syscall.Lstat(dir, &root); err != nil {
		if os.IsNotExist(err) {
			return 0, 0, nil
		}
		return 0, 0, err
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) { // a sandbox going away under us
				return nil
			}
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if st.Dev != root.Dev { // a mount point: du -x counts neither it nor below
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		alloc += st.Blocks * 512
		apparent += st.Size
		return nil
	})
	return alloc, apparent, err
}
