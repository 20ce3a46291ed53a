package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Bounds on what is read back from a store: a manifest read from an
// object store is input, and a hostile or corrupted bucket must not make
// the gateway read or allocate without end.
const (
	maxDocBytes      = 4 << 20   // one doc (its list of pages)
	maxPages         = 1 << 16   // pages of one doc
	maxPageBytes     = 64 << 20  // one page
	maxManifestBytes = 256 << 20 // all of one doc's pages
	maxEntries       = 1 << 21   // entries of one doc
)

// errCorrupt marks a doc, page or object that is not what its name or
// its doc says: it will not become right by trying again.
var errCorrupt = errors.New("corrupt")

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errCorrupt, fmt.Sprintf(format, args...))
}

// limitFor is the most bytes a capture of, or a restore into, dir may
// hold: the size of dir's filesystem (a session's /workspace is a
// filesystem of its size limit), and at most Config.MaxBytes when set.
// A workspace cannot hold more than its filesystem; a sparse file whose
// apparent size is larger is refused rather than read hole by hole.
func (s *store) limitFor(dir string) int64 {
	limit := fsSize(dir)
	if m := s.cfg.MaxBytes; m > 0 && (limit <= 0 || m < limit) {
		limit = m
	}
	return limit
}

func errTooBig(what string, size, limit int64) error {
	return fmt.Errorf("%w: %s is %d bytes, more than the workspace's limit of %d bytes", errTooLarge, what, size, limit)
}

// errTooLarge: a capture or restore went over the workspace's limit.
var errTooLarge = errors.New("workspace too large")

// tooLargeWhy is what a tenant is told of err when it is errTooLarge:
// which of its own files is over the limit ("" otherwise).
func tooLargeWhy(err error) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.HasPrefix(e.Error(), errTooLarge.Error()+": ") {
			return ": " + e.Error()
		}
	}
	return ""
}

// pinSet is the objects one capture or upload stored or relies on and
// that no doc names yet: collect does not delete them meanwhile.
type pinSet struct{ hashes []string }

// pinObject stores the temporary file tmp (when not "") as object hash,
// or, with tmp "", checks that the local store has it; either way it
// pins the object for pins. It says false when tmp is "" and the object
// is missing. Pinning and the existence check are atomic with collect's
// deletions (pinMu).
func (s *store) pinObject(hash, tmp string, pins *pinSet) (bool, error) {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	p := filepath.Join(s.local.dir, filepath.FromSlash(objectKey(hash)))
	if _, err := os.Stat(p); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
		if tmp == "" {
			return false, nil
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return false, err
		}
		if err := os.Rename(tmp, p); err != nil {
			return false, err
		}
		s.unsynced.Store(true)
	}
	if pins != nil {
		s.pins[hash]++
		pins.hashes = append(pins.hashes, hash)
	}
	return true, nil
}

// unpin releases what pins holds.
func (s *store) unpin(pins *pinSet) {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	for _, h := range pins.hashes {
		if s.pins[h]--; s.pins[h] <= 0 {
			delete(s.pins, h)
		}
	}
	pins.hashes = nil
}

// deleteUnpinned deletes object key from b unless a capture pinned it.
func (s *store) deleteUnpinned(ctx context.Context, b Backend, key string) (bool, error) {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if s.pins[key[strings.LastIndexByte(key, '/')+1:]] > 0 {
		return false, nil
	}
	return true, b.Delete(ctx, key)
}

// verifier reads an object and fails at its end unless it had exactly
// size bytes of the given hash: a truncated object (a power cut before
// it reached the disk) or a corrupted one is an error, never a short
// file.
type verifier struct {
	r    io.ReadCloser
	lim  io.Reader
	h    hash.Hash
	n    int64
	size int64
	want string
}

func verifying(r io.ReadCloser, hash string, size int64) *verifier {
	return &verifier{r: r, lim: io.LimitReader(r, size+1), h: sha256.New(), size: size, want: hash}
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.lim.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.size {
		return n, corruptf("object %s is larger than its %d bytes", v.want, v.size)
	}
	if err == io.EOF {
		if v.n != v.size {
			return n, corruptf("object %s has %d bytes, not %d", v.want, v.n, v.size)
		}
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want {
			return n, corruptf("object %s has hash %s", v.want, got)
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.r.Close() }

// tombstoneKey marks doc key deleted locally until the object store's
// copy is deleted too: readDoc and the lists do not fall back to the
// remote copy of a tombstoned doc, and New queues the remote delete
// again after a restart.
func tombstoneKey(key string) string { return "tombstones/" + key }

func (s *store) tombstoned(key string) (bool, error) {
	p, err := s.local.path(tombstoneKey(key))
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// syncObjects makes the objects stored since the last call durable (one
// syncfs, syncStore), so that a doc written next never names an object
// a power cut left short. Nothing new stored: nothing to do.
func (s *store) syncObjects() error {
	if !s.unsynced.Swap(false) {
		return nil
	}
	if err := s.syncStore(); err != nil {
		s.unsynced.Store(true)
		return err
	}
	return nil
}
