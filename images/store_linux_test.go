package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/images/imagestest"
)

// newStore opens a store in a fresh data dir, with no Docker credentials
// but those a test puts in $DOCKER_CONFIG.
func newStore(t *testing.T, opts ...Option) (*Store, string) {
	t.Helper()
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	data := t.TempDir()
	return openStore(t, data, opts...), data
}

func openStore(t *testing.T, data string, opts ...Option) *Store {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	s, err := Open(data, append([]Option{WithTransport(tr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// snapshot is what a failed operation must leave as it was.
type snapshot struct {
	layers []string
	tmp    []string
	index  string
}

func snap(t *testing.T, s *Store) snapshot {
	t.Helper()
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	idx, _ := os.ReadFile(s.indexPath())
	return snapshot{layers: names(s.layersDir()), tmp: names(s.tmpDir()), index: string(idx)}
}

func assertUnchanged(t *testing.T, s *Store, before snapshot) {
	t.Helper()
	after := snap(t, s)
	if !slices.Equal(before.layers, after.layers) {
		t.Errorf("layers: before %v, after %v", before.layers, after.layers)
	}
	if len(after.tmp) != 0 {
		t.Errorf("tmp/ not empty: %v", after.tmp)
	}
	if before.index != after.index {
		t.Errorf("index changed:\n%s\n->\n%s", before.index, after.index)
	}
}

func digestOf(t *testing.T, x interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	d, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// testImage is busybox plus a layer that deletes /etc/os-release, adds a
// file and makes /var opaque.
func testImage(t *testing.T) v1.Image {
	return imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin", "LANG=C.UTF-8"}, WorkingDir: "/work", Cmd: []string{"/bin/sh"}},
		imagestest.BusyboxLayer(t),
		imagestest.TarLayer(t,
			imagestest.Entry{Name: "etc/.wh.os-release"},
			imagestest.Entry{Name: "var/.wh..wh..opq"},
			imagestest.Entry{Name: "work/", Type: tar.TypeDir},
			imagestest.Entry{Name: "work/hello.txt", Body: "hello\n"},
		))
}

func TestPullInsecureRegistry_Root(t *testing.T) {
	requireRoot(t)
	reg := imagestest.NewRegistry(t)
	img := testImage(t)
	ref := reg.Push(t, "test/busybox:1", img)
	for _, tc := range []struct {
		name string
		opts PullOptions
	}{
		{"insecure", PullOptions{Insecure: true}},
		{"insecure registries", PullOptions{InsecureRegistries: []string{reg.Host}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			got, err := s.Pull(context.Background(), ref, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := digestOf(t, img).String(); got.Digest != want {
				t.Errorf("digest %s, want %s", got.Digest, want)
			}
			if got.Name != ref || got.WorkingDir != "/work" || !slices.Equal(got.Env, []string{"PATH=/bin", "LANG=C.UTF-8"}) || got.Source != "pull" {
				t.Errorf("image = %+v", got)
			}
			if len(got.LayerDirs) != 2 || got.SizeBytes < 1<<20 {
				t.Fatalf("layers %v, size %d", got.LayerDirs, got.SizeBytes)
			}
			out, err := exec.Command(filepath.Join(got.LayerDirs[0], "bin/busybox"), "echo", "ran from the layer").CombinedOutput()
			if err != nil || string(out) != "ran from the layer\n" {
				t.Errorf("busybox from the unpacked layer: %q, %v", out, err)
			}
			if l, _ := os.Readlink(filepath.Join(got.LayerDirs[0], "bin/sh")); l != "busybox" {
				t.Errorf("bin/sh -> %q", l)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(got.LayerDirs[1], "etc/os-release"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
				t.Errorf("etc/os-release in the upper layer is not a whiteout: %v %o", err, st.Mode)
			}
			buf := make([]byte, 4)
			if n, err := unix.Lgetxattr(filepath.Join(got.LayerDirs[1], "var"), opaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
				t.Errorf("var not opaque: %v", err)
			}
			for _, name := range []string{ref, strings.Replace(ref, ":1", "@"+got.Digest, 1)} {
				if g, err := s.Get(name); err != nil || g.Digest != got.Digest {
					t.Errorf("Get(%s) = %v, %v", name, g.Digest, err)
				}
			}
			if _, err := s.Get("test/busybox:2"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get of a missing image: %v, want ErrNotFound", err)
			}
			fi, err := os.Stat(s.Dir())
			if err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("%s mode %v, want 0700", s.Dir(), fi.Mode())
			}
			// A second pull fetches no layer again.
			if _, err := s.Pull(context.Background(), ref, tc.opts); err != nil {
				t.Fatal(err)
			}
			if n := len(snap(t, s).layers); n != 2 {
				t.Errorf("%d layer dirs, want 2", n)
			}
		})
	}
}

// A registry on 127.0.0.2 is not one go-containerregistry speaks plain
// HTTP to by itself: only Insecure or InsecureRegistries make it.
func TestPullPlainHTTPNeedsInsecure(t *testing.T) {
	reg := imagestest.NewRegistryAt(t, "127.0.0.2:0")
	ref := reg.Push(t, "test/plain:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})))
	s, _ := newStore(t)
	before := snap(t, s)
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "https://"+reg.Host) {
		t.Fatalf("pull over HTTPS from a plain HTTP registry: %v", err)
	}
	t.Logf("without --insecure: %v", err)
	assertUnchanged(t, s, before)
	if _, err := s.Pull(context.Background(), ref, PullOptions{InsecureRegistries: []string{"other:5000"}}); err == nil {
		t.Error("another registry's insecure entry allowed plain HTTP")
	}
	for _, opts := range []PullOptions{{Insecure: true}, {InsecureRegistries: []string{"other:5000", reg.Host}}} {
		if _, err := s.Pull(context.Background(), ref, opts); err != nil {
			t.Errorf("pull with %+v: %v", opts, err)
		}
	}
}

func TestPullMultiArchPicksHostPlatform_Root(t *testing.T) {
	requireRoot(t)
	reg := imagestest.NewRegistry(t)
	imgs := map[string]v1.Image{}
	for _, p := range []string{"linux/amd64", "linux/arm64/v8", "linux/s390x", "linux/arm/v7"} {
		plat, _ := v1.ParsePlatform(p)
		imgs[p] = imagestest.PlatformImage(t, *plat, v1.Config{},
			imagestest.TarLayer(t, imagestest.Entry{Name: "platform", Body: p}))
	}
	ref := reg.PushIndex(t, "test/multi:1", imagestest.Index(t, imgs))

	for _, tc := range []struct {
		platform *v1.Platform
		want     string
	}{
		{nil, map[string]string{"amd64": "linux/amd64", "arm64": "linux/arm64/v8", "s390x": "linux/s390x", "arm": "linux/arm/v7"}[runtime.GOARCH]},
		{&v1.Platform{OS: "linux", Architecture: "s390x"}, "linux/s390x"},
		{&v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}, "linux/arm/v7"},
	} {
		var opts []Option
		if tc.platform != nil {
			opts = append(opts, WithPlatform(*tc.platform))
		}
		s, _ := newStore(t, opts...)
		got, err := s.Pull(context.Background(), ref, PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(got.LayerDirs[0], "platform"))
		if string(b) != tc.want {
			t.Errorf("platform %v: pulled %q, want %q", tc.platform, b, tc.want)
		}
		if want := digestOf(t, imgs[tc.want]).String(); got.Digest != want {
			t.Errorf("digest %s, want the %s image's %s", got.Digest, tc.want, want)
		}
	}

	s, _ := newStore(t, WithPlatform(v1.Platform{OS: "linux", Architecture: "riscv64"}))
	before := snap(t, s)
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "no image for platform linux/riscv64") || !strings.Contains(err.Error(), "linux/s390x") {
		t.Errorf("pull for a missing platform: %v", err)
	}
	assertUnchanged(t, s, before)
}

func TestPullDigestMismatchLeavesNothing(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	good := imagestest.TarLayer(t, imagestest.Entry{Name: "good", Body: strings.Repeat("g", 100000)})
	bad := imagestest.TarLayer(t, imagestest.Entry{Name: "bad", Body: strings.Repeat("b", 100000)})
	ref := reg.Push(t, "test/corrupt:1", imagestest.Image(t, v1.Config{}, good, bad))
	reg.Corrupt(digestOf(t, bad))

	s, _ := newStore(t)
	before := snap(t, s)
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") || !strings.Contains(err.Error(), digestOf(t, bad).String()) {
		t.Fatalf("pull of a corrupted blob: %v; want a digest mismatch naming the blob", err)
	}
	t.Logf("error: %v", err)
	assertUnchanged(t, s, before)
}

func TestPullHostileLayerLeavesNothing(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "test/hostile:1", imagestest.Image(t, v1.Config{},
		imagestest.TarLayer(t, imagestest.Entry{Name: "ok", Body: "fine"}),
		imagestest.TarLayer(t,
			imagestest.Entry{Name: "link", Type: tar.TypeSymlink, Linkname: "/"},
			imagestest.Entry{Name: "link/tmp/pwned", Body: "x"})))
	s, _ := newStore(t)
	before := snap(t, s)
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "escapes") {
		t.Fatalf("pull of a hostile layer: %v", err)
	}
	assertUnchanged(t, s, before)
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Error("/tmp/pwned exists")
	}
}

func TestPullRegistryErrors(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "private/img:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})))
	reg.RequireAuth("agent", "s3cret")

	s, _ := newStore(t)
	before := snap(t, s)
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	var re *RegistryError
	if !errors.As(err, &re) || re.StatusCode != 401 || !strings.Contains(err.Error(), "401 Unauthorized") || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Errorf("pull without credentials: %v; want the registry's 401", err)
	}
	_, err = s.Pull(context.Background(), reg.Ref("private/none:1"), PullOptions{})
	if !errors.As(err, &re) || re.StatusCode != 401 {
		t.Errorf("pull of a missing image without credentials: %v", err)
	}
	assertUnchanged(t, s, before)

	// ~/.docker/config.json credentials ($DOCKER_CONFIG) are honoured.
	t.Setenv("DOCKER_CONFIG", reg.DockerConfig(t, "agent", "s3cret"))
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
		t.Errorf("pull with credentials: %v", err)
	}
	before = snap(t, s)
	_, err = s.Pull(context.Background(), reg.Ref("private/none:1"), PullOptions{})
	if !errors.As(err, &re) || re.StatusCode != 404 || !strings.Contains(err.Error(), "404 Not Found") || !strings.Contains(err.Error(), "UNKNOWN") {
		t.Errorf("pull of a missing image: %v; want the registry's 404", err)
	}
	t.Logf("404 error: %v", err)
	assertUnchanged(t, s, before)
}

func TestConcurrentPullsOfOneRefPullOnce(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	l1 := imagestest.TarLayer(t, imagestest.Entry{Name: "a", Body: strings.Repeat("a", 1<<20)})
	l2 := imagestest.TarLayer(t, imagestest.Entry{Name: "b", Body: strings.Repeat("b", 1<<20)})
	img := imagestest.Image(t, v1.Config{}, l1, l2)
	ref := reg.Push(t, "test/shared:1", img)
	s, data := newStore(t)

	var wg sync.WaitGroup
	digests := make([]string, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := s.Pull(context.Background(), ref, PullOptions{})
			digests[i], errs[i] = got.Digest, err
		}()
	}
	wg.Wait()
	for i := range 8 {
		if errs[i] != nil || digests[i] != digestOf(t, img).String() {
			t.Errorf("pull %d: %s, %v", i, digests[i], errs[i])
		}
	}
	for _, l := range []v1.Layer{l1, l2} {
		if n := reg.BlobGets(digestOf(t, l)); n != 1 {
			t.Errorf("layer %s fetched %d times, want once", digestOf(t, l), n)
		}
	}

	// Two stores on one data dir, as two processes: both succeed, the
	// layers are unpacked into one place, and tmp/ is empty.
	img2 := imagestest.Image(t, v1.Config{}, l1, imagestest.TarLayer(t, imagestest.Entry{Name: "c", Body: "c"}))
	ref2 := reg.Push(t, "test/shared:2", img2)
	others := []*Store{openStore(t, data), openStore(t, data), openStore(t, data)}
	for i, o := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = o.Pull(context.Background(), ref2, PullOptions{})
		}()
	}
	wg.Wait()
	for i := range others {
		if errs[i] != nil {
			t.Errorf("store %d: %v", i, errs[i])
		}
	}
	sn := snap(t, s)
	if len(sn.layers) != 3 || len(sn.tmp) != 0 {
		t.Errorf("layers %v, tmp %v; want 3 layers and no temporary dirs", sn.layers, sn.tmp)
	}
	if l, _ := s.List(); len(l) != 2 {
		t.Errorf("%d images, want 2", len(l))
	}
}

func TestPullCancelledWaiterLeavesOthers(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "test/cancel:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})))
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Pull(ctx, ref, PullOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("pull with a cancelled context: %v", err)
	}
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
		t.Errorf("pull after: %v", err)
	}
}

func TestPullTooManyLayers(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	var layers []v1.Layer
	for i := range 3 {
		layers = append(layers, imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: strings.Repeat("x", i+1)}))
	}
	ref := reg.Push(t, "test/deep:1", imagestest.Image(t, v1.Config{}, layers...))
	s, _ := newStore(t, WithLimits(Limits{MaxLayers: 2}))
	before := snap(t, s)
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err == nil || !strings.Contains(err.Error(), "3 layers; the limit is 2") {
		t.Errorf("pull of 3 layers with a limit of 2: %v", err)
	}
	assertUnchanged(t, s, before)
}

// writeArchives writes img as an OCI layout dir, an oci-archive and a
// docker save tar under dir.
func writeArchives(t *testing.T, dir string, img v1.Image) (layoutDir, ociArchive, dockerSave string) {
	t.Helper()
	layoutDir = filepath.Join(dir, "layout")
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociArchive = filepath.Join(dir, "image.oci.tar")
	tarDir(t, layoutDir, ociArchive)
	dockerSave = filepath.Join(dir, "image.docker.tar")
	tag, _ := name.NewTag("example/saved:1")
	if err := tarball.WriteToFile(dockerSave, tag, img); err != nil {
		t.Fatal(err)
	}
	return layoutDir, ociArchive, dockerSave
}

func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestImportFormats_Root(t *testing.T) {
	requireRoot(t)
	img := testImage(t)
	layoutDir, ociArchive, dockerSave := writeArchives(t, t.TempDir(), img)
	s, _ := newStore(t)
	want := digestOf(t, img).String()
	for _, tc := range []struct{ name, path, digest string }{
		{"local/layout:1", layoutDir, want},
		{"local/ociarchive:1", ociArchive, want},
		{"local/dockersave:1", dockerSave, ""},
	} {
		got, err := s.Import(context.Background(), tc.name, tc.path)
		if err != nil {
			t.Fatalf("import %s: %v", tc.path, err)
		}
		if got.Name != "docker.io/"+tc.name || got.Source != "import" || got.WorkingDir != "/work" || len(got.LayerDirs) != 2 {
			t.Errorf("import %s: %+v", tc.path, got)
		}
		if tc.digest != "" && got.Digest != tc.digest {
			t.Errorf("import %s: digest %s, want %s", tc.path, got.Digest, tc.digest)
		}
		if !strings.HasPrefix(got.Digest, "sha256:") || len(got.Digest) != 71 {
			t.Errorf("import %s: digest %q", tc.path, got.Digest)
		}
		out, err := exec.Command(filepath.Join(got.LayerDirs[0], "bin/busybox"), "cat", filepath.Join(got.LayerDirs[1], "work/hello.txt")).CombinedOutput()
		if err != nil || string(out) != "hello\n" {
			t.Errorf("import %s: %q, %v", tc.path, out, err)
		}
	}
	// The three imports share their layers.
	if sn := snap(t, s); len(sn.layers) != 2 || len(sn.tmp) != 0 {
		t.Errorf("layers %v tmp %v", sn.layers, sn.tmp)
	}
	// A docker save import's digest is stable.
	a, _ := s.Get("local/dockersave:1")
	b, err := s.Import(context.Background(), "local/dockersave:2", dockerSave)
	if err != nil || a.Digest != b.Digest {
		t.Errorf("re-import digest %s vs %s, %v", a.Digest, b.Digest, err)
	}
}

func TestImportMultiPlatformLayout(t *testing.T) {
	imgs := map[string]v1.Image{}
	for _, p := range []string{"linux/" + runtime.GOARCH, "linux/ppc64le"} {
		plat, _ := v1.ParsePlatform(p)
		imgs[p] = imagestest.PlatformImage(t, *plat, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "platform", Body: p}))
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(imagestest.Index(t, imgs)); err != nil {
		t.Fatal(err)
	}
	s, _ := newStore(t)
	got, err := s.Import(context.Background(), "multi", dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(got.LayerDirs[0], "platform")); string(b) != "linux/"+runtime.GOARCH {
		t.Errorf("imported %q", b)
	}
	if got.Name != "docker.io/library/multi:latest" {
		t.Errorf("name %q", got.Name)
	}
}

func TestImportFailuresLeaveNothing(t *testing.T) {
	img := imagestest.Image(t, v1.Config{},
		imagestest.TarLayer(t, imagestest.Entry{Name: "ok", Body: strings.Repeat("o", 5000)}),
		imagestest.TarLayer(t, imagestest.Entry{Name: "later", Body: strings.Repeat("l", 5000)}))
	dir := t.TempDir()
	layoutDir, _, dockerSave := writeArchives(t, dir, img)
	layers, _ := img.Layers()
	// Corrupt the second layer's blob in the layout.
	blob := filepath.Join(layoutDir, "blobs", "sha256", digestOf(t, layers[1]).Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	corruptArchive := filepath.Join(dir, "corrupt.oci.tar")
	tarDir(t, layoutDir, corruptArchive)

	// A docker save tar whose config names other diffIDs.
	hostile := imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t,
		imagestest.Entry{Name: "x", Type: tar.TypeLink, Linkname: "../../etc/passwd"}))
	hostileSave := filepath.Join(dir, "hostile.docker.tar")
	tag, _ := name.NewTag("example/hostile:1")
	if err := tarball.WriteToFile(hostileSave, tag, hostile); err != nil {
		t.Fatal(err)
	}
	notImage := filepath.Join(dir, "not-an-image.tar")
	tarDir(t, filepath.Join(layoutDir, "blobs"), notImage)

	// The corrupted blobs are read only while the store lacks their layers:
	// a layer is content-addressed by its diffID and verified once.
	s, _ := newStore(t)
	for _, tc := range []struct{ path, want string }{
		{layoutDir, "digest mismatch"},
		{corruptArchive, "digest mismatch"},
		{hostileSave, "leaves the layer"},
		{notImage, "not an OCI image layout"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		before := snap(t, s)
		_, err := s.Import(context.Background(), "broken", tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("import %s: %v; want %q", filepath.Base(tc.path), err, tc.want)
		}
		assertUnchanged(t, s, before)
	}
	if _, err := s.Import(context.Background(), "fine", dockerSave); err != nil {
		t.Error(err)
	}
}

func TestRemoveRefusedWhileInUse(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "test/used:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})))
	s, data := newStore(t)
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	img, err := s.Acquire("sess-1", ref)
	if err != nil || len(img.LayerDirs) != 1 {
		t.Fatalf("acquire: %+v, %v", img, err)
	}
	if _, err := s.Acquire("../evil", ref); err == nil {
		t.Error("acquire with a session id that is a path")
	}
	if _, err := s.Acquire("sess-2", "test/none:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("acquire of a missing image: %v", err)
	}
	// Another process (a restarted gateway, the CLI) sees the reference.
	s2 := openStore(t, data)
	_, err = s2.Remove(ref, false)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "sess-1") {
		t.Errorf("remove of an image in use: %v; want ErrInUse naming sess-1", err)
	}
	if _, err := s2.Get(ref); err != nil {
		t.Errorf("image gone after a refused remove: %v", err)
	}
	if _, err := s2.Remove(ref, true); err != nil {
		t.Errorf("forced remove: %v", err)
	}
	if _, err := s.Get(ref); !errors.Is(err, ErrNotFound) {
		t.Errorf("after remove: %v", err)
	}
	if _, err := s.Remove(ref, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("second remove: %v", err)
	}
	refs, err := s.Refs()
	if err != nil || len(refs) != 1 || refs[0].SessionID != "sess-1" || refs[0].Digest != img.Digest {
		t.Errorf("refs = %+v, %v", refs, err)
	}
	if err := s.Release("sess-1"); err != nil {
		t.Error(err)
	}
	if err := s.Release("sess-1"); err != nil {
		t.Errorf("second release: %v", err)
	}
}

func TestPruneRemovesOnlyUnreferencedLayers(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	shared := imagestest.TarLayer(t, imagestest.Entry{Name: "shared", Body: "s"})
	onlyA := imagestest.TarLayer(t, imagestest.Entry{Name: "a", Body: strings.Repeat("a", 3000)})
	onlyB := imagestest.TarLayer(t, imagestest.Entry{Name: "b", Body: "b"})
	refA := reg.Push(t, "test/a:1", imagestest.Image(t, v1.Config{}, shared, onlyA))
	refB := reg.Push(t, "test/b:1", imagestest.Image(t, v1.Config{}, shared, onlyB))
	s, data := newStore(t)
	for _, r := range []string{refA, refB} {
		if _, err := s.Pull(context.Background(), r, PullOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	diff := func(l v1.Layer) string {
		d, err := l.DiffID()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	if res, err := s.Prune(); err != nil || len(res.Layers) != 0 {
		t.Errorf("prune with everything in use: %+v, %v", res, err)
	}
	if _, err := s.Acquire("sess-b", refB); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(refA, false); err != nil {
		t.Fatal(err)
	}
	res, err := s.Prune()
	if err != nil || !slices.Equal(res.Layers, []string{diff(onlyA)}) || res.Bytes != 3000 {
		t.Errorf("prune after rm a: %+v, %v; want only a's own layer (3000 bytes)", res, err)
	}
	// The session's layers survive a forced rm and a restart.
	if _, err := s.Remove(refB, true); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, data)
	if res, err := s.Prune(); err != nil || len(res.Layers) != 0 {
		t.Errorf("prune with a session on the removed image: %+v, %v", res, err)
	}
	if sn := snap(t, s); len(sn.layers) != 2 {
		t.Errorf("layers %v, want shared and b", sn.layers)
	}
	if err := s.Release("sess-b"); err != nil {
		t.Fatal(err)
	}
	res, err = s.Prune()
	slices.Sort(res.Layers)
	want := []string{diff(shared), diff(onlyB)}
	slices.Sort(want)
	if err != nil || !slices.Equal(res.Layers, want) {
		t.Errorf("prune after release: %+v, %v; want %v", res, err, want)
	}
	if sn := snap(t, s); len(sn.layers) != 0 || len(sn.tmp) != 0 {
		t.Errorf("left: %+v", sn)
	}
}

func TestOpenClearsStaleTmp(t *testing.T) {
	s, data := newStore(t)
	stale := filepath.Join(s.tmpDir(), "layer-crashed-123")
	if err := os.MkdirAll(filepath.Join(stale, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	openStore(t, data)
	if _, err := os.Stat(stale); err == nil {
		t.Error("Open left a crashed pull's temporary dir")
	}
}

func TestPullZstdAndUncompressedLayers(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	zl, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(imagestest.Tar(t, imagestest.Entry{Name: "z", Body: strings.Repeat("zstd", 1000)}))), nil
	}, tarball.WithCompression(compression.ZStd))
	if err != nil {
		t.Fatal(err)
	}
	plain := static.NewLayer(imagestest.Tar(t, imagestest.Entry{Name: "p", Body: "plain"}), types.OCIUncompressedLayer)
	ref := reg.Push(t, "test/mixed:1", imagestest.Image(t, v1.Config{}, zl, plain))
	s, _ := newStore(t)
	got, err := s.Pull(context.Background(), ref, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{0: "z", 1: "p"} {
		if _, err := os.Stat(filepath.Join(got.LayerDirs[i], want)); err != nil {
			t.Errorf("layer %d: %v", i, err)
		}
	}
}

func TestImportRefusesDigestName(t *testing.T) {
	s, _ := newStore(t)
	if _, err := s.Import(context.Background(), "x@sha256:"+strings.Repeat("0", 64), t.TempDir()); err == nil || !strings.Contains(err.Error(), "must be a tag") {
		t.Errorf("import under a digest name: %v", err)
	}
}

// Prune waits for a pull in progress (in another store on the data dir, as
// in another process) and then keeps its layers; Open meanwhile leaves the
// pull's temporary dir alone.
func TestPruneWaitsForPullInProgress(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	slow := imagestest.TarLayer(t, imagestest.Entry{Name: "slow", Body: strings.Repeat("s", 1<<16)})
	ref := reg.Push(t, "test/slow:1", imagestest.Image(t, v1.Config{},
		imagestest.TarLayer(t, imagestest.Entry{Name: "fast", Body: "f"}), slow))
	started, release := reg.Hold(digestOf(t, slow))
	defer release()
	s, data := newStore(t)

	pullDone := make(chan error, 1)
	go func() {
		_, err := s.Pull(context.Background(), ref, PullOptions{})
		pullDone <- err
	}()
	<-started
	openStore(t, data) // must not clear tmp/ under the pull
	other := openStore(t, data)
	pruneDone := make(chan PruneResult, 1)
	go func() {
		res, err := other.Prune()
		if err != nil {
			t.Error(err)
		}
		pruneDone <- res
	}()
	select {
	case <-pruneDone:
		t.Fatal("prune ran during a pull")
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := <-pullDone; err != nil {
		t.Fatalf("pull: %v", err)
	}
	if res := <-pruneDone; len(res.Layers) != 0 {
		t.Errorf("prune removed %v, the layers of the image just pulled", res.Layers)
	}
	img, err := s.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range img.LayerDirs {
		if _, err := os.Stat(d); err != nil {
			t.Error(err)
		}
	}
}

// TestRemoveDoesNotWaitForWarmHolds: a warm sandbox's hold (AcquireWarm)
// does not refuse an `image rm`, but keeps the layers from Prune; the
// claim's Acquire of the same id makes it a session's hold, which does.
func TestRemoveDoesNotWaitForWarmHolds(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "test/warm:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})))
	ctx := context.Background()
	s, _ := newStore(t)
	if _, err := s.Pull(ctx, ref, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	// The claim: the same id, now a session's.
	if _, err := s.AcquireWarm("warm-1", ref); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire("warm-1", ref); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ref, false); !errors.Is(err, ErrInUse) {
		t.Fatalf("remove of an image a claimed warm sandbox runs: %v; want ErrInUse", err)
	}
	if err := s.Release("warm-1"); err != nil {
		t.Fatal(err)
	}
	// Unclaimed: the remove goes on, the layers stay while it lives.
	img, err := s.AcquireWarm("warm-2", ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ref, false); err != nil {
		t.Fatalf("remove of an image only a warm sandbox holds: %v", err)
	}
	if res, err := s.Prune(); err != nil || len(res.Layers) != 0 {
		t.Fatalf("prune with a warm hold: %+v, %v; want nothing removed", res, err)
	}
	for _, d := range img.LayerDirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("layer of a warm sandbox's image: %v", err)
		}
	}
	if err := s.Release("warm-2"); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Prune(); err != nil || len(res.Layers) != 1 {
		t.Errorf("prune after the warm sandbox went: %+v, %v; want its layer removed", res, err)
	}
}
