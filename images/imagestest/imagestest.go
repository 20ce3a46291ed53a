// Package imagestest builds container images and serves them from an
// in-process registry, for tests of the image store and of what uses it.
// Nothing here reaches the network: registries listen on 127.0.0.1.
package imagestest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry is go-containerregistry's in-memory registry on an httptest
// server at 127.0.0.1, plain HTTP, that counts blob fetches and can be
// told to misbehave.
type Registry struct {
	Host string // "127.0.0.1:PORT", for references
	srv  *httptest.Server
	tr   *http.Transport

	mu        sync.Mutex
	blobGets  map[string]int // digest -> GETs
	corrupt   map[string]bool
	user, pwd string
	holds     map[string]*hold
	intercept func(w http.ResponseWriter, req *http.Request) bool
}

type hold struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

// NewRegistry starts a registry on 127.0.0.1 that is closed at the end of
// t. go-containerregistry speaks plain HTTP to 127.0.0.1 without being
// told (as Docker does to localhost).
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	return NewRegistryAt(t, "127.0.0.1:0")
}

// NewRegistryAt starts a registry listening on addr, a loopback address:
// on 127.0.0.2 a client must be told the registry is insecure to use
// plain HTTP.
func NewRegistryAt(t testing.TB, addr string) *Registry {
	t.Helper()
	r := &Registry{blobGets: map[string]int{}, corrupt: map[string]bool{}, holds: map[string]*hold{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("registry listener: %v", err)
	}
	r.srv = httptest.NewUnstartedServer(r.wrap(h))
	r.srv.Listener.Close()
	r.srv.Listener = ln
	r.srv.Start()
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	r.tr = http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(func() {
		r.tr.CloseIdleConnections()
		r.srv.CloseClientConnections()
		r.srv.Close()
	})
	return r
}

// Ref is HOST/repoAndTag.
func (r *Registry) Ref(repoAndTag string) string { return r.Host + "/" + repoAndTag }

// RequireAuth makes every /v2/ request need HTTP basic credentials.
func (r *Registry) RequireAuth(user, password string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user, r.pwd = user, password
}

// Corrupt flips one byte in every later GET of the blob with digest d.
func (r *Registry) Corrupt(d v1.Hash) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.corrupt[d.String()] = true
}

// Hold makes GETs of the blob d wait, before they are answered, until
// release is called (or the client gives up). started is closed when the
// first such GET arrives.
func (r *Registry) Hold(d v1.Hash) (started <-chan struct{}, release func()) {
	h := &hold{started: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	r.holds[d.String()] = h
	r.mu.Unlock()
	rel := func() { h.once.Do(func() { close(h.release) }) }
	return h.started, rel
}

// BlobGets is how many GETs of the blob d the registry answered.
func (r *Registry) BlobGets(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[d.String()]
}

// Intercept makes fn see every request first; when it returns true it has
// answered the request and the registry does not. For registries that
// redirect, or answer what no registry should.
func (r *Registry) Intercept(fn func(w http.ResponseWriter, req *http.Request) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.intercept = fn
}

func (r *Registry) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		user, pwd, icpt := r.user, r.pwd, r.intercept
		r.mu.Unlock()
		if icpt != nil && icpt(w, req) {
			return
		}
		if user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != user || p != pwd {
				w.Header().Set("WWW-Authenticate", `Basic realm="imagestest"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
		}
		if i := strings.Index(req.URL.Path, "/blobs/sha256:"); i >= 0 && req.Method == http.MethodGet {
			d := req.URL.Path[i+len("/blobs/"):]
			r.mu.Lock()
			r.blobGets[d]++
			bad := r.corrupt[d]
			hd := r.holds[d]
			if hd != nil {
				select {
				case <-hd.started:
				default:
					close(hd.started)
				}
			}
			r.mu.Unlock()
			if hd != nil {
				select {
				case <-hd.release:
				case <-req.Context().Done():
				}
			}
			if bad {
				h.ServeHTTP(&flipWriter{ResponseWriter: w}, req)
				return
			}
		}
		h.ServeHTTP(w, req)
	})
}

// flipWriter flips a byte in the middle of the first body write.
type flipWriter struct {
	http.ResponseWriter
	done bool
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if !f.done && len(p) > 0 {
		q := bytes.Clone(p)
		q[len(q)/2] ^= 0xff
		f.done = true
		return f.ResponseWriter.Write(q)
	}
	return f.ResponseWriter.Write(p)
}

// Push writes img to the registry as HOST/repoAndTag and returns that
// reference.
func (r *Registry) Push(t testing.TB, repoAndTag string, img v1.Image) string {
	t.Helper()
	ref := r.Ref(repoAndTag)
	n, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(n, img, r.pushOpts()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// PushIndex writes a multi-platform index to the registry.
func (r *Registry) PushIndex(t testing.TB, repoAndTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref := r.Ref(repoAndTag)
	n, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(n, idx, r.pushOpts()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

func (r *Registry) pushOpts() []remote.Option {
	r.mu.Lock()
	defer r.mu.Unlock()
	opts := []remote.Option{remote.WithTransport(r.tr)}
	if r.user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pwd}))
	}
	return opts
}

// DockerConfig writes a Docker config.json with credentials for the
// registry into a new directory and returns it, for $DOCKER_CONFIG.
func (r *Registry) DockerConfig(t testing.TB, user, password string) string {
	t.Helper()
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, r.Host, auth)
	if err := os.WriteFile(dir+"/config.json", []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Entry is one tar entry of a hand-made layer.
type Entry struct {
	Name     string
	Type     byte   // tar.TypeReg when zero
	Body     string // a regular file's content
	Linkname string // symlink or hard link target
	Mode     int64  // 0644 (files) or 0755 (dirs) when zero
	UID, GID int
	Devmajor int64
	Devminor int64
	PAX      map[string]string // e.g. "SCHILY.xattr.user.x": "v"
}

// Tar is the uncompressed tar of entries.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	b, err := BuildTar(entries...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BuildTar is Tar for callers without a testing.TB (the benchmarks).
func BuildTar(entries ...Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.Name, Typeflag: e.Type, Linkname: e.Linkname, Mode: e.Mode,
			Uid: e.UID, Gid: e.GID, Devmajor: e.Devmajor, Devminor: e.Devminor,
			ModTime: time.Unix(1700000000, 0), PAXRecords: e.PAX, Format: tar.FormatPAX,
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("tar entry %q: %w", e.Name, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Layer is a gzip layer of the tar bytes.
func Layer(t testing.TB, tarBytes []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TarLayer is Layer(Tar(entries)).
func TarLayer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	return Layer(t, Tar(t, entries...))
}

// BusyboxPath is where Debian's busybox-static package puts its binary.
const BusyboxPath = "/bin/busybox"

// BusyboxLayer is a layer with a static busybox at /bin/busybox and
// /bin/sh, /bin/ls, /bin/cat, /bin/echo symlinks to it. It fails t when
// busybox is not installed (apt-get install busybox-static).
func BusyboxLayer(t testing.TB) v1.Layer {
	t.Helper()
	b, err := os.ReadFile(BusyboxPath)
	if err != nil {
		t.Fatalf("busybox for a base layer: %v (install Debian's busybox-static)", err)
	}
	entries := []Entry{
		{Name: "bin/", Type: tar.TypeDir},
		{Name: "bin/busybox", Body: string(b), Mode: 0o755},
	}
	for _, n := range []string{"sh", "ls", "cat", "echo"} {
		entries = append(entries, Entry{Name: "bin/" + n, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	entries = append(entries, Entry{Name: "etc/", Type: tar.TypeDir}, Entry{Name: "etc/os-release", Body: "ID=imagestest\n"})
	return TarLayer(t, entries...)
}

// RandomLayer is a layer with one file, path, of size random
// (incompressible) bytes from seed.
func RandomLayer(t testing.TB, path string, size int, seed uint64) v1.Layer {
	t.Helper()
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(data); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	return TarLayer(t, Entry{Name: path, Body: string(data)})
}

// Image is an image of layers, bottom first, for the host's platform
// (linux/GOARCH) with config c.
func Image(t testing.TB, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	return PlatformImage(t, v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, c, layers...)
}

// PlatformImage is Image for platform p.
func PlatformImage(t testing.TB, p v1.Platform, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = c
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Index is a multi-platform index of images, each with its platform.
func Index(t testing.TB, imgs map[string]v1.Image) v1.ImageIndex {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	for p, img := range imgs {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	return idx
}

// SilentListener listens on 127.0.0.1, accepts every connection and never
// answers, as a registry that hangs; it returns "127.0.0.1:PORT". Its
// connections are closed at the end of t.
func SilentListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// SparseTar is a tar, written by GNU tar --sparse in format ("gnu": the
// old GNU sparse entries; "posix": PAX sparse 1.0), of one file name of
// size bytes that holds data at the given offsets and holes elsewhere.
// It fails t when GNU tar is missing.
func SparseTar(t testing.TB, format, name string, size int64, data map[int64]string) []byte {
	t.Helper()
	if _, err := exec.LookPath("tar"); err != nil {
		t.Fatalf("GNU tar for sparse layers: %v", err)
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	for off, d := range data {
		if _, err := f.WriteAt([]byte(d), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command("tar", "--sparse", "--format="+format, "--owner=0", "--group=0", "--numeric-owner", "-cf", "-", "-C", dir, name)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tar --sparse: %v: %s", err, stderr.String())
	}
	return out.Bytes()
}
