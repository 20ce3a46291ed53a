package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

// Whiteouts in OCI layers, and their overlayfs form.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
	nobody         = 65534
	maxImageID     = 65535 // the sandbox maps ids 0..65535
	xattrPAXPrefix = "SCHILY.xattr."
	keptXattrNS    = "user."
	overlayUserNS  = "user.overlay." // overlayfs's metadata when mounted with userxattr
)

// unpacker writes one layer's tar into a directory. Every file operation
// goes through an os.Root at that directory, so the kernel refuses a path
// that leaves it, whether by "..", an absolute path or a symlink.
type unpacker struct {
	root    *os.Root
	opts    unpackOpts
	limits  Limits
	meta    layerMeta
	skipped map[string]bool // entries not created (devices), for hard links to them
	dirs    []dirTimes
	buf     []byte // file data in flight
}

// unpackOpts are an unpack's bounds: the layer's (limits), the store's
// quota and free space (space) and the image's (image). space and image
// may be nil.
type unpackOpts struct {
	limits Limits
	space  *spaceCharge
	image  *imageBudget
}

// blockSize is the granularity of holes: an aligned block of zeros in a
// file's data is not written.
const blockSize = 4096

var zeroBlock [blockSize]byte

type dirTimes struct {
	name         string
	atime, mtime time.Time
}

// unpack reads the tar stream r into dir, in overlayfs form: OCI whiteouts
// become 0:0 character devices, opaque markers the trusted.overlay.opaque
// xattr. It refuses the layer (an error; the caller removes dir) for an
// entry whose path leaves the layer, a write through a symlink that leaves
// it, a hard link to a target outside it, or a bound crossed; it skips
// device nodes and FIFOs; strips setuid and setgid from files (setuid from
// directories); keeps only user.* xattrs; and maps owners above 65535 to
// 65534.
//
// File data is written sparsely: an aligned block of zeros, whether a hole
// of a sparse tar entry or zeros in a regular one, is skipped and the file
// is truncated to its size, so it takes no disk.
func unpack(r io.Reader, dir string, lim Limits) (layerMeta, error) {
	return unpackWith(r, dir, unpackOpts{limits: lim})
}

func unpackWith(r io.Reader, dir string, opts unpackOpts) (layerMeta, error) {
	lim := opts.limits
	root, err := os.OpenRoot(dir)
	if err != nil {
		return layerMeta{}, err
	}
	defer root.Close()
	u := &unpacker{root: root, opts: opts, limits: lim, skipped: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.meta, fmt.Errorf("reading tar: %w", err)
		}
		u.meta.Entries++
		if u.meta.Entries > lim.MaxLayerEntries {
			return u.meta, fmt.Errorf("%w: more than %d entries in the layer", ErrTooLarge, lim.MaxLayerEntries)
		}
		// Sparse files are longer than the stream carries: bound their
		// sizes, not only what is read.
		if hdr.Size < 0 || hdr.Size > lim.MaxLayerBytes-u.meta.Size {
			return u.meta, fmt.Errorf("%w: entry %q: %d bytes is larger than the limit of the layer (%s)", ErrTooLarge, hdr.Name, hdr.Size, fmtBytes(lim.MaxLayerBytes))
		}
		if isData(hdr.Typeflag) {
			if err := opts.image.addFiles(hdr.Size); err != nil {
				return u.meta, fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.meta, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	// Directory times last, deepest first, as writing into a directory
	// changes its mtime.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		if err := root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return u.meta, fmt.Errorf("directory %q: %w", d.name, err)
		}
	}
	return u.meta, nil
}

// cleanPath makes a tar path relative to the layer root ("." is the root).
// An absolute path is read as relative to the layer root; a path that
// climbs out of it with ".." is an error.
func cleanPath(p string) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("invalid path %q", p)
	}
	c := path.Clean(p)
	if strings.HasPrefix(c, "/") {
		c = path.Clean("." + c) // "/" -> ".", "/a/../b" was already "/b"
	}
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %q leaves the layer", p)
	}
	return c, nil
}

func imageID(id int) int {
	if id < 0 || id > maxImageID {
		return nobody
	}
	return id
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := cleanPath(hdr.Name)
	if err != nil {
		return err
	}
	parent, base := path.Split(name)
	parent = path.Clean("./" + parent)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(parent, base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(name, hdr)
	case tar.TypeReg, tar.TypeRegA, tar.TypeCont, tar.TypeGNUSparse: //nolint:staticcheck // TypeRegA: old tars
		return u.file(name, hdr, r)
	case tar.TypeSymlink:
		return u.symlink(name, hdr)
	case tar.TypeLink:
		return u.hardlink(name, hdr)
	default:
		// Character and block devices, FIFOs and unknown types give the
		// sandbox nothing it should have: skipped.
		u.skipped[name] = true
		return nil
	}
}

// prepare clears the way for a new entry at name: its parents exist, and
// whatever was there is gone unless both are directories (kept reports
// that). Lstat goes through the Root, so a parent that is a symlink
// leaving the layer is refused here.
func (u *unpacker) prepare(name string, dir bool) (kept bool, err error) {
	if name == "." {
		if !dir {
			return false, errors.New("the layer root must be a directory")
		}
		return true, nil
	}
	fi, err := u.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, u.root.MkdirAll(path.Dir(name), 0o755)
	}
	if err != nil {
		return false, err
	}
	if dir && fi.IsDir() {
		return true, nil
	}
	delete(u.skipped, name)
	if fi.IsDir() {
		return false, u.root.RemoveAll(name)
	}
	return false, u.root.Remove(name)
}

func (u *unpacker) dir(name string, hdr *tar.Header) error {
	kept, err := u.prepare(name, true)
	if err != nil {
		return err
	}
	if !kept {
		if err := u.charge(dirBlock); err != nil {
			return err
		}
		if err := u.root.Mkdir(name, 0o700); err != nil {
			return err
		}
		u.meta.AllocBytes += dirBlock
	}
	if err := u.root.Lchown(name, imageID(hdr.Uid), imageID(hdr.Gid)); err != nil {
		return err
	}
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid // inherited group only: no privilege
	}
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if err := u.root.Chmod(name, mode); err != nil {
		return err
	}
	if err := u.xattrs(name, hdr); err != nil {
		return err
	}
	u.dirs = append(u.dirs, dirTimes{name, atime(hdr), hdr.ModTime})
	return nil
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

func (u *unpacker) file(name string, hdr *tar.Header, r io.Reader) error {
	if _, err := u.prepare(name, false); err != nil {
		return err
	}
	// O_EXCL: never opens an existing file or follows a symlink.
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := u.writeData(f, r, hdr.Size)
	u.meta.Size += n
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil {
			u.meta.AllocBytes += allocated(fi)
		}
	}
	if err == nil {
		err = f.Chown(imageID(hdr.Uid), imageID(hdr.Gid))
	}
	if err == nil {
		// Permission bits only: setuid, setgid and sticky are dropped.
		err = f.Chmod(fs.FileMode(hdr.Mode) & fs.ModePerm)
	}
	if err == nil {
		err = setXattrs(f, userXattrs(hdr))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return u.root.Chtimes(name, atime(hdr), hdr.ModTime)
}

// isData reports whether entries of type t carry a file's data. Go's
// tar reader gives a sparse entry (GNU or PAX) as TypeReg or TypeGNUSparse
// with its holes as zeros; TypeCont (contiguous files) is a regular file.
func isData(t byte) bool {
	switch t {
	case tar.TypeReg, tar.TypeRegA, tar.TypeCont, tar.TypeGNUSparse: //nolint:staticcheck // TypeRegA: old tars
		return true
	}
	return false
}

// charge counts n bytes about to be written against the store's space.
func (u *unpacker) charge(n int64) error {
	if u.opts.space == nil {
		return nil
	}
	return u.opts.space.charge(n)
}

// writeData copies size bytes of r into the new, empty file f, leaving a
// hole for every aligned block of zeros, then sets f's size: a sparse
// entry's holes and zero runs in a regular file take no disk. It returns
// the bytes read.
func (u *unpacker) writeData(f *os.File, r io.Reader, size int64) (int64, error) {
	if u.buf == nil {
		u.buf = make([]byte, 1<<20)
	}
	var off int64
	for off < size {
		n, err := io.ReadFull(r, u.buf[:min(int64(len(u.buf)), size-off)])
		if n > 0 {
			if werr := u.writeSparse(f, u.buf[:n], off); werr != nil {
				return off, werr
			}
			off += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return off, fmt.Errorf("short file: %d of %d bytes", off, size)
		}
		if err != nil {
			return off, err
		}
	}
	// The size also covers a hole at the end.
	return off, f.Truncate(size)
}

// writeSparse writes p at off in f, but for the blocks of p (aligned to
// the file's offsets) that are all zeros; runs of data blocks go in one
// write each.
func (u *unpacker) writeSparse(f *os.File, p []byte, off int64) error {
	run := -1 // start in p of the run of data blocks not yet written
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		b := p[run:end]
		run = -1
		if err := u.charge(int64(len(b))); err != nil {
			return err
		}
		_, err := f.WriteAt(b, off+int64(end-len(b)))
		return err
	}
	for i := 0; i < len(p); {
		end := min(len(p), i+blockSize-int((off+int64(i))%blockSize))
		if bytes.Equal(p[i:end], zeroBlock[:end-i]) {
			if err := flush(i); err != nil {
				return err
			}
		} else if run < 0 {
			run = i
		}
		i = end
	}
	return flush(len(p))
}

func (u *unpacker) symlink(name string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return fmt.Errorf("invalid symlink target %q", hdr.Linkname)
	}
	if name == "." {
		return errors.New("the layer root must be a directory")
	}
	if _, err := u.prepare(name, false); err != nil {
		return err
	}
	// The target is kept as written: it is resolved inside the sandbox,
	// and every later operation here resolves through the Root.
	if err := u.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	return u.root.Lchown(name, imageID(hdr.Uid), imageID(hdr.Gid))
}

func (u *unpacker) hardlink(name string, hdr *tar.Header) error {
	target, err := cleanPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link: %w", err)
	}
	if u.skipped[target] {
		u.skipped[name] = true
		return nil
	}
	if target == name {
		return nil // a link to itself changes nothing
	}
	if _, err := u.prepare(name, false); err != nil {
		return err
	}
	// Link does not follow a symlink at target; the Root refuses a target
	// path that leaves the layer.
	if err := u.root.Link(target, name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hard link to %q, which is not in this layer", hdr.Linkname)
		}
		return err
	}
	return nil
}

// whiteout handles .wh.NAME (hide NAME of the layers below) and
// .wh..wh..opq (hide everything below in this directory).
func (u *unpacker) whiteout(parent, base string) error {
	if err := u.root.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	if base == whiteoutOpaque {
		d, err := u.root.Open(parent)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := setXattrs(d, map[string]string{opaqueXattr: "y"}); err != nil {
			return fmt.Errorf("opaque directory %q: %w", parent, err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk, ...): not content
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return fmt.Errorf("invalid whiteout %q", base)
	}
	p := path.Join(parent, target)
	if _, err := u.root.Lstat(p); err == nil {
		// The OCI spec: a whiteout hides only lower layers' files; one this
		// layer has itself stays.
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	d, err := u.root.Open(parent)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := mknodWhiteout(d, target); err != nil {
		return fmt.Errorf("whiteout %q: %w", p, err)
	}
	return nil
}

// xattrs sets a directory's user.* xattrs.
func (u *unpacker) xattrs(name string, hdr *tar.Header) error {
	x := userXattrs(hdr)
	if len(x) == 0 {
		return nil
	}
	d, err := u.root.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	return setXattrs(d, x)
}

// userXattrs is the entry's user.* xattrs but user.overlay.*. Everything
// else is dropped: security.capability and security.* labels, trusted.*
// and user.overlay.* (overlayfs's own metadata: redirects, opacity,
// whiteouts, metacopy, in its normal and its userxattr mounts),
// system.posix_acl_* (host ids).
func userXattrs(hdr *tar.Header) map[string]string {
	var out map[string]string
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok || !strings.HasPrefix(name, keptXattrNS) || strings.HasPrefix(name, overlayUserNS) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = v
	}
	return out
}
