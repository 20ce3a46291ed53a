package images

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
)

// allocatedBytes is what path takes on disk (st_blocks).
func allocatedBytes(t *testing.T, path string) (size, alloc int64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Size, st.Blocks * 512
}

// readAt is n bytes of path at off.
func readAt(t *testing.T, path string, off int64, n int) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A tiny layer holding huge sparse files (GNU and PAX sparse entries) or
// long runs of zeros in a regular file unpacks with holes: the files have
// their lengths and contents, and take next to no disk (issue 34, item 7:
// a 10 KB tar took 4.3 GB on the host).
func TestPullKeepsHoles_Root(t *testing.T) {
	requireRoot(t)
	const big = 1 << 30
	data := map[int64]string{0: "head", 300 << 20: "middle", big - 4: "tail"}
	gnu := imagestest.SparseTar(t, "gnu", "sparse-gnu", big, data)
	pax := imagestest.SparseTar(t, "posix", "sparse-pax", big, data)
	zeros := make([]byte, 64<<20)
	copy(zeros[10<<20:], "data in the zeros")
	copy(zeros[len(zeros)-3:], "end")
	regular := imagestest.Tar(t, imagestest.Entry{Name: "zeros", Body: string(zeros)})
	t.Logf("tars: gnu %d bytes, pax %d bytes, regular %d bytes", len(gnu), len(pax), len(regular))

	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "test/sparse:1", imagestest.Image(t, v1.Config{},
		imagestest.Layer(t, gnu), imagestest.Layer(t, pax), imagestest.Layer(t, regular)))
	s, _ := newStore(t)
	img, err := s.Pull(context.Background(), ref, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	files := []struct {
		path string
		size int64
		data map[int64]string
	}{
		{filepath.Join(img.LayerDirs[0], "sparse-gnu"), big, data},
		{filepath.Join(img.LayerDirs[1], "sparse-pax"), big, data},
		{filepath.Join(img.LayerDirs[2], "zeros"), int64(len(zeros)), map[int64]string{10 << 20: "data in the zeros", int64(len(zeros)) - 3: "end", 0: "\x00\x00\x00\x00", 20 << 20: "\x00\x00\x00\x00"}},
	}
	for _, f := range files {
		size, alloc := allocatedBytes(t, f.path)
		t.Logf("%s: %d bytes, %d allocated", filepath.Base(f.path), size, alloc)
		if size != f.size {
			t.Errorf("%s: size %d, want %d", f.path, size, f.size)
		}
		if alloc > 1<<20 {
			t.Errorf("%s: %d bytes allocated for a file of holes; want holes kept (under 1 MiB)", f.path, alloc)
		}
		for off, want := range f.data {
			if got := readAt(t, f.path, off, len(want)); got != want {
				t.Errorf("%s at %d: %q, want %q", f.path, off, got, want)
			}
		}
	}
	if img.SizeBytes != 2*big+int64(len(zeros)) {
		t.Errorf("image SizeBytes %d, want the files' lengths %d", img.SizeBytes, 2*big+int64(len(zeros)))
	}
	used, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if used > 4<<20 {
		t.Errorf("store usage %d bytes; want the blocks only (under 4 MiB)", used)
	}
	if disk := diskUse(t, s.layersDir()); disk > 4<<20 {
		t.Errorf("layers take %d bytes on disk; want under 4 MiB", disk)
	}
}

// compressible is n bytes of text that gzip shrinks about a hundredfold
// but that is no run of zeros: it takes its size on disk.
func compressible(n int) string {
	return strings.Repeat("all work and no play makes a dull layer\n", n/40+1)[:n]
}

// incompressible is n random bytes.
func incompressible(n int, seed uint64) string {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return string(b)
}

// Layers and images past their bounds are refused with ErrTooLarge, and
// nothing of them stays: no layer dir, nothing in tmp/, the index as it
// was.
func TestPullBombsRefused(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	zeros := imagestest.TarLayer(t, imagestest.Entry{Name: "ok", Body: "fine"}, imagestest.Entry{Name: "bomb", Body: string(make([]byte, 16<<20))})
	sparse := imagestest.Layer(t, imagestest.SparseTar(t, "gnu", "sparse", 1<<30, map[int64]string{0: "x"}))
	random1 := imagestest.TarLayer(t, imagestest.Entry{Name: "r1", Body: incompressible(3<<20, 1)})
	random2 := imagestest.TarLayer(t, imagestest.Entry{Name: "r2", Body: incompressible(3<<20, 2)})
	for _, tc := range []struct {
		name   string
		lim    Limits
		layers []v1.Layer
		want   string
	}{
		{"ratio", Limits{MaxRatio: 10, RatioFloor: 1 << 20}, []v1.Layer{random1, zeros}, "uncompresses to more than 10 times"},
		{"layer", Limits{MaxLayerBytes: 8 << 20}, []v1.Layer{zeros}, "larger than the limit of the layer (8.0 MiB)"},
		{"image tar", Limits{MaxImageBytes: 5 << 20}, []v1.Layer{random1, random2}, "its limit of 5.0 MiB"},
		{"image files", Limits{MaxImageBytes: 512 << 20}, []v1.Layer{sparse}, "its files are larger than its limit of 512.0 MiB"},
		{"sparse layer", Limits{MaxLayerBytes: 512 << 20}, []v1.Layer{sparse}, "larger than the limit of the layer (512.0 MiB)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := reg.Push(t, "test/bomb:"+strings.ReplaceAll(tc.name, " ", "-"), imagestest.Image(t, v1.Config{}, tc.layers...))
			s, _ := newStore(t, WithLimits(tc.lim))
			before := snap(t, s)
			_, err := s.Pull(context.Background(), ref, PullOptions{})
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v; want ErrTooLarge saying %q", err, tc.want)
			}
			t.Logf("error: %v", err)
			assertUnchanged(t, s, before)
		})
	}
}

// The store's quota and free-space reserve refuse an unpack before it
// starts and while it writes, with ErrStoreFull and nothing left behind.
func TestPullStoreFull(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	// 4 MiB of data in a blob of a few KiB: the quota is crossed while
	// writing, not at the start.
	text := reg.Push(t, "test/text:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "text", Body: compressible(4 << 20)})))
	small := reg.Push(t, "test/small:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "small", Body: "x"})))
	for _, tc := range []struct {
		name string
		lim  StoreLimits
		ref  string
		want string
	}{
		{"quota while writing", StoreLimits{MaxBytes: 1 << 20}, text, "past its quota of 1.0 MiB"},
		{"quota before", StoreLimits{MaxBytes: 1}, small, "of its quota of 1 B"},
		{"free space", StoreLimits{MinFreeBytes: 1 << 62}, small, "the store leaves at least"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, WithStoreLimits(tc.lim))
			before := snap(t, s)
			_, err := s.Pull(context.Background(), tc.ref, PullOptions{})
			if !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v; want ErrStoreFull saying %q", err, tc.want)
			}
			t.Logf("error: %v", err)
			assertUnchanged(t, s, before)
			s.space.mu.Lock()
			inflight := s.space.inflight
			s.space.mu.Unlock()
			if inflight != 0 {
				t.Errorf("%d bytes still charged in flight", inflight)
			}
		})
	}

	// Within the quota, the store counts what its layers take.
	s, _ := newStore(t, WithStoreLimits(StoreLimits{MaxBytes: 64 << 20}))
	if _, err := s.Pull(context.Background(), text, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	used, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if used < 4<<20 || used > 5<<20 {
		t.Errorf("usage %d after a 4 MiB layer", used)
	}
	if got := s.StoreLimits(); got.MaxBytes != 64<<20 || got.MinFreeBytes <= 0 {
		t.Errorf("store limits %+v", got)
	}
}

// The default quota is half the store's filesystem, the reserve 5% of it
// up to 1 GiB.
func TestStoreLimitsDefaults(t *testing.T) {
	s, data := newStore(t)
	total, _, ok := fsSpace(data)
	if !ok {
		t.Fatal("statfs failed")
	}
	got := s.StoreLimits()
	if got.MaxBytes != total/2 || got.MinFreeBytes != min(total/20, 1<<30) {
		t.Errorf("defaults %+v for a filesystem of %d bytes", got, total)
	}
}

// The hole-keeping writer writes exactly the bytes it is given, whatever
// the alignment of zeros and data.
func TestWriteSparseKeepsContent(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	u := &unpacker{root: root}
	holes := holesSupported(t, dir)
	cases := map[string][]byte{
		"empty":      {},
		"zeros":      make([]byte, 3*blockSize+17),
		"data":       []byte(compressible(3*blockSize + 5)),
		"unaligned":  append(append(make([]byte, blockSize-3), "abcdef"...), make([]byte, 2*blockSize+1)...),
		"tail":       append(make([]byte, 5*blockSize), 'z'),
		"head":       append([]byte{'a'}, make([]byte, 5*blockSize)...),
		"alternate":  bytes.Repeat(append(make([]byte, blockSize), bytes.Repeat([]byte{'q'}, blockSize)...), 3),
		"small zero": {0, 0, 0},
	}
	for name, want := range cases {
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		// Reads of odd sizes, as a decompressor gives them.
		u.buf = make([]byte, 1000)
		n, err := u.writeData(f, &oddReader{b: want}, int64(len(want)))
		f.Close()
		if err != nil || n != int64(len(want)) {
			t.Fatalf("%s: %d, %v", name, n, err)
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: content differs (%d bytes, want %d)", name, len(got), len(want))
		}
		// The zero blocks are holes: the file takes the disk of its
		// data blocks only (one filesystem block of slack), without root.
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, name), &st); err != nil {
			t.Fatal(err)
		}
		fsBlock := max(int64(st.Blksize), blockSize)
		var dataBlocks int64
		for i := 0; i < len(want); i += blockSize {
			if !bytes.Equal(want[i:min(len(want), i+blockSize)], zeroBlock[:min(len(want), i+blockSize)-i]) {
				dataBlocks++
			}
		}
		if alloc, most := st.Blocks*512, dataBlocks*fsBlock+fsBlock; holes && alloc > most {
			t.Errorf("%s: %d bytes on disk for %d data blocks of %d bytes; want at most %d (the zero blocks as holes)",
				name, alloc, dataBlocks, blockSize, most)
		}
	}
	f, err := root.OpenFile("short", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := u.writeData(f, bytes.NewReader([]byte("abc")), 10); err == nil || !strings.Contains(err.Error(), "short file: 3 of 10") {
		t.Errorf("short data: %v", err)
	}
}

// holesSupported reports whether dir's filesystem keeps a file's holes
// (a file truncated to 1 MiB takes no block); under CI=true it must.
func holesSupported(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, "hole-probe")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	if err := os.Truncate(p, 1<<20); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s keeps no holes (a 1 MiB hole takes %d blocks): the hole checks cannot run", dir, st.Blocks)
		}
		t.Logf("%s keeps no holes: the hole checks are skipped", dir)
		return false
	}
	return true
}

type oddReader struct {
	b []byte
	i int
}

func (r *oddReader) Read(p []byte) (int, error) {
	r.i++
	n := min(len(p), 1+(r.i*37)%700, len(r.b))
	if n == 0 {
		return 0, io.EOF
	}
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// The store unpacks at most WithMaxUnpacks layers at once, all pulls
// together: a second pull's layer waits for the first's slot.
func TestMaxUnpacksAcrossPulls(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	la := imagestest.TarLayer(t, imagestest.Entry{Name: "a", Body: "a"})
	lb := imagestest.TarLayer(t, imagestest.Entry{Name: "b", Body: "b"})
	refA := reg.Push(t, "test/a:1", imagestest.Image(t, v1.Config{}, la))
	imgB := imagestest.Image(t, v1.Config{}, lb)
	refB := reg.Push(t, "test/b:1", imgB)
	cfgB, err := imgB.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	started, release := reg.Hold(digestOf(t, la))
	defer release()
	s, _ := newStore(t, WithMaxUnpacks(1))
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { _, err := s.Pull(context.Background(), refA, PullOptions{}); errA <- err }()
	<-started // A holds the only slot while its blob is held
	go func() { _, err := s.Pull(context.Background(), refB, PullOptions{}); errB <- err }()
	for reg.BlobGets(cfgB) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // B's layer would be asked for by now
	if n := reg.BlobGets(digestOf(t, lb)); n != 0 {
		t.Errorf("B's layer was fetched %d times while A held the only unpack slot", n)
	}
	release()
	for _, ch := range []chan error{errA, errB} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if n := reg.BlobGets(digestOf(t, lb)); n != 1 {
		t.Errorf("B's layer fetched %d times, want 1", n)
	}
}
