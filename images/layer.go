package images

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
)

// layerMeta is a layer's layer.json, beside its root/.
type layerMeta struct {
	DiffID     string    `json:"diffID"`
	Digest     string    `json:"digest,omitempty"` // compressed blob digest it was verified against
	TarSize    int64     `json:"tarSize"`          // uncompressed tar bytes
	Size       int64     `json:"size"`             // bytes of regular files unpacked (their lengths)
	AllocBytes int64     `json:"allocBytes"`       // bytes they take on disk (blocks; holes are free), directories included
	Entries    int       `json:"entries"`
	UnpackedAt time.Time `json:"unpackedAt"`

	created bool // this call unpacked it (not stored)
}

func readLayerMeta(dir string) (layerMeta, error) {
	var m layerMeta
	b, err := os.ReadFile(filepath.Join(dir, "layer.json"))
	if err != nil {
		return m, err
	}
	err = json.Unmarshal(b, &m)
	return m, err
}

// layerSource is one layer of an image being pulled or imported.
type layerSource struct {
	diffID string // "sha256:…", from the image config
	digest string // "sha256:…" of the blob as stored; "" when open gives the uncompressed tar
	size   int64  // the blob's size from the manifest; -1 when unknown
	open   func() (io.ReadCloser, error)
	image  *imageBudget
}

// imageBudget counts the uncompressed bytes of one image's layers as they
// are unpacked, against Limits.MaxImageBytes: the tar streams and the
// files' lengths (holes included) apart.
type imageBudget struct {
	max        int64
	tar, files atomic.Int64
}

func newImageBudget(max int64) *imageBudget { return &imageBudget{max: max} }

func (b *imageBudget) addTar(n int64) error {
	if b == nil || b.tar.Add(n) <= b.max {
		return nil
	}
	return fmt.Errorf("%w: its layers uncompress to more than its limit of %s", ErrTooLarge, fmtBytes(b.max))
}

func (b *imageBudget) addFiles(n int64) error {
	if b == nil || b.files.Add(n) <= b.max {
		return nil
	}
	return fmt.Errorf("%w: its files are larger than its limit of %s together", ErrTooLarge, fmtBytes(b.max))
}

// countReader passes reads through and counts them with add, failing
// when add does.
type countReader struct {
	r   io.Reader
	add func(int64) error
}

func (c countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		if aerr := c.add(int64(n)); aerr != nil {
			return n, aerr
		}
	}
	return n, err
}

// errDigest marks a blob whose bytes are not the ones its digest names.
type errDigest struct {
	what, want, got string
}

func (e *errDigest) Error() string {
	return fmt.Sprintf("digest mismatch: %s is %s, but the data received hashes to %s", e.what, e.want, e.got)
}

var hexRe = func(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func checkDigest(d string) error {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || !hexRe(h) {
		return fmt.Errorf("unsupported or malformed digest %q (sha256 only)", d)
	}
	return nil
}

// ensureLayer makes sure the layer is unpacked in the store and returns its
// metadata. Concurrent calls in this process for one layer share one
// unpack; across processes each unpacks into its own temporary dir and the
// first rename wins.
func (s *Store) ensureLayer(ctx context.Context, src layerSource) (layerMeta, error) {
	if err := checkDigest(src.diffID); err != nil {
		return layerMeta{}, err
	}
	if src.digest != "" {
		if err := checkDigest(src.digest); err != nil {
			return layerMeta{}, err
		}
	}
	if m, err := readLayerMeta(s.layerPath(src.diffID)); err == nil {
		return m, nil
	}
	m, err, shared := s.layers.do(ctx, src.diffID, func(ctx context.Context) (layerMeta, error) {
		return s.unpackLayer(ctx, src)
	})
	if shared {
		m.created = false
	}
	return m, err
}

func (s *Store) unpackLayer(ctx context.Context, src layerSource) (layerMeta, error) {
	final := s.layerPath(src.diffID)
	if m, err := readLayerMeta(final); err == nil {
		return m, nil
	}
	hexID := strings.TrimPrefix(src.diffID, "sha256:")
	select {
	case s.unpacks <- struct{}{}:
		defer func() { <-s.unpacks }()
	case <-ctx.Done():
		return layerMeta{}, context.Cause(ctx)
	}
	// The blob's size is the least the layer takes on disk.
	charge, err := s.beginUnpack(max(src.size, 0))
	if err != nil {
		return layerMeta{}, fmt.Errorf("layer %s: %w", layerName(src), err)
	}
	var committed int64
	defer func() { charge.done(committed) }()
	tmp, err := os.MkdirTemp(s.tmpDir(), "layer-"+hexID[:12]+"-")
	if err != nil {
		return layerMeta{}, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	rootDir := filepath.Join(tmp, "root")
	if err := os.Mkdir(rootDir, 0o755); err != nil {
		return layerMeta{}, err
	}
	m, err := s.fetchAndUnpack(ctx, src, rootDir, charge)
	if err != nil {
		return layerMeta{}, err
	}
	m.DiffID, m.Digest, m.UnpackedAt = src.diffID, src.digest, time.Now().UTC()
	b, err := json.Marshal(m)
	if err != nil {
		return layerMeta{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "layer.json"), b, 0o600); err != nil {
		return layerMeta{}, err
	}
	// One syncfs makes the unpacked files durable before the rename
	// publishes them.
	syncFS(tmp)
	if err := ctx.Err(); err != nil {
		return layerMeta{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		if errors.Is(err, fs.ErrExist) || isNotEmpty(err) {
			// Another process unpacked it first; ours is discarded.
			return readLayerMeta(final)
		}
		return layerMeta{}, err
	}
	committed = m.allocated()
	m.created = true
	return m, nil
}

// hashCounter hashes and counts what passes through it.
type hashCounter struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (c *hashCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

func (c *hashCounter) digest() string { return "sha256:" + hex.EncodeToString(c.h.Sum(nil)) }

// limitReader fails with err, rather than ends, once more than n bytes
// are read.
type limitReader struct {
	r   io.Reader
	n   int64
	err error
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, l.err
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, l.err
	}
	return n, err
}

// tarLimit is the most a layer's tar stream may hold, and the error past
// it: Limits.MaxLayerBytes, or less for a compressed blob of known size
// (Limits.MaxRatio times its size, at least Limits.RatioFloor).
func (s *Store) tarLimit(src layerSource) (int64, error) {
	lim := s.limits
	n := lim.MaxLayerBytes
	err := fmt.Errorf("%w: layer %s uncompresses to more than its limit of %s", ErrTooLarge, layerName(src), fmtBytes(n))
	if src.digest != "" && src.size >= 0 && lim.MaxRatio > 0 && src.size <= math.MaxInt64/lim.MaxRatio {
		if r := max(src.size*lim.MaxRatio, lim.RatioFloor); r < n {
			n = r
			err = fmt.Errorf("%w: layer %s uncompresses to more than %d times its %s (the limit is %s for it)",
				ErrTooLarge, layerName(src), lim.MaxRatio, fmtBytes(src.size), fmtBytes(n))
		}
	}
	return n, err
}

// fetchAndUnpack streams the layer's blob through its digest check,
// decompression and diffID check into the unpacker. The digests are known
// only at the end, so a layer that fails them has been unpacked into the
// temporary dir, which the caller removes.
func (s *Store) fetchAndUnpack(ctx context.Context, src layerSource, rootDir string, charge *spaceCharge) (layerMeta, error) {
	rc, err := src.open()
	if err != nil {
		return layerMeta{}, fmt.Errorf("fetching layer %s: %w", layerName(src), err)
	}
	defer rc.Close()
	// Cancelling ctx also ends a read blocked on the network.
	stop := context.AfterFunc(ctx, func() { rc.Close() })
	defer stop()
	var r io.Reader = ctxReader{ctx, rc}
	if src.size >= 0 {
		r = &limitReader{r: r, n: src.size, err: fmt.Errorf("layer blob %s is larger than the manifest says (%d bytes)", src.digest, src.size)}
	}
	blob := &hashCounter{r: r, h: sha256.New()}
	br := bufio.NewReaderSize(blob, 1<<16)

	m, unpackErr := func() (layerMeta, error) {
		dr, err := decompress(br)
		if err != nil {
			return layerMeta{}, err
		}
		defer dr.Close()
		limit, limitErr := s.tarLimit(src)
		var tr io.Reader = &limitReader{r: dr, n: limit, err: limitErr}
		if src.image != nil {
			tr = countReader{tr, src.image.addTar}
		}
		tarStream := &hashCounter{r: tr, h: sha256.New()}
		m, err := unpackWith(tarStream, rootDir, unpackOpts{limits: s.limits, space: charge, image: src.image})
		if err != nil {
			return m, err
		}
		// The tar's end blocks and any padding count toward the diffID.
		if _, err := io.Copy(io.Discard, tarStream); err != nil {
			return m, err
		}
		m.TarSize = tarStream.n
		if got := tarStream.digest(); got != src.diffID {
			return m, &errDigest{what: "the layer's diffID in the image config", want: src.diffID, got: got}
		}
		return m, nil
	}()

	// Read what is left of the blob, so its digest can be checked even when
	// unpacking failed: a corrupt blob is reported as such, not as the gzip
	// or tar error it caused.
	_, drainErr := io.Copy(io.Discard, br)
	if err := ctx.Err(); err != nil {
		return layerMeta{}, err
	}
	if drainErr != nil && !isVerifyErr(drainErr) {
		// The blob could not be read whole (network, or past its size).
		if unpackErr != nil {
			return layerMeta{}, fmt.Errorf("layer %s: %w", layerName(src), unpackErr)
		}
		return layerMeta{}, fmt.Errorf("layer %s: %w", layerName(src), drainErr)
	}
	if src.digest != "" {
		if got := blob.digest(); got != src.digest {
			return layerMeta{}, fmt.Errorf("layer %s: %w", src.digest, &errDigest{what: "the blob's digest in the manifest", want: src.digest, got: got})
		}
	}
	if src.size >= 0 && blob.n != src.size {
		return layerMeta{}, fmt.Errorf("layer %s: size mismatch: the manifest says %d bytes, got %d", layerName(src), src.size, blob.n)
	}
	if unpackErr != nil {
		return layerMeta{}, fmt.Errorf("layer %s: %w", layerName(src), unpackErr)
	}
	if drainErr != nil {
		return layerMeta{}, fmt.Errorf("layer %s: %w", layerName(src), drainErr)
	}
	return m, nil
}

// isVerifyErr reports whether err is go-containerregistry's own digest
// or size check failing at the end of a blob.
func isVerifyErr(err error) bool {
	return err != nil && strings.Contains(err.Error(), "error verifying")
}

func layerName(src layerSource) string {
	if src.digest != "" {
		return src.digest
	}
	return src.diffID
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// decompress picks the decompressor by the stream's magic bytes, which is
// more reliable than media types: gzip, zstd, or a plain tar.
func decompress(br *bufio.Reader) (io.ReadCloser, error) {
	magic, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(1<<27))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return zr.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
}
