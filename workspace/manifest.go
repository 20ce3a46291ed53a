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
//
// Two kinds of regular file keep only what they hold (both added after
// the first manifests, which have neither and read as before):
//   - a second name of a file (a hard link) has HardLink, the path of the
//     entry holding the data, and no object of its own; a restore links
//     it to that entry again;
//   - a sparse file has Sparse and Extents, its data regions as [offset,
//     length] pairs; its object holds those regions' bytes one after the
//     other, Size stays its length, and a restore leaves the rest holes.
type Entry struct {
	Path     string      `json:"p"`
	Mode     fs.FileMode `json:"m"`
	Size     int64       `json:"s,omitempty"`
	Hash     string      `json:"h,omitempty"`
	Link     string      `json:"l,omitempty"`
	HardLink string      `json:"hl,omitempty"`
	Sparse   bool        `json:"sp,omitempty"`
	Extents  [][2]int64  `json:"x,omitempty"`
}

// Bytes is what the manifest's files hold: a hard link counted once, a
// sparse file by its data.
func (m *Manifest) Bytes() int64 {
	var n int64
	for i := range m.Entries {
		n += m.Entries[i].dataBytes()
	}
	return n
}

// dataBytes is the size of e's object: what e costs the store and the
// workspace.
func (e *Entry) dataBytes() int64 {
	switch {
	case !e.Mode.IsRegular() || e.HardLink != "":
		return 0
	case e.Sparse:
		n := int64(0)
		for _, x := range e.Extents {
			n += x[1]
		}
		return n
	}
	return e.Size
}

// maxExtents bounds the data regions kept of one sparse file (and read
// back from a manifest): past it, neighbouring regions are kept as one,
// with the hole between them read as zeros.
const maxExtents = 512

// appendExtent adds the region [off, off+n) to ext, which is in order,
// joining it to the last one when they touch, and halving the list by
// joining neighbours when it reaches 2*maxExtents.
func appendExtent(ext [][2]int64, off, n int64) [][2]int64 {
	if l := len(ext); l > 0 && ext[l-1][0]+ext[l-1][1] == off {
		ext[l-1][1] += n
		return ext
	}
	ext = append(ext, [2]int64{off, n})
	for len(ext) > maxExtents {
		j := 0
		for i := 0; i < len(ext); i += 2 {
			if i+1 < len(ext) {
				ext[j] = [2]int64{ext[i][0], ext[i+1][0] + ext[i+1][1] - ext[i][0]}
			} else {
				ext[j] = ext[i]
			}
			j++
		}
		ext = ext[:j]
	}
	return ext
}

// maxFileSize bounds a file's length in a workspace copy (ext4's largest
// file): a sparse entry's length costs the store nothing, so a store that
// is not trusted could otherwise make a restore write a file of any length.
const maxFileSize = 16 << 40

// checkEntry refuses a regular file's entry read from a store whose
// hard link or sparse fields cannot be right.
func checkEntry(e *Entry) error {
	bad := func(why string) error { return corruptf("manifest: entry %q: %s", e.Path, why) }
	if e.Size < 0 {
		return bad("negative size")
	}
	if e.Size > maxFileSize {
		return bad(fmt.Sprintf("a file of %d bytes, longer than the %d (16 TiB) a workspace file may be", e.Size, int64(maxFileSize)))
	}
	if e.HardLink != "" {
		if e.Hash != "" || e.Sparse || len(e.Extents) > 0 || !fs.ValidPath(e.HardLink) {
			return bad("a hard link with data of its own")
		}
		return nil
	}
	if !e.Sparse {
		if len(e.Extents) > 0 {
			return bad("extents of a file that is not sparse")
		}
		return nil
	}
	if len(e.Extents) > maxExtents {
		return bad("too many extents")
	}
	end := int64(0)
	for _, x := range e.Extents {
		if x[0] < end || x[1] <= 0 || x[0] > e.Size || x[1] > e.Size-x[0] {
			return bad("extents out of order or past the end")
		}
		end = x[0] + x[1]
	}
	return nil
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

// cached is a file's entry (its data fields) as of stat key.
type cached struct {
	key statKey
	e   Entry
}

// inode tells files apart: two names of one inode are one file.
type inode struct{ dev, ino uint64 }

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
	// Vanished counts names that went away while the scan looked at them
	// (a rename or a removal under it): the scan missed them.
	Vanished int
}

// scanStamps is what a scan saw of each path's stat (scanWith): the key
// of every entry, and which are directories.
type scanStamps struct {
	keys map[string]statKey
	dirs []string
}

// unchanged says every directory of st, under dir, still has the stat it
// had in the scan: no name was added, removed or renamed in it since.
func (st *scanStamps) unchanged(dir string) bool {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return false
	}
	defer root.Close()
	for _, p := range st.dirs {
		name := p
		if name == "" {
			name = "."
		}
		info, err := root.Lstat(name)
		if err != nil || keyOf(info) != st.keys[p] {
			return false
		}
	}
	return true
}

// scan walks dir (confined by os.Root: no symlink leads out of it) and
// stores every regular file it has not seen unchanged in cache into the
// local store. Special files (fifos, devices, sockets) are skipped. A
// file with several names in dir is stored once (the others are hard
// links to it), and a sparse file by its data regions. It reads at most
// limit bytes, counting what files really hold (their allocated blocks,
// each inode once): a file holding more, or files adding up to more,
// fail the scan with an error naming the file. The objects it names are
// pinned into pins.
func (s *store) scan(ctx context.Context, dir string, cache scanCache, limit int64, pins *pinSet) (*Manifest, scanStats, error) {
	return s.scanWith(ctx, dir, cache, limit, pins, nil)
}

// scanWith is scan, also noting into stamps (unless nil) the stat of dir
// and of every path it saw.
func (s *store) scanWith(ctx context.Context, dir string, cache scanCache, limit int64, pins *pinSet, stamps *scanStamps) (*Manifest, scanStats, error) {
	var st scanStats
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, st, fmt.Errorf("open workspace: %w", err)
	}
	defer root.Close()
	if stamps != nil {
		info, err := root.Lstat(".")
		if err != nil {
			return nil, st, fmt.Errorf("open workspace: %w", err)
		}
		stamps.keys[""], stamps.dirs = keyOf(info), append(stamps.dirs, "")
	}
	m := &Manifest{Version: 1, CreatedAt: time.Now().UTC()}
	seen := map[string]bool{}
	names := map[inode]string{} // a file of several names -> the name whose entry holds its data
	linked := map[string]inode{}
	total := int64(0)
	err = walk(ctx, root, "", func(dir *os.Root, p, name string, info fs.FileInfo) error {
		if info == nil {
			st.Vanished++
			return nil
		}
		if stamps != nil {
			stamps.keys[p] = keyOf(info)
			if info.IsDir() {
				stamps.dirs = append(stamps.dirs, p)
			}
		}
		e := Entry{Path: p, Mode: info.Mode() & (fs.ModeType | fs.ModePerm)}
		switch {
		case info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			var err error
			if e.Link, err = dir.Readlink(name); err != nil {
				st.Vanished++
				return nil
			}
		case info.Mode().IsRegular():
			seen[p] = true
			st.Files++
			id, nlink, allocated, ok := inodeOf(info)
			if ok && nlink > 1 {
				if first, dup := names[id]; dup {
					e.HardLink = first // made the first name's in path order below
					linked[p] = id
					break
				}
			}
			k := keyOf(info)
			if k.size > maxFileSize {
				return fmt.Errorf("%s is %d bytes long: a workspace file may be at most %d (16 TiB)", p, k.size, int64(maxFileSize))
			}
			if err := overLimit(p, min(k.size, max(allocated, 0)), total, limit); err != nil {
				return err
			}
			if c, ok := cache[p]; ok && c.key == k {
				// Unless collected since (a deleted snapshot named it).
				if ok, err := s.pinObject(c.e.Hash, "", pins); err != nil {
					return fmt.Errorf("local store: %v", err)
				} else if ok {
					e.Size, e.Hash, e.Sparse, e.Extents = c.e.Size, c.e.Hash, c.e.Sparse, c.e.Extents
					if err := overLimit(p, e.dataBytes(), total, limit); err != nil {
						return err
					}
					total += e.dataBytes()
					break
				}
			}
			fe, k2, err := s.storeFile(ctx, dir, name, limit-total, pins)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotRegular) {
					st.Vanished++
					return nil
				}
				return err
			}
			n := fe.dataBytes()
			st.Hashed++
			st.HashedBytes += n
			total += n
			e.Size, e.Hash, e.Sparse, e.Extents = fe.Size, fe.Hash, fe.Sparse, fe.Extents
			if time.Since(time.Unix(0, k2.ctime)) > racyWindow {
				cache[p] = cached{k2, e}
			} else {
				delete(cache, p)
			}
		default:
			return nil
		}
		if e.Mode.IsRegular() && e.HardLink == "" {
			if id, nlink, _, ok := inodeOf(info); ok && nlink > 1 {
				names[id] = p
				linked[p] = id
			}
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
	relink(m.Entries, linked)
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
	// 8 random bytes in hex, as dataplane/files.go's Write names it.
	rnd, ok := strings.CutPrefix(name, ".sandgate-upload-")
	rnd, ok2 := strings.CutSuffix(rnd, ".tmp")
	return ok && ok2 && len(rnd) == 16 && strings.Trim(rnd, "0123456789abcdef") == ""
}

// relink makes the first name in path order of each file with several
// names (linked: name -> its inode) the one holding its data, and every
// other name a hard link to it, so that a restore, in path order, makes
// the file before linking to it.
func relink(entries []Entry, linked map[string]inode) {
	if len(linked) == 0 {
		return
	}
	first := map[inode]int{}
	for i := range entries {
		id, ok := linked[entries[i].Path]
		if !ok {
			continue
		}
		if _, ok := first[id]; !ok {
			first[id] = i
		}
	}
	for i := range entries {
		e := &entries[i]
		id, ok := linked[e.Path]
		if !ok || e.HardLink != "" {
			continue
		}
		// e holds the data: move it to the first name.
		f := &entries[first[id]]
		if f != e {
			f.Size, f.Hash, f.Sparse, f.Extents, f.HardLink = e.Size, e.Hash, e.Sparse, e.Extents, ""
			e.Size, e.Hash, e.Sparse, e.Extents = 0, "", false, nil
		}
	}
	for i := range entries {
		e := &entries[i]
		if id, ok := linked[e.Path]; ok && first[id] != i {
			e.HardLink = entries[first[id]].Path
			e.Size, e.Hash, e.Sparse, e.Extents = 0, "", false, nil
		}
	}
}

// walk calls fn for every entry under dir (but uploads in flight), in path order, with the
// directory holding it, open as a root of its own, so that every lookup
// is of one name relative to an open directory (one system call, and no
// path resolved twice). Directories are entered after fn saw them;
// entries removed meanwhile are skipped, fn told of each with a nil info.
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
			if err := fn(dir, path.Join(prefix, name), name, nil); err != nil { // gone since the listing
				return err
			}
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
				if err := fn(dir, rel, name, nil); err != nil {
					return err
				}
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
// store, then names the object by its hash and pins it. A sparse file
// (fewer bytes allocated than its length) is read by its data regions
// only. It returns the file's entry (its data fields), having read at
// most max bytes (a file that holds, or grew to, more is errTooLarge),
// and the stat the file had when opened.
func (s *store) storeFile(ctx context.Context, root *os.Root, p string, max int64, pins *pinSet) (Entry, statKey, error) {
	return s.storeFileFlags(ctx, root, p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, true, max, pins)
}

// storeFileFlags is storeFile with open flags (a FIFO must never block:
// O_NONBLOCK always); with sparse false, a sparse file is read whole,
// its holes as zeros (an artifact is the file's bytes).
func (s *store) storeFileFlags(ctx context.Context, root *os.Root, p string, flags int, sparse bool, max int64, pins *pinSet) (Entry, statKey, error) {
	var e Entry
	f, err := root.OpenFile(p, flags|syscall.O_NONBLOCK, 0)
	if err != nil {
		return e, statKey{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return e, statKey{}, err
	}
	if !info.Mode().IsRegular() {
		return e, statKey{}, errNotRegular
	}
	k := keyOf(info)
	e.Size = k.size
	var src io.Reader = io.LimitReader(f, max+1)
	if _, _, allocated, ok := inodeOf(info); sparse && ok && allocated < k.size {
		ext, ok, err := dataExtents(f, k.size)
		if err != nil {
			return e, k, fmt.Errorf("read %s: %w", p, err)
		}
		if ok && !(len(ext) == 1 && ext[0] == [2]int64{0, k.size}) {
			e.Sparse, e.Extents = true, ext
			readers := make([]io.Reader, len(ext))
			for i, x := range ext {
				readers[i] = io.NewSectionReader(f, x[0], x[1])
			}
			src = io.LimitReader(io.MultiReader(readers...), max+1)
		}
	}
	if want := e.dataBytes(); want > max {
		return e, k, errTooBig(fmt.Sprintf("file %q", p), want, max)
	}
	// Failures of the store are not the file's: %v, so that a missing
	// store directory is not taken for a file removed meanwhile.
	tmp, err := os.CreateTemp(s.tmpDir, "obj-*")
	if err != nil {
		return e, k, fmt.Errorf("local store: %v", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, tmp), src)
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("local store: %v", cerr)
	}
	if err != nil {
		return e, k, fmt.Errorf("read %s: %w", p, err)
	}
	if n > max {
		return e, k, errTooBig(fmt.Sprintf("file %q (grown while read)", p), n, max)
	}
	if e.Sparse {
		if n != e.dataBytes() { // cut short while read: keep what was read
			e.Sparse, e.Extents, e.Size = false, nil, n
		}
	} else {
		e.Size = n
	}
	e.Hash = hex.EncodeToString(h.Sum(nil))
	if _, err := s.pinObject(e.Hash, tmp.Name(), pins); err != nil {
		return e, k, fmt.Errorf("local store: %v", err)
	}
	return e, k, nil
}

// restore writes manifest m's entries into the empty directory dir, owned
// by dir's owner, reading objects from the local store (fetched from the
// remote one first where missing). It writes at most the workspace's
// limit (limitFor dir), and every object is checked against its hash and
// size as it is copied.
func (s *store) restore(ctx context.Context, m *Manifest, dir string) error {
	limit, total := s.limitFor(dir), int64(0)
	for i := range m.Entries {
		e := &m.Entries[i]
		if !e.Mode.IsRegular() {
			continue
		}
		if err := checkEntry(e); err != nil {
			return err
		}
		if n := e.dataBytes(); n > limit-total {
			return errTooBig(fmt.Sprintf("the manifest's files (at %q)", e.Path), total+n, limit)
		}
		total += e.dataBytes()
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
	files := map[string]bool{} // the regular files made so far, which a hard link may name
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
		case e.Mode.IsRegular() && e.HardLink != "":
			if !files[e.HardLink] {
				return corruptf("manifest: %q links to %q, which is no file before it", e.Path, e.HardLink)
			}
			if err := root.Link(e.HardLink, e.Path); err != nil {
				return fmt.Errorf("restore %s: %w", e.Path, err)
			}
		case e.Mode.IsRegular():
			if err := s.restoreFile(ctx, root, e); err != nil {
				return err
			}
			files[e.Path] = true
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

func (s *store) restoreFile(ctx context.Context, root *os.Root, e Entry) error {
	src, err := s.openObject(ctx, e.Hash, e.dataBytes())
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := root.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if e.Sparse {
		err = restoreSparse(dst, src, &e)
	} else {
		_, err = io.Copy(dst, src)
	}
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

// restoreSparse writes e's data regions from src (their bytes one after
// the other, read to its end so that it is verified) into dst, and makes
// dst e's length: what lies between the regions stays holes.
func restoreSparse(dst *os.File, src io.Reader, e *Entry) error {
	for _, x := range e.Extents {
		if _, err := io.CopyN(io.NewOffsetWriter(dst, x[0]), src, x[1]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	if n, err := io.Copy(io.Discard, src); err != nil || n > 0 {
		return errors.Join(err, corruptf("object %s is longer than the file's data", e.Hash))
	}
	return dst.Truncate(e.Size)
}
