package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Error is the type of this package's sentinel errors, so they are
// constants.
type Error string

func (e Error) Error() string { return string(e) }

const (
	// ErrNotFound: no stored image has that name.
	ErrNotFound Error = "image not found"
	// ErrInUse: a session holds a reference to the image (see Acquire).
	ErrInUse Error = "image in use"
	// ErrTooLarge: the image is past a bound of Limits (a layer's or the
	// image's uncompressed size, the expansion of a layer over its
	// compressed size, entries, layers) or a manifest, index or config is
	// past its size bound. Nothing of it is kept. Its API code is
	// image_too_large.
	ErrTooLarge Error = "image too large"
	// ErrStoreFull: unpacking would take the store past its quota
	// (StoreLimits.MaxBytes) or leave the filesystem less free space than
	// StoreLimits.MinFreeBytes. Nothing of the layer is kept. Its API code
	// is image_store_full.
	ErrStoreFull Error = "image store full"
	// ErrPullTimeout: a pull ran past its deadline, or the registry sent
	// nothing for the stall timeout (see WithPullTimeouts). Its API code is
	// image_pull_timeout.
	ErrPullTimeout Error = "image pull timed out"

	errLocked Error = "locked"
)

// Default bounds, for Limits fields left zero.
const (
	DefaultMaxLayerBytes   = 32 << 30  // uncompressed bytes of one layer
	DefaultMaxImageBytes   = 32 << 30  // uncompressed bytes of one image, all layers
	DefaultMaxLayerEntries = 1 << 20   // tar entries of one layer
	DefaultMaxLayers       = 128       // layers of one image
	DefaultMaxRatio        = 100       // uncompressed bytes per compressed byte of a layer...
	DefaultRatioFloor      = 256 << 20 // ...once past this many uncompressed bytes
	defaultParallelLayers  = 3         // layers fetched at once by one pull
	DefaultMaxUnpacks      = 4         // layers fetched and unpacked at once by the store, all pulls together
	maxConfigBytes         = 4 << 20   // an image config (JSON), read whole
	maxManifestBytes       = 4 << 20   // a manifest or index (JSON), read whole
	indexVersion           = 1
)

// Limits bound what one image may cost. An image past a bound is refused
// (ErrTooLarge) and nothing of it is kept. "Uncompressed" counts both the
// tar stream and the sizes of the files in it (a sparse entry's length,
// holes included), whichever is larger.
type Limits struct {
	MaxLayerBytes   int64 // uncompressed bytes of one layer
	MaxImageBytes   int64 // uncompressed bytes of one image, its layers together
	MaxLayerEntries int   // tar entries of one layer
	MaxLayers       int   // layers of one image
	// MaxRatio bounds a compressed layer's tar stream to MaxRatio times
	// the blob's size, or RatioFloor bytes if that is more: a
	// decompression bomb is refused after at most that much work.
	MaxRatio   int64
	RatioFloor int64
}

// StoreLimits bound the store as a whole, across images: an unpack that
// would cross one is refused (ErrStoreFull) and nothing of the layer is
// kept.
type StoreLimits struct {
	// MaxBytes is the store's quota: allocated bytes of all its layers
	// (blocks on disk, so holes in sparse files are free). 0: half the
	// size of the filesystem that holds the store.
	MaxBytes int64
	// MinFreeBytes is the free space an unpack leaves on the store's
	// filesystem, checked before and during the unpack. 0: 5% of the
	// filesystem, at most 1 GiB.
	MinFreeBytes int64
}

// Default pull timeouts (see WithPullTimeouts).
const (
	DefaultPullTimeout  = 10 * time.Minute // a whole pull, from the first request to the index update
	DefaultStallTimeout = time.Minute      // a registry that sends nothing (no headers, no body bytes)
)

// Store is the image store in a data dir. Its methods are safe for
// concurrent use, and several processes (the gateway and `sandgate image`
// commands) may use one data dir at once.
type Store struct {
	root     string // <data>/images, absolute
	keychain authn.Keychain
	rt       http.RoundTripper
	platform v1.Platform
	limits   Limits
	space    space
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	proxy    func(*http.Request) (*url.URL, error)

	pullTimeout  time.Duration // <0: none
	stallTimeout time.Duration // <0: none
	unpacks      chan struct{} // a slot per layer being fetched and unpacked

	pulls  flights[Image]
	layers flights[layerMeta]

	insecureOnce sync.Once
	insecureRT   http.RoundTripper
}

// Option configures a Store in Open.
type Option func(*Store) error

// WithKeychain sets where registry credentials come from; the default is
// authn.DefaultKeychain (~/.docker/config.json, $DOCKER_CONFIG).
func WithKeychain(k authn.Keychain) Option {
	return func(s *Store) error { s.keychain = k; return nil }
}

// WithTransport sets the HTTP transport for registries (default: a clone of
// http.DefaultTransport, which honours the proxy environment).
func WithTransport(rt http.RoundTripper) Option {
	return func(s *Store) error { s.rt = rt; return nil }
}

// WithPlatform sets the platform picked from multi-platform indexes
// (default: HostPlatform()).
func WithPlatform(p v1.Platform) Option {
	return func(s *Store) error {
		if p.OS == "" || p.Architecture == "" {
			return fmt.Errorf("platform %q: OS and architecture are required", p.String())
		}
		s.platform = p
		return nil
	}
}

// WithLimits sets the bounds on layers; zero fields keep their defaults.
func WithLimits(l Limits) Option {
	return func(s *Store) error {
		if l.MaxLayerBytes > 0 {
			s.limits.MaxLayerBytes = l.MaxLayerBytes
		}
		if l.MaxLayerEntries > 0 {
			s.limits.MaxLayerEntries = l.MaxLayerEntries
		}
		if l.MaxLayers > 0 {
			s.limits.MaxLayers = l.MaxLayers
		}
		if l.MaxImageBytes > 0 {
			s.limits.MaxImageBytes = l.MaxImageBytes
		}
		if l.MaxRatio > 0 {
			s.limits.MaxRatio = l.MaxRatio
		}
		if l.RatioFloor > 0 {
			s.limits.RatioFloor = l.RatioFloor
		}
		return nil
	}
}

// WithStoreLimits sets the store's quota and free-space reserve; zero
// fields keep their defaults (see StoreLimits).
func WithStoreLimits(l StoreLimits) Option {
	return func(s *Store) error {
		if l.MaxBytes < 0 || l.MinFreeBytes < 0 {
			return errors.New("store limits must not be negative")
		}
		s.space.max, s.space.minFree = l.MaxBytes, l.MinFreeBytes
		return nil
	}
}

// WithPullTimeouts bounds a pull: total is its deadline as a whole, stall
// how long a registry may send nothing (response headers or body bytes)
// before the pull fails. Both fail with ErrPullTimeout. Zero keeps the
// default (DefaultPullTimeout, DefaultStallTimeout), negative means none.
func WithPullTimeouts(total, stall time.Duration) Option {
	return func(s *Store) error {
		if total != 0 {
			s.pullTimeout = total
		}
		if stall != 0 {
			s.stallTimeout = stall
		}
		return nil
	}
}

// WithMaxUnpacks bounds the layers the store fetches and unpacks at once,
// all pulls and imports of this process together (default
// DefaultMaxUnpacks): each costs a decompressor (a zstd window may be 128
// MiB) and buffers. A layer waits for a slot within its pull's deadline.
func WithMaxUnpacks(n int) Option {
	return func(s *Store) error {
		if n < 1 {
			return fmt.Errorf("max unpacks %d: want at least 1", n)
		}
		s.unpacks = make(chan struct{}, n)
		return nil
	}
}

// WithDialer sets how the store's default transport dials registries, and
// the servers they redirect to: the gateway passes a dialer that applies
// its egress address rule. It has no effect with WithTransport.
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(s *Store) error { s.dial = dial; return nil }
}

// WithProxy sets the HTTP proxy of the store's default transport
// (default: http.ProxyFromEnvironment). The proxy, not the dialer, then
// connects to the registries and the servers they redirect to, so the
// gateway passes a function that applies its egress address rule to the
// request's host before it returns a proxy. No effect with WithTransport.
func WithProxy(proxy func(*http.Request) (*url.URL, error)) Option {
	return func(s *Store) error { s.proxy = proxy; return nil }
}

// HostPlatform is the platform of this binary: linux, runtime.GOARCH and,
// for 32-bit ARM, the variant it was built for (GOARM).
func HostPlatform() v1.Platform {
	p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if runtime.GOARCH == "arm" {
		p.Variant = "v7"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "GOARM" && s.Value != "" {
					p.Variant = "v" + strings.SplitN(s.Value, ",", 2)[0]
				}
			}
		}
	}
	return p
}

// Open opens (creating it if need be) the image store under dataDir
// (<dataDir>/images). It removes what a crashed pull or import left in
// the store's tmp/ when no other process is pulling.
func Open(dataDir string, opts ...Option) (*Store, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, err
	}
	s := &Store{
		root:     filepath.Join(abs, "images"),
		keychain: authn.DefaultKeychain,
		platform: HostPlatform(),
		limits: Limits{MaxLayerBytes: DefaultMaxLayerBytes, MaxImageBytes: DefaultMaxImageBytes,
			MaxLayerEntries: DefaultMaxLayerEntries, MaxLayers: DefaultMaxLayers,
			MaxRatio: DefaultMaxRatio, RatioFloor: DefaultRatioFloor},
		pullTimeout:  DefaultPullTimeout,
		stallTimeout: DefaultStallTimeout,
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	if s.unpacks == nil {
		s.unpacks = make(chan struct{}, DefaultMaxUnpacks)
	}
	if s.rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if s.dial != nil {
			t.DialContext = s.dial
		}
		if s.proxy != nil {
			t.Proxy = s.proxy
		}
		s.rt = t
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, err
	}
	// images/ is 0700: layers hold files owned by image uids, which are
	// real uids on the host, and possibly setgid directories.
	for _, d := range []string{s.root, s.layersDir(), s.tmpDir(), s.refsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	if err := os.Chmod(s.root, 0o700); err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	s.space.init(s.root)
	if l, err := lockFile(s.gcLockPath(), true, false); err == nil {
		s.clearTmp()
		l.unlock()
	} else if err != errLocked {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	return s, nil
}

// Dir is the store's directory, <dataDir>/images.
func (s *Store) Dir() string { return s.root }

func (s *Store) layersDir() string     { return filepath.Join(s.root, "layers", "sha256") }
func (s *Store) tmpDir() string        { return filepath.Join(s.root, "tmp") }
func (s *Store) refsDir() string       { return filepath.Join(s.root, "refs") }
func (s *Store) indexPath() string     { return filepath.Join(s.root, "index.json") }
func (s *Store) indexLockPath() string { return filepath.Join(s.root, "index.lock") }
func (s *Store) gcLockPath() string    { return filepath.Join(s.root, "gc.lock") }

// layerPath is a layer's directory: layer.json and root/.
func (s *Store) layerPath(diffID string) string {
	return filepath.Join(s.layersDir(), strings.TrimPrefix(diffID, "sha256:"))
}

// clearTmp removes everything in tmp/; the caller holds gc.lock exclusively,
// so no pull or import is using it.
func (s *Store) clearTmp() {
	ents, _ := os.ReadDir(s.tmpDir())
	for _, e := range ents {
		os.RemoveAll(filepath.Join(s.tmpDir(), e.Name()))
	}
}

// Image is a stored image, ready to be a sandbox's root.
type Image struct {
	Name       string    `json:"name"`       // normalised reference, e.g. docker.io/library/python:3.12-slim
	Digest     string    `json:"digest"`     // manifest digest, "sha256:…" (see the package doc for imports)
	SizeBytes  int64     `json:"sizeBytes"`  // bytes of regular files in its unpacked layers
	PulledAt   time.Time `json:"pulledAt"`   // when it was last pulled or imported
	Source     string    `json:"source"`     // "pull" or "import"
	Env        []string  `json:"env"`        // the image config's Env
	WorkingDir string    `json:"workingDir"` // the image config's WorkingDir
	User       string    `json:"user"`       // the image config's User (kept, unused)
	Entrypoint []string  `json:"entrypoint"` // the image config's Entrypoint (kept, unused)
	Cmd        []string  `json:"cmd"`        // the image config's Cmd (kept, unused)
	DiffIDs    []string  `json:"diffIDs"`    // its layers' diffIDs, bottom first
	LayerDirs  []string  `json:"layerDirs"`  // absolute overlayfs lower dirs, bottom first (one per DiffIDs entry)
}

// record is an image as index.json stores it.
type record struct {
	Name      string        `json:"name"`
	Digest    string        `json:"digest"`
	Config    recordConfig  `json:"config"`
	Layers    []recordLayer `json:"layers"`
	SizeBytes int64         `json:"sizeBytes"`
	PulledAt  time.Time     `json:"pulledAt"`
	Source    string        `json:"source"`
}

type recordConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

type recordLayer struct {
	DiffID string `json:"diffID"`
	Digest string `json:"digest,omitempty"` // the blob's digest, when it came compressed
	Size   int64  `json:"size"`
}

type indexFile struct {
	Version int      `json:"version"`
	Images  []record `json:"images"`
}

func (s *Store) image(r record) Image {
	img := Image{
		Name: r.Name, Digest: r.Digest, SizeBytes: r.SizeBytes, PulledAt: r.PulledAt, Source: r.Source,
		Env: r.Config.Env, WorkingDir: r.Config.WorkingDir, User: r.Config.User,
		Entrypoint: r.Config.Entrypoint, Cmd: r.Config.Cmd,
	}
	for _, l := range r.Layers {
		img.DiffIDs = append(img.DiffIDs, l.DiffID)
		img.LayerDirs = append(img.LayerDirs, filepath.Join(s.layerPath(l.DiffID), "root"))
	}
	return img
}

// readIndex reads index.json; readers need no lock, as writers replace
// the file by rename.
func (s *Store) readIndex() (*indexFile, error) {
	b, err := os.ReadFile(s.indexPath())
	if errors.Is(err, fs.ErrNotExist) {
		return &indexFile{Version: indexVersion}, nil
	}
	if err != nil {
		return nil, err
	}
	var idx indexFile
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("image index %s: %w", s.indexPath(), err)
	}
	if idx.Version != indexVersion {
		return nil, fmt.Errorf("image index %s: version %d, want %d", s.indexPath(), idx.Version, indexVersion)
	}
	return &idx, nil
}

// updateIndex runs fn on the index under index.lock and writes the result
// if fn returns nil. The lock is held only for this read-modify-write.
func (s *Store) updateIndex(fn func(*indexFile) error) error {
	return s.withIndexLock(func(idx *indexFile) error {
		if err := fn(idx); err != nil {
			return err
		}
		return s.writeIndex(idx)
	})
}

// writeIndex writes idx, sorted by name, over the index file.
func (s *Store) writeIndex(idx *indexFile) error {
	slices.SortFunc(idx.Images, func(a, b record) int { return strings.Compare(a.Name, b.Name) })
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.indexPath(), append(b, '\n'), 0o600)
}

// withIndexLock runs fn holding index.lock, for reads that must not race
// an index update (refs against removals).
func (s *Store) withIndexLock(fn func(*indexFile) error) error {
	l, err := lockFile(s.indexLockPath(), true, true)
	if err != nil {
		return err
	}
	defer l.unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	return fn(idx)
}

// writeFileAtomic writes data to a temporary file beside path, syncs it and
// renames it over path, so readers see the old or the new file whole.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// find returns the index position of name: an exact match of its
// normalised form or, for a digest reference, an image of that repository
// with that manifest digest.
func find(idx *indexFile, name string) (int, error) {
	n, err := Normalize(name)
	if err != nil {
		return -1, err
	}
	for i, r := range idx.Images {
		if r.Name == n {
			return i, nil
		}
	}
	if repo, dig, ok := strings.Cut(n, "@"); ok {
		for i, r := range idx.Images {
			if r.Digest == dig && repoOf(r.Name) == repo {
				return i, nil
			}
		}
	}
	return -1, fmt.Errorf("%w: %s", ErrNotFound, n)
}

// Get returns the stored image name refers to (normalised as Normalize
// does). An image not stored is ErrNotFound.
func (s *Store) Get(name string) (Image, error) {
	idx, err := s.readIndex()
	if err != nil {
		return Image{}, err
	}
	i, err := find(idx, name)
	if err != nil {
		return Image{}, err
	}
	return s.image(idx.Images[i]), nil
}

// List returns every stored image, sorted by name.
func (s *Store) List() ([]Image, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(idx.Images))
	for _, r := range idx.Images {
		out = append(out, s.image(r))
	}
	return out, nil
}

// Ref is a session's reference to an image (see Acquire).
type Ref struct {
	SessionID  string    `json:"sessionID"`
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	DiffIDs    []string  `json:"diffIDs"`
	AcquiredAt time.Time `json:"acquiredAt"`
	// Warm is a hold of a warm sandbox that no session has claimed yet
	// (AcquireWarm): Remove does not wait for it.
	Warm bool `json:"warm,omitempty"`
}

var sessionIDRe = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$`)

func checkSessionID(id string) error {
	if !sessionIDRe.MatchString(id) {
		return fmt.Errorf("invalid session id %q for an image reference", id)
	}
	return nil
}

// Acquire records that session sessionID uses the image name and returns
// it. Until Release, Remove refuses the image (without force) and Prune
// keeps its layers, even if it is force-removed or re-pulled under its name,
// and across restarts: the reference is the file refs/<sessionID>. A
// session holds one image; a second Acquire replaces the first reference.
func (s *Store) Acquire(sessionID, name string) (Image, error) {
	return s.acquire(sessionID, name, false)
}

// AcquireWarm is Acquire for a warm sandbox that no session has claimed
// yet: its layers are kept (Prune) as a session's, but Remove without
// force does not wait for it, as the pool that built it is the gateway's
// own. A later Acquire of the same id (the claim) makes it a session's.
func (s *Store) AcquireWarm(sessionID, name string) (Image, error) {
	return s.acquire(sessionID, name, true)
}

func (s *Store) acquire(sessionID, name string, warm bool) (Image, error) {
	if err := checkSessionID(sessionID); err != nil {
		return Image{}, err
	}
	var img Image
	err := s.withIndexLock(func(idx *indexFile) error {
		i, err := find(idx, name)
		if err != nil {
			return err
		}
		img = s.image(idx.Images[i])
		b, err := json.Marshal(Ref{SessionID: sessionID, Name: img.Name, Digest: img.Digest,
			DiffIDs: img.DiffIDs, AcquiredAt: time.Now().UTC(), Warm: warm})
		if err != nil {
			return err
		}
		return writeFileAtomic(filepath.Join(s.refsDir(), sessionID), append(b, '\n'), 0o600)
	})
	if err != nil {
		return Image{}, err
	}
	return img, nil
}

// Release drops session sessionID's reference; releasing a session without
// one is not an error.
func (s *Store) Release(sessionID string) error {
	if err := checkSessionID(sessionID); err != nil {
		return err
	}
	err := os.Remove(filepath.Join(s.refsDir(), sessionID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Refs lists the sessions' references, so a gateway that restarts can
// Release those of sessions it no longer has.
func (s *Store) Refs() ([]Ref, error) {
	ents, err := os.ReadDir(s.refsDir())
	if err != nil {
		return nil, err
	}
	var out []Ref
	for _, e := range ents {
		if !e.Type().IsRegular() || checkSessionID(e.Name()) != nil {
			continue // temporary files of writeFileAtomic start with "."
		}
		b, err := os.ReadFile(filepath.Join(s.refsDir(), e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, err
		}
		var r Ref
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("image reference %s: %w", e.Name(), err)
		}
		r.SessionID = e.Name()
		out = append(out, r)
	}
	return out, nil
}

// Remove drops the image name from the index. It refuses (ErrInUse) while
// a session holds a reference to it, unless force; a warm sandbox's
// (AcquireWarm) does not count. Its layers stay on disk until Prune, which
// keeps them while any reference, a warm one included, uses them.
func (s *Store) Remove(name string, force bool) (Image, error) {
	var img Image
	err := s.updateIndex(func(idx *indexFile) error {
		i, err := find(idx, name)
		if err != nil {
			return err
		}
		img = s.image(idx.Images[i])
		if !force {
			refs, err := s.Refs()
			if err != nil {
				return err
			}
			var users []string
			for _, r := range refs {
				if !r.Warm && (r.Digest == img.Digest || r.Name == img.Name) {
					users = append(users, r.SessionID)
				}
			}
			if len(users) > 0 {
				return fmt.Errorf("%w: %s is used by %d session(s): %s", ErrInUse, img.Name, len(users), strings.Join(users, ", "))
			}
		}
		idx.Images = slices.Delete(idx.Images, i, i+1)
		return nil
	})
	return img, err
}

// PruneResult is what Prune freed.
type PruneResult struct {
	Layers []string // diffIDs of the removed layers
	Bytes  int64    // bytes of regular files in them
}

// Prune removes the layers that no stored image and no session reference
// uses. It waits for pulls and imports in progress (they hold gc.lock
// shared), then holds gc.lock exclusively only while it moves the layers
// into tmp/; deleting them happens after. It also clears what crashed
// pulls left in tmp/.
func (s *Store) Prune() (PruneResult, error) {
	var res PruneResult
	gc, err := lockFile(s.gcLockPath(), true, true)
	if err != nil {
		return res, err
	}
	s.clearTmp()
	trash, err := os.MkdirTemp(s.tmpDir(), "prune-")
	if err != nil {
		gc.unlock()
		return res, err
	}
	defer os.RemoveAll(trash)
	err = s.withIndexLock(func(idx *indexFile) error {
		keep := map[string]bool{}
		for _, r := range idx.Images {
			for _, l := range r.Layers {
				keep[strings.TrimPrefix(l.DiffID, "sha256:")] = true
			}
		}
		refs, err := s.Refs()
		if err != nil {
			return err
		}
		for _, r := range refs {
			for _, d := range r.DiffIDs {
				keep[strings.TrimPrefix(d, "sha256:")] = true
			}
		}
		ents, err := os.ReadDir(s.layersDir())
		if err != nil {
			return err
		}
		for _, e := range ents {
			if keep[e.Name()] {
				continue
			}
			src := filepath.Join(s.layersDir(), e.Name())
			if m, err := readLayerMeta(src); err == nil {
				res.Bytes += m.Size
			}
			if err := os.Rename(src, filepath.Join(trash, e.Name())); err != nil {
				return err
			}
			res.Layers = append(res.Layers, "sha256:"+e.Name())
		}
		return nil
	})
	gc.unlock()
	if err != nil {
		return res, err
	}
	if err := os.RemoveAll(trash); err != nil {
		return res, fmt.Errorf("prune: removing layers: %w", err)
	}
	return res, nil
}
