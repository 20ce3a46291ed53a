package images

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PullOptions are the per-pull choices.
type PullOptions struct {
	// Insecure allows plain HTTP, and HTTPS without certificate checks,
	// for the registry of the pulled reference.
	Insecure bool
	// InsecureRegistries lists registries ("host" or "host:port", as in the
	// reference) that get the same treatment; a gateway's configured list.
	InsecureRegistries []string
	// Progress, if set, hears how far the pull's layer downloads are: one
	// call at a time, about once per percent, and once more when they are
	// complete. Layers the store already has are not counted. Callers that
	// join a pull already running get no progress.
	Progress func(Progress)
}

// Progress is how far a pull's layer downloads are, in bytes as the
// registry sends them (compressed), as go-containerregistry's v1.Update
// reports a push's.
type Progress struct {
	Total    int64 `json:"total"`    // the layers to fetch
	Complete int64 `json:"complete"` // fetched so far
	Layers   int   `json:"layers"`   // layers to fetch (the others are stored already)
}

// RegistryError is a registry's refusal of a pull: an HTTP status and
// the registry's own reason (e.g. 401 UNAUTHORIZED, 404 MANIFEST_UNKNOWN).
type RegistryError struct {
	Ref        string // the normalised reference
	StatusCode int
	Err        error // go-containerregistry's error, with the registry's diagnostics
}

func (e *RegistryError) Error() string {
	return fmt.Sprintf("registry answered %d %s: %v", e.StatusCode, http.StatusText(e.StatusCode), e.Err)
}

func (e *RegistryError) Unwrap() error { return e.Err }

// Pull fetches ref from its registry, verifies and unpacks the layers the
// store lacks, and records the image under ref's normalised name (a later
// pull of a moved tag replaces the record). Concurrent pulls of one
// reference in this process share one pull; a caller whose ctx ends gets
// ctx's error and the pull goes on for the others (the last caller to give
// up cancels it and waits for its cleanup). Credentials come from
// the store's keychain. A failed pull leaves the index as it was and no
// temporary files; the layers it completed are removed unless another pull
// is running, in which case Prune removes them.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (Image, error) {
	n, err := Normalize(ref)
	if err != nil {
		return Image{}, err
	}
	r, err := parseRef(ref, false)
	if err != nil {
		return Image{}, err
	}
	insecure := opts.Insecure || slices.Contains(opts.InsecureRegistries, r.Context().RegistryStr()) ||
		slices.Contains(opts.InsecureRegistries, registryName(r))
	if insecure {
		if r, err = parseRef(ref, true); err != nil {
			return Image{}, err
		}
	}
	key := fmt.Sprintf("%s insecure=%t", n, insecure)
	img, err, _ := s.pulls.do(ctx, key, func(ctx context.Context) (Image, error) {
		return s.pull(ctx, r, n, insecure, opts.Progress)
	})
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", n, err)
	}
	return img, nil
}

// pull is one pull, under the store's deadline: an error past it is
// ErrPullTimeout's.
func (s *Store) pull(ctx context.Context, r name.Reference, normalized string, insecure bool, progress func(Progress)) (Image, error) {
	if s.pullTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, s.pullTimeout, fmt.Errorf("%w: the pull took longer than %s", ErrPullTimeout, s.pullTimeout))
		defer cancel()
	}
	img, err := s.pullOnce(ctx, r, normalized, insecure, progress)
	if err != nil && !errors.Is(err, ErrPullTimeout) {
		if cause := context.Cause(ctx); errors.Is(cause, ErrPullTimeout) {
			err = cause
		}
	}
	return img, err
}

func (s *Store) pullOnce(ctx context.Context, r name.Reference, normalized string, insecure bool, progress func(Progress)) (Image, error) {
	rt := s.rt
	if insecure {
		rt = s.insecureTransport()
	}
	registryErr := func(err error) error { return registryErr(normalized, r.Context().RegistryStr(), err) }
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(s.keychain),
		remote.WithTransport(&guardTransport{rt: rt, stall: s.stallTimeout}),
		remote.WithPlatform(s.platform),
		remote.WithUserAgent("sandgate"),
	}
	gc, err := s.lockGC()
	if err != nil {
		return Image{}, err
	}
	defer gc.unlock()
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return Image{}, registryErr(err)
	}
	var img v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return Image{}, registryErr(err)
		}
		if img, err = s.pickPlatform(idx, 0); err != nil {
			return Image{}, registryErr(err)
		}
	} else {
		if img, err = desc.Image(); err != nil {
			return Image{}, registryErr(err)
		}
	}
	rec, err := s.store(ctx, gc, normalized, "pull", img, nil, progress)
	if err != nil {
		return Image{}, registryErr(err)
	}
	return s.image(rec), nil
}

// insecureTransport is the store's transport without certificate checks,
// made once.
func (s *Store) insecureTransport() http.RoundTripper {
	s.insecureOnce.Do(func() {
		s.insecureRT = s.rt
		if t, ok := s.rt.(*http.Transport); ok {
			t = t.Clone()
			if t.TLSClientConfig == nil {
				t.TLSClientConfig = &tls.Config{}
			}
			t.TLSClientConfig.InsecureSkipVerify = true
			s.insecureRT = t
		}
	})
	return s.insecureRT
}

// registryErr makes a registry's error answer a *RegistryError. An answer
// from another host than the registry (a redirect's target, a token
// server) keeps its status but not its body, which the tenant must not
// see: it may be any server's page.
func registryErr(ref, registry string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		if te.Request != nil && !strings.EqualFold(te.Request.URL.Host, registry) {
			return &RegistryError{Ref: ref, StatusCode: te.StatusCode, Err: errFromElsewhere(te.Request.URL.Host)}
		}
		return &RegistryError{Ref: ref, StatusCode: te.StatusCode, Err: err}
	}
	return err
}

// pickPlatform returns the image for the store's platform from a
// (possibly nested) index. Entries without a platform (attestations,
// artifacts) are never picked when the index has several.
func (s *Store) pickPlatform(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("image indexes nested too deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var seen []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			if len(im.Manifests) == 1 {
				return s.child(idx, d, depth)
			}
			continue
		}
		seen = append(seen, d.Platform.String())
		if d.Platform.Satisfies(s.platform) {
			return s.child(idx, d, depth)
		}
	}
	return nil, fmt.Errorf("no image for platform %s in the index (it has: %s)", s.platform.String(), strings.Join(seen, ", "))
}

func (s *Store) child(idx v1.ImageIndex, d v1.Descriptor, depth int) (v1.Image, error) {
	if d.MediaType.IsIndex() {
		sub, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		return s.pickPlatform(sub, depth+1)
	}
	return idx.Image(d.Digest)
}

// lockGC takes gc.lock shared, as every pull and import does for as long
// as it uses tmp/ or may rely on a layer being kept.
func (s *Store) lockGC() (*fileLock, error) {
	return lockFile(s.gcLockPath(), false, true)
}

// store checks img, makes sure its layers are unpacked, and records it as
// name. digestFn, if set, gives the image's digest once its layers are
// known (imports of docker save archives); otherwise it is img.Digest().
// The caller holds gc shared; store releases it early when it fails.
func (s *Store) store(ctx context.Context, gc *fileLock, name, source string, img v1.Image, digestFn func(cfgRaw []byte, metas []layerMeta) (string, error), progress func(Progress)) (record, error) {
	if digestFn == nil {
		// The config is read whole: bound it before reading it.
		m, err := img.Manifest()
		if err != nil {
			return record{}, fmt.Errorf("image manifest: %w", err)
		}
		if m.Config.Size > maxConfigBytes {
			return record{}, fmt.Errorf("%w: its config of %d bytes is larger than the limit (%s)", ErrTooLarge, m.Config.Size, fmtBytes(maxConfigBytes))
		}
	}
	cfgRaw, err := img.RawConfigFile()
	if err != nil {
		return record{}, fmt.Errorf("image config: %w", err)
	}
	var cfg v1.ConfigFile
	if err := json.Unmarshal(cfgRaw, &cfg); err != nil {
		return record{}, fmt.Errorf("image config: %w", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return record{}, fmt.Errorf("image is for %s, not linux", cfg.OS)
	}
	if cfg.RootFS.Type != "" && cfg.RootFS.Type != "layers" {
		return record{}, fmt.Errorf("image config: rootfs type %q", cfg.RootFS.Type)
	}
	srcs, err := s.layerSources(img, &cfg, digestFn == nil)
	if err != nil {
		return record{}, err
	}
	budget := newImageBudget(s.limits.MaxImageBytes)
	for i := range srcs {
		srcs[i].image = budget
	}
	if progress != nil {
		s.trackProgress(srcs, progress)
	}

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	metas := make([]layerMeta, len(srcs))
	errs := make([]error, len(srcs))
	sem := make(chan struct{}, defaultParallelLayers)
	var wg sync.WaitGroup
	for i, src := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if metas[i], errs[i] = s.ensureLayer(lctx, src); errs[i] != nil {
				cancel() // the image fails: stop its other layers
			}
		}()
	}
	wg.Wait()
	if err := firstErr(errs); err != nil {
		gc.unlock()
		s.dropNewLayers(metas)
		return record{}, err
	}
	// Layers already stored did not count as they streamed.
	var tarBytes, fileBytes int64
	for _, m := range metas {
		tarBytes += m.TarSize
		fileBytes += m.Size
	}
	if max(tarBytes, fileBytes) > s.limits.MaxImageBytes {
		gc.unlock()
		s.dropNewLayers(metas)
		return record{}, fmt.Errorf("%w: its layers uncompress to %s, more than its limit of %s", ErrTooLarge, fmtBytes(max(tarBytes, fileBytes)), fmtBytes(s.limits.MaxImageBytes))
	}

	var digest string
	if digestFn != nil {
		digest, err = digestFn(cfgRaw, metas)
	} else {
		var h v1.Hash
		h, err = img.Digest()
		digest = h.String()
	}
	if err != nil {
		return record{}, err
	}
	rec := record{
		Name: name, Digest: digest, PulledAt: time.Now().UTC().Truncate(time.Second), Source: source,
		Config: recordConfig{
			Env: cfg.Config.Env, WorkingDir: cfg.Config.WorkingDir, User: cfg.Config.User,
			Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd,
		},
	}
	for i, m := range metas {
		rec.Layers = append(rec.Layers, recordLayer{DiffID: srcs[i].diffID, Digest: srcs[i].digest, Size: m.Size})
		rec.SizeBytes += m.Size
	}
	err = s.updateIndex(func(idx *indexFile) error {
		for _, l := range rec.Layers {
			if _, err := os.Stat(filepath.Join(s.layerPath(l.DiffID), "layer.json")); err != nil {
				return fmt.Errorf("layer %s vanished: %w", l.DiffID, err)
			}
		}
		idx.Images = slices.DeleteFunc(idx.Images, func(r record) bool { return r.Name == name })
		idx.Images = append(idx.Images, rec)
		return nil
	})
	if err != nil {
		return record{}, err
	}
	return rec, nil
}

// dropNewLayers removes the layers a failed pull unpacked, when no other
// pull or import is running (one might be about to use them); otherwise
// Prune will. The caller has released its shared gc.lock.
func (s *Store) dropNewLayers(metas []layerMeta) {
	var created []string
	for _, m := range metas {
		if m.created {
			created = append(created, m.DiffID)
		}
	}
	if len(created) == 0 {
		return
	}
	gc, err := lockFile(s.gcLockPath(), true, false)
	if err != nil {
		return
	}
	defer gc.unlock()
	trash, err := os.MkdirTemp(s.tmpDir(), "drop-")
	if err != nil {
		return
	}
	defer os.RemoveAll(trash)
	s.withIndexLock(func(idx *indexFile) error {
		used := map[string]bool{}
		for _, r := range idx.Images {
			for _, l := range r.Layers {
				used[l.DiffID] = true
			}
		}
		if refs, err := s.Refs(); err == nil {
			for _, r := range refs {
				for _, d := range r.DiffIDs {
					used[d] = true
				}
			}
		} else {
			return err
		}
		for _, d := range created {
			if !used[d] {
				os.Rename(s.layerPath(d), filepath.Join(trash, strings.TrimPrefix(d, "sha256:")))
			}
		}
		return nil
	})
}

// layerSources lists img's layers with the diffIDs of its config.
// compressed: open each layer's blob as stored, checked against the
// manifest's digest; otherwise open the uncompressed tar (docker save).
func (s *Store) layerSources(img v1.Image, cfg *v1.ConfigFile, compressed bool) ([]layerSource, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	if len(layers) > s.limits.MaxLayers {
		return nil, fmt.Errorf("%w: it has %d layers; the limit is %d", ErrTooLarge, len(layers), s.limits.MaxLayers)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return nil, fmt.Errorf("image has %d layers but its config lists %d diffIDs", len(layers), len(cfg.RootFS.DiffIDs))
	}
	var mediaTypes []types.MediaType
	if compressed {
		m, err := img.Manifest()
		if err != nil {
			return nil, err
		}
		if len(m.Layers) != len(layers) {
			return nil, errors.New("manifest and image disagree on the layers")
		}
		for _, l := range m.Layers {
			mediaTypes = append(mediaTypes, l.MediaType)
		}
	}
	var out []layerSource
	for i, l := range layers {
		src := layerSource{diffID: cfg.RootFS.DiffIDs[i].String(), size: -1}
		if compressed {
			if !mediaTypes[i].IsLayer() || strings.Contains(string(mediaTypes[i]), "foreign") || strings.Contains(string(mediaTypes[i]), "nondistributable") {
				return nil, fmt.Errorf("layer %d: unsupported media type %q", i, mediaTypes[i])
			}
			d, err := l.Digest()
			if err != nil {
				return nil, err
			}
			if src.size, err = l.Size(); err != nil {
				return nil, err
			}
			// The size bounds the blob's read and its ratio to the tar.
			if src.size < 0 {
				return nil, fmt.Errorf("invalid manifest: layer %d has a negative size (%d)", i, src.size)
			}
			if src.size > s.limits.MaxLayerBytes {
				return nil, fmt.Errorf("%w: layer %d is %s compressed, larger than the limit of the layer (%s)", ErrTooLarge, i, fmtBytes(src.size), fmtBytes(s.limits.MaxLayerBytes))
			}
			src.digest, src.open = d.String(), l.Compressed
		} else {
			src.open = l.Uncompressed
		}
		out = append(out, src)
	}
	return out, nil
}

// uncompressedDigest is the digest of the OCI manifest that describes an
// image by its config and uncompressed layers (diffIDs), which is what
// docker save archives define: the digest of an imported docker save image.
func uncompressedDigest(cfgRaw []byte, metas []layerMeta) (string, error) {
	sum := sha256.Sum256(cfgRaw)
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config: v1.Descriptor{
			MediaType: types.OCIConfigJSON,
			Size:      int64(len(cfgRaw)),
			Digest:    v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])},
		},
	}
	for _, lm := range metas {
		h, err := v1.NewHash(lm.DiffID)
		if err != nil {
			return "", err
		}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.OCIUncompressedLayer, Size: lm.TarSize, Digest: h})
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	d := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(d[:]), nil
}

// firstErr is the first error that is not a cancellation caused by
// another layer's failure.
func firstErr(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}
