package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/pkg/sftp"
)

// SFTPOption tunes ServeSFTP.
type SFTPOption func(*sftpOptions)

type sftpOptions struct {
	start string
}

// SFTPStartDir sets the directory, as the client sees paths, that relative
// paths start from and that `realpath .` answers (default "/").
func SFTPStartDir(dir string) SFTPOption {
	return func(o *sftpOptions) { o.start = path.Clean("/" + dir) }
}

// ServeSFTP serves the SFTP protocol on rw with every path resolved inside
// dir through os.Root: "..", absolute symlinks and symlinked directories that
// point outside dir are refused by the kernel-backed resolver, not by text checks.
// Clients see dir as "/". It returns when the client goes away.
//
// A dir of "/" means the process's whole filesystem, which only makes sense
// where the kernel confines the process (a linux sandbox: its own mount
// namespace, the sandbox user): then the plain server of pkg/sftp serves it,
// like OpenSSH's sftp-server, so absolute symlinks inside it work.
func ServeSFTP(dir string, rw io.ReadWriteCloser, opts ...SFTPOption) error {
	o := sftpOptions{start: "/"}
	for _, opt := range opts {
		opt(&o)
	}
	if dir == "/" {
		srv, err := sftp.NewServer(rw, sftp.WithServerWorkingDirectory(o.start))
		if err != nil {
			return fmt.Errorf("sftp: %w", err)
		}
		defer srv.Close()
		if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("sftp: %w", err)
		}
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open sftp root: %w", err)
	}
	defer root.Close()
	h := &rootHandler{root: root, start: o.start}
	// The allocator reuses packet buffers instead of allocating 32 KiB per
	// read or write request, which kept the garbage collector busy.
	srv := sftp.NewRequestServer(rw, sftp.Handlers{FileGet: h, FilePut: h, FileCmd: h, FileList: h},
		sftp.WithStartDirectory(o.start), sftp.WithRSAllocator())
	defer srv.Close()
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("sftp: %w", err)
	}
	return nil
}

// rootHandler implements pkg/sftp's request handlers over an os.Root.
type rootHandler struct {
	root  *os.Root
	start string // where relative paths start, as the client sees paths
}

// rel maps an SFTP path ("/a/b", "a/../b") to a path relative to the root.
func rel(p string) string {
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	if c == "" {
		return "."
	}
	return c
}

func (h *rootHandler) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	f, err := h.root.Open(rel(r.Filepath))
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err == nil && st.IsDir() {
		f.Close()
		return nil, syscall.EISDIR
	}
	return f, nil
}

func (h *rootHandler) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	return h.OpenFile(r)
}

// OpenFile implements sftp.OpenFileWriter so read-write opens work.
func (h *rootHandler) OpenFile(r *sftp.Request) (sftp.WriterAtReaderAt, error) {
	pf := r.Pflags()
	var flags int
	switch {
	case pf.Read && pf.Write:
		flags = os.O_RDWR
	case pf.Write:
		flags = os.O_WRONLY
	default:
		flags = os.O_RDONLY
	}
	if pf.Append {
		flags |= os.O_APPEND
	}
	if pf.Creat {
		flags |= os.O_CREATE
	}
	if pf.Trunc {
		flags |= os.O_TRUNC
	}
	if pf.Excl {
		flags |= os.O_EXCL
	}
	mode := os.FileMode(0o644)
	if r.AttrFlags().Permissions {
		mode = r.Attributes().FileMode().Perm()
	}
	return h.root.OpenFile(rel(r.Filepath), flags, mode)
}

func (h *rootHandler) Filecmd(r *sftp.Request) error {
	p := rel(r.Filepath)
	switch r.Method {
	case "Setstat":
		return h.setstat(p, r)
	case "Rename":
		// SFTP v3 rename must not replace an existing target.
		if _, err := h.root.Lstat(rel(r.Target)); err == nil {
			return os.ErrExist
		}
		return h.root.Rename(p, rel(r.Target))
	case "PosixRename":
		return h.root.Rename(p, rel(r.Target))
	case "Rmdir":
		st, err := h.root.Lstat(p)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return syscall.ENOTDIR
		}
		if p == "." {
			return os.ErrPermission
		}
		return h.root.Remove(p)
	case "Remove":
		st, err := h.root.Lstat(p)
		if err != nil {
			return err
		}
		if st.IsDir() {
			return syscall.EISDIR
		}
		return h.root.Remove(p)
	case "Mkdir":
		mode := os.FileMode(0o755)
		if r.AttrFlags().Permissions {
			mode = r.Attributes().FileMode().Perm()
		}
		return h.root.Mkdir(p, mode)
	case "Link":
		return h.root.Link(p, rel(r.Target))
	case "Symlink":
		// pkg/sftp puts the link's target in Filepath, raw, and the new link in
		// Target. The target is stored as given; following it later goes
		// through the root, so a link pointing outside resolves to nothing.
		return h.root.Symlink(r.Filepath, rel(r.Target))
	}
	return sftp.ErrSSHFxOpUnsupported
}

func (h *rootHandler) setstat(p string, r *sftp.Request) error {
	flags, attrs := r.AttrFlags(), r.Attributes()
	if flags.Size {
		f, err := h.root.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		err = f.Truncate(int64(attrs.Size))
		f.Close()
		if err != nil {
			return err
		}
	}
	if flags.Permissions {
		if err := h.root.Chmod(p, attrs.FileMode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return err
		}
	}
	if flags.Acmodtime {
		if err := h.root.Chtimes(p, time.Unix(int64(attrs.Atime), 0), time.Unix(int64(attrs.Mtime), 0)); err != nil {
			return err
		}
	}
	if flags.UidGid {
		if int(attrs.UID) != os.Getuid() || int(attrs.GID) != os.Getgid() {
			return os.ErrPermission
		}
	}
	return nil
}

func (h *rootHandler) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	p := rel(r.Filepath)
	switch r.Method {
	case "List":
		f, err := h.root.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		infos, err := f.Readdir(-1)
		if err != nil {
			return nil, err
		}
		return listerAt(infos), nil
	case "Stat":
		st, err := h.root.Stat(p)
		if err != nil {
			return nil, err
		}
		return listerAt{st}, nil
	case "Readlink":
		t, err := h.root.Readlink(p)
		if err != nil {
			return nil, err
		}
		return listerAt{linkInfo(t)}, nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// Lstat implements sftp.LstatFileLister.
func (h *rootHandler) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	st, err := h.root.Lstat(rel(r.Filepath))
	if err != nil {
		return nil, err
	}
	return listerAt{st}, nil
}

// RealPath implements sftp.RealPathFileLister: paths are shown relative to
// the root, which clients see as "/"; relative ones start at the start dir.
func (h *rootHandler) RealPath(p string) (string, error) {
	if !path.IsAbs(p) {
		p = path.Join(h.start, p)
	}
	return path.Clean("/" + p), nil
}

type listerAt []os.FileInfo

func (l listerAt) ListAt(dst []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(dst, l[off:])
	if int(off)+n >= len(l) {
		return n, io.EOF
	}
	return n, nil
}

// linkInfo carries a readlink result; pkg/sftp sends its Name.
type linkInfo string

func (l linkInfo) Name() string       { return string(l) }
func (l linkInfo) Size() int64        { return 0 }
func (l linkInfo) Mode() os.FileMode  { return os.ModeSymlink | 0o777 }
func (l linkInfo) ModTime() time.Time { return time.Time{} }
func (l linkInfo) IsDir() bool        { return false }
func (l linkInfo) Sys() any           { return nil }
