package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Manifest is one version of a workspace's files.
type Manifest struct {
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"createdAt"`
	Entries   []Entry   `json:"entries"`
}

// Entry is one path of a manifest: a directory, a regular file (Hash
// names its object) or a symlink (Link is its target).
type Entry struct {
	Path string      `json:"p"`
	Mode fs.FileMode `json:"m"`
	Size int64       `json:"s,omitempty"`
	Hash string      `json:"h,omitempty"`
	Link string      `json:"l,omitempty"`
}

// Bytes is the total size of the manifest's files.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// objectKey is where object hash (validHash) is stored.
func objectKey(hash string) string { return "objects/" + hash[:2] + "/" + hash }

// validHash says whether h is a SHA-256 in lower-case hex, as manifests
// name objects (a manifest read back from the object store is input).
func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// statKey is what tells a file unchanged since it was last hashed.
type statKey struct {
	size, mtime, ctime int64
	ino                uint64
}

type cached struct {
	key  statKey
	hash string
}

// scanCache remembers each path's hash with the stat it had, so a scan
// reads only files that changed. It belongs to one workspace directory.
type scanCache map[string]cached

// racyWindow: a file changed less than this before it was read may change
// again without its ctime moving (timestamps advance by clock ticks), so
// its hash is not trusted from the cache.
const racyWindow = 100 * time.Millisecond

// scanStats counts what a scan did.
type scanStats struct {
	Files, Hashed int
	HashedBytes   int64
}

// scan walks dir (confined by os.Root: no symlink leads out of it) and
// stores every regular file it has not seen unchanged in cache into the
// local store. Special files (fifos, devices, sockets) are skipped. It
// reads at most limit bytes: a file larger than that (a sparse file whose
// holes would be read as zeros), or files adding up to more, fail the
// scan with an error naming the file. The objects it names are pinned
// into pins.
func (s *Service) scan(ctx context.Context, dir string, cache scanCache, limit int64, pins *pinSet) (*Manifest, scanStats, error) {
	var st scanStats
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, st, fmt.Errorf("open workspace: %w", err)
	}
	defer root.Close()
	m := &Manifest{Version: 1, CreatedAt: time.Now().UTC()}
	seen := map[string]bool{}
	total := int64(0)
	err = walk(ctx, root, "", func(dir *os.Root, p, name string, info fs.FileInfo) error {
		e := Entry{Path: p, Mode: info.Mode() & (fs.ModeType | fs.ModePerm)}
		switch {
		case info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			var err error
			if e.Link, err = dir.Readlink(name); err != nil {
				return nil
			}
		case info.Mode().IsRegular():
			seen[p] = true
			st.Files++
			k := keyOf(info)
			if err := overLimit(p, k.size, total, limit); err != nil {
				return err
			}
			if c, ok := cache[p]; ok && c.key == k {
				// Unless collected since (a deleted snapshot named it).
				if ok, err := s.pinObject(c.hash, "", pins); err != nil {
					return fmt.Errorf("local store: %v", err)
				} else if ok {
					e.Size, e.Hash = k.size, c.hash
					total += k.size
					break
				}
			}
			hash, n, k2, err := s.storeFile(ctx, dir, name, limit-total, pins)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotRegular) {
					return nil
				}
				return err
			}
			st.Hashed++
			st.HashedBytes += n
			total += n
			e.Size, e.Hash = n, hash
			if time.Since(time.Unix(0, k2.ctime)) > racyWindow {
				cache[p] = cached{k2, hash}
			} else {
				delete(cache, p)
			}
		default:
			return nil
		}
		m.Entries = append(m.Entries, e)
		return nil
	})
	if err != nil {
		return nil, st, fmt.Errorf("scan workspace: %w", err)
	}
	// Directory by directory is not string order ("a/x" comes before
	// "a-b" so): manifests are.
	slices.SortFunc(m.Entries, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	for p := range cache {
		if !seen[p] {
			delete(cache, p)
		}
	}
	return m, st, nil
}

// uploadTemp says name is the temporary file of a REST upload in flight
// (dataplane's ".sandgate-upload-<hex>.tmp", renamed to its own name once
// complete): not content yet, never synced or snapshotted.
func uploadTemp(name string) bool {
	return strings.HasPrefix(name, ".sandgate-upload-") && strings.HasSuffix(name, ".tmp")
}

// walk calls fn for every entry under dir (but uploads in flight), in path order, with the
// directory holding it, open as a root of its own, so that every lookup
// is of one name relative to an open directory (one system call, and no
// path resolved twice). Directories are entered after fn saw them;
// entries removed meanwhile are skipped.
func walk(ctx context.Context, dir *os.Root, prefix string, fn func(dir *os.Root, rel, name string, info fs.FileInfo) error) error {
	f, err := dir.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := dir.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if info.Mode().IsRegular() && uploadTemp(name) {
			continue
		}
		rel := path.Join(prefix, name)
		if err := fn(dir, rel, name, info); err != nil {
			return err
		}
		if !info.IsDir() {
			continue
		}
		sub, err := dir.OpenRoot(name)
		if err != nil {
			// Removed, or replaced (by a symlink) since the Lstat: skip.
			if now, lerr := dir.Lstat(name); errors.Is(err, fs.ErrNotExist) || lerr != nil || !now.IsDir() {
				continue
			}
			return err
		}
		err = walk(ctx, sub, rel, fn)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func keyOf(info fs.FileInfo) statKey {
	k := statKey{size: info.Size(), mtime: info.ModTime().UnixNano()}
	k.ctime, k.ino = ctimeIno(info)
	return k
}

var errNotRegular = errors.New("not a regular file")

// overLimit says why a file of size at p is refused when the files
// before it hold total bytes of the workspace's limit.
func overLimit(p string, size, total, limit int64) error {
	switch {
	case size > limit:
		return errTooBig(fmt.Sprintf("file %q", p), size, limit)
	case size > limit-total:
		return errTooBig(fmt.Sprintf("the files up to %q", p), total+size, limit)
	}
	return nil
}

// storeFile hashes p while copying it into a temporary file of the local
// store, then names the object by its hash and pins it. It returns the
// bytes it read (at most max: a file that grew past it is errTooLarge)
// and the stat the file had when opened.
func (s *Service) storeFile(ctx context.Context, root *os.Root, p string, max int64, pins *pinSet) (string, int64, statKey, error) {
	return s.storeFileFlags(ctx, root, p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, max, pins)
}

// storeFileFlags is storeFile with open flags (a FIFO must never block:
// O_NONBLOCK always).
func (s *Service) storeFileFlags(ctx context.Context, root *os.Root, p string, flags int, max int64, pins *pinSet) (string, int64, statKey, error) {
	f, err := root.OpenFile(p, flags|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", 0, statKey{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", 0, statKey{}, err
	}
	if !info.Mode().IsRegular() {
		return "", 0, statKey{}, errNotRegular
	}
	k := keyOf(info)
	if k.size > max {
		return "", 0, k, errTooBig(fmt.Sprintf("file %q", p), k.size, max)
	}
	// Failures of the store are not the file's: %v, so that a missing
	// store directory is not taken for a file removed meanwhile.
	tmp, err := os.CreateTemp(s.tmpDir, "obj-*")
	if err != nil {
		return "", 0, k, fmt.Errorf("local store: %v", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, tmp), io.LimitReader(f, max+1))
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("local store: %v", cerr)
	}
	if err != nil {
		return "", 0, k, fmt.Errorf("read %s: %w", p, err)
	}
	if n > max {
		return "", 0, k, errTooBig(fmt.Sprintf("file %q (grown while read)", p), n, max)
	}
	hash := hex.EncodeToString(h.Sum(nil))
	if _, err := s.pinObject(hash, tmp.Name(), pins); err != nil {
		return "", 0, k, fmt.Errorf("local store: %v", err)
	}
	return hash, n, k, nil
}

// restore writes manifest m's entries into the empty directory dir, owned
// by dir's owner, reading objects from the local store (fetched from the
// remote one first where missing). It writes at most the workspace's
// limit (limitFor dir), and every object is checked against its hash and
// size as it is copied.
func (s *Service) restore(ctx context.Context, m *Manifest, dir string) error {
	limit, total := s.limitFor(dir), int64(0)
	for _, e := range m.Entries {
		if !e.Mode.IsRegular() {
			continue
		}
		if e.Size < 0 || e.Size > limit-total {
			return errTooBig(fmt.Sprintf("the manifest's files (at %q)", e.Path), total+e.Size, limit)
		}
		total += e.Size
	}
	var owner syscall.Stat_t
	if err := syscall.Stat(dir, &owner); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	entries := slices.Clone(m.Entries)
	// Lexical order puts a directory before what it holds.
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	for _, e := range entries {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !fs.ValidPath(e.Path) || e.Path == "." {
			return fmt.Errorf("manifest: bad path %q", e.Path)
		}
		switch {
		case e.Mode.IsDir():
			if err := root.Mkdir(e.Path, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case e.Mode&fs.ModeSymlink != 0:
			if err := root.Symlink(e.Link, e.Path); err != nil {
				return err
			}
		case e.Mode.IsRegular():
			if err := s.restoreFile(ctx, root, e); err != nil {
				return err
			}
		default:
			continue
		}
		if err := root.Lchown(e.Path, int(owner.Uid), int(owner.Gid)); err != nil {
			return err
		}
		if e.Mode&fs.ModeSymlink == 0 {
			if err := root.Chmod(e.Path, e.Mode&fs.ModePerm); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Service) restoreFile(ctx context.Context, root *os.Root, e Entry) error {
	src, err := s.openObject(ctx, e.Hash, e.Size)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := root.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, errCorrupt) && s.cfg.Remote != nil {
			// A local copy cut short (a power loss) or damaged: the next
			// restore fetches the object store's copy.
			_ = s.local.Delete(ctx, objectKey(e.Hash))
		}
		return fmt.Errorf("restore %s: %w", e.Path, err)
	}
	return nil
}
