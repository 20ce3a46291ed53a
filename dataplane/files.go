package dataplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pkg/sftp"

	"github.com/sandgate/sandgate/sandbox"
)

// Every file operation of the REST data plane goes through an SFTP server
// started inside the session's sandbox (linux: as the sandbox user in its
// mount namespace; workdir: confined to the workdir with os.Root), exactly
// as an SSH client's SFTP does. The gateway never resolves a sandbox path
// on the host, so "..", symlinks, and a symlink swapped in mid-request
// resolve inside the sandbox or not at all.

const (
	// sftpPacket is the data carried by one READ or WRITE: the SFTP
	// server (package sftpd) answers up to 255 KiB, and it is always ours.
	sftpPacket = 255 << 10
	// sftpConcurrency bounds the READs or WRITEs one SFTP call keeps in
	// flight (a download's window is smaller: see streamFile).
	sftpConcurrency = 64
	// uploadConcurrency is how many WRITEs an upload keeps in flight:
	// 8 x 255 KiB bounds what it holds while the sandbox's server takes
	// them (a stopped server holds them all) to 2 MiB.
	uploadConcurrency = 8
	// MaxPathBytes bounds a path given to the file operations.
	MaxPathBytes = 4096
	// MaxListEntries caps a listing; a longer one is marked truncated.
	MaxListEntries = 10000
	// tempPrefix starts the name of an upload's temporary file, written
	// next to its destination and renamed over it when complete.
	tempPrefix = ".sandgate-upload-"
)

// ErrKind classifies a file operation's failure.
type ErrKind int

// The kinds of file errors; package rest maps each to a status and code.
const (
	KindInternal    ErrKind = iota // anything else
	KindInvalid                    // a bad path or parameter
	KindNotFound                   // the path (or the parent) does not exist
	KindNotDir                     // a directory was wanted
	KindIsDir                      // a file was wanted
	KindNotRegular                 // a regular file was wanted (device, fifo, socket)
	KindNotEmpty                   // a non-recursive delete of a directory with entries
	KindPermission                 // the sandbox's user may not, or the path leaves the root
	KindTooLarge                   // over the size cap
	KindDiskFull                   // the sandbox's filesystem is full
	KindAborted                    // the upload's body ended early (the client went away)
	KindUnavailable                // the sandbox's SFTP server could not be started
	KindBusy                       // too many transfers at once (Files' bounds)
	KindExists                     // the name is taken (WriteOptions.NoReplace)
)

// Error is a file operation's failure: Msg is for the client (it names the
// path as the client gave it, never a host path), Err is the cause.
type Error struct {
	Kind ErrKind
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

func fileErr(kind ErrKind, err error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Entry describes one file, directory or link, as the API shows it.
type Entry struct {
	Name      string    `json:"name"`
	Path      string    `json:"path"`
	Type      string    `json:"type"` // file, dir, symlink or other
	SizeBytes int64     `json:"sizeBytes"`
	Mode      string    `json:"mode"` // octal permission bits, "0644"
	Mtime     time.Time `json:"mtime"`
	// UID and GID own the entry, as the sandbox sees them (the E2B
	// facade shows them; /v1 does not).
	UID uint32 `json:"-"`
	GID uint32 `json:"-"`
}

func entryOf(p string, fi fs.FileInfo) Entry {
	typ := "other"
	switch m := fi.Mode(); {
	case m.IsRegular():
		typ = "file"
	case m.IsDir():
		typ = "dir"
	case m&fs.ModeSymlink != 0:
		typ = "symlink"
	}
	perm := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		perm |= 0o1000
	}
	e := Entry{
		Name: path.Base(p), Path: p, Type: typ, SizeBytes: fi.Size(),
		Mode: fmt.Sprintf("%04o", perm), Mtime: fi.ModTime().UTC(),
	}
	if st, ok := fi.Sys().(*sftp.FileStat); ok {
		e.UID, e.GID = st.UID, st.GID
	}
	return e
}

// CheckPath validates a path given by a client: relative paths start at
// the sandbox's workspace (where its SFTP server starts), absolute ones at
// the sandbox's root. It returns the cleaned path.
func CheckPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fileErr(KindInvalid, nil, "path is required")
	case strings.IndexByte(p, 0) >= 0:
		return "", fileErr(KindInvalid, nil, "path contains a NUL byte")
	case len(p) > MaxPathBytes:
		return "", fileErr(KindInvalid, nil, "path is longer than %d bytes", MaxPathBytes)
	}
	return path.Clean(p), nil
}

// FS is a connection to an SFTP server running in a sandbox. It is safe
// for concurrent use; Close ends the server, or, for an FS from Files,
// hands it back to its session's pool.
type FS struct {
	c       *sftp.Client
	release func() error
	once    sync.Once
	// streams counts the downloads open at once, for their windows
	// (nil: one).
	streams func() int
	// temp, when set, notes an upload's temporary file until the returned
	// function is called (Files' journal).
	temp func(tmp string) (done func())
}

// server is one sftp-server process in a sandbox and the client talking
// to it.
type server struct {
	c      *sftp.Client
	proc   sandbox.Process
	stderr sync.WaitGroup
	exited chan struct{} // closed when proc has exited
	broken chan struct{} // closed when the connection has shut down
	err    error         // proc's Wait error, once exited
	once   sync.Once
}

// OpenFS starts the sandbox's SFTP server (ctx is for the start only) and
// connects to it; Close ends it.
func OpenFS(ctx context.Context, sb sandbox.Sandbox) (*FS, error) {
	srv, err := startServer(ctx, sb)
	if err != nil {
		return nil, err
	}
	return &FS{c: srv.c, release: srv.close}, nil
}

func startServer(ctx context.Context, sb sandbox.Sandbox) (*server, error) {
	p, err := sb.Start(ctx, sandbox.Cmd{Subsystem: "sftp"})
	if err != nil {
		return nil, fileErr(KindUnavailable, err, "cannot start the sandbox's file server")
	}
	srv := &server{proc: p, exited: make(chan struct{}), broken: make(chan struct{})}
	if se := p.Stderr(); se != nil {
		srv.stderr.Add(1)
		go func() {
			defer srv.stderr.Done()
			_, _ = io.Copy(io.Discard, se)
		}()
	}
	go func() {
		_, srv.err = p.Wait()
		close(srv.exited)
	}()
	c, err := sftp.NewClientPipe(p.Stdout(), p.Stdin(),
		sftp.MaxPacketUnchecked(sftpPacket),
		sftp.MaxConcurrentRequestsPerFile(sftpConcurrency),
		sftp.UseConcurrentWrites(true),
		sftp.UseFstat(true),
	)
	if err != nil {
		p.Kill()
		<-srv.exited
		srv.stderr.Wait()
		return nil, fileErr(KindUnavailable, err, "cannot talk to the sandbox's file server")
	}
	srv.c = c
	go func() {
		_ = c.Wait()
		close(srv.broken)
	}()
	return srv, nil
}

// dead reports whether the server is gone: its process exited or its
// connection broke.
func (srv *server) dead() bool {
	select {
	case <-srv.exited:
		return true
	case <-srv.broken:
		return true
	default:
	}
	return false
}

// close ends the connection and waits for the server to exit (it exits on
// end of input; it is killed if it does not within a few seconds).
func (srv *server) close() error {
	srv.once.Do(func() {
		_ = srv.c.Close()
		select {
		case <-srv.exited:
		case <-time.After(5 * time.Second):
			srv.proc.Kill()
			<-srv.exited
		}
		srv.stderr.Wait()
	})
	return srv.err
}

// Close releases f: it ends its server, or hands it back to its pool.
func (f *FS) Close() error {
	var err error
	f.once.Do(func() { err = f.release() })
	return err
}

// classify turns an SFTP error about p into an *Error. The server's
// status messages name the errno ("Failure: no space left on device").
func classify(err error, p string) *Error {
	var fe *Error
	if errors.As(err, &fe) {
		return fe
	}
	msg := err.Error()
	var se *sftp.StatusError
	code := uint32(0)
	if errors.As(err, &se) {
		code = se.Code
	}
	switch {
	case errors.Is(err, fs.ErrNotExist) || code == 2:
		return fileErr(KindNotFound, nil, "%s: no such file or directory", p)
	case strings.Contains(msg, "leaves the session's root"):
		return fileErr(KindPermission, nil, "%s: the path leaves the sandbox", p)
	case errors.Is(err, fs.ErrPermission) || code == 3:
		return fileErr(KindPermission, nil, "%s: permission denied", p)
	case errors.Is(err, syscall.EROFS) || strings.Contains(msg, "read-only file system"):
		return fileErr(KindPermission, nil, "%s: read-only file system (the image's own files; write under the workspace or /tmp)", p)
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(msg, "no space left on device") || strings.Contains(msg, "quota exceeded"):
		return fileErr(KindDiskFull, nil, "%s: the sandbox's disk is full", p)
	case errors.Is(err, syscall.ENOTEMPTY) || strings.Contains(msg, "directory not empty"):
		return fileErr(KindNotEmpty, nil, "%s: directory not empty (recursive=true deletes it with its contents)", p)
	case errors.Is(err, syscall.ENOTDIR) || strings.Contains(msg, "not a directory"):
		return fileErr(KindNotDir, nil, "%s: a path component is not a directory", p)
	case errors.Is(err, syscall.EISDIR) || strings.Contains(msg, "is a directory"):
		return fileErr(KindIsDir, nil, "%s: is a directory", p)
	case errors.Is(err, fs.ErrExist) || strings.Contains(msg, "file exists"):
		return fileErr(KindExists, nil, "%s: already exists", p)
	case strings.Contains(msg, "file name too long"):
		return fileErr(KindInvalid, nil, "%s: file name too long", p)
	}
	return fileErr(KindInternal, err, "%s: file operation failed", p)
}

// Stat describes p, following a final symlink.
func (f *FS) Stat(p string) (Entry, error) {
	fi, err := f.c.Stat(p)
	if err != nil {
		return Entry{}, classify(err, p)
	}
	return entryOf(p, fi), nil
}

// Lstat describes p itself.
func (f *FS) Lstat(p string) (Entry, error) {
	fi, err := f.c.Lstat(p)
	if err != nil {
		return Entry{}, classify(err, p)
	}
	return entryOf(p, fi), nil
}

// Open opens the regular file p (a final symlink followed) for reading.
// The ReadSeekCloser reads ahead with concurrent requests.
func (f *FS) Open(p string) (io.ReadSeekCloser, Entry, error) {
	fi, err := f.c.Stat(p)
	if err != nil {
		return nil, Entry{}, classify(err, p)
	}
	switch {
	case fi.IsDir():
		return nil, Entry{}, fileErr(KindIsDir, nil, "%s: is a directory (list=true lists it)", p)
	case !fi.Mode().IsRegular():
		return nil, Entry{}, fileErr(KindNotRegular, nil, "%s: not a regular file", p)
	}
	fh, err := f.c.Open(p)
	if err != nil {
		return nil, Entry{}, classify(err, p)
	}
	// The file may have changed between Stat and Open: describe what is open.
	if st, err := fh.Stat(); err == nil {
		if !st.Mode().IsRegular() {
			_ = fh.Close()
			return nil, Entry{}, fileErr(KindNotRegular, nil, "%s: not a regular file", p)
		}
		fi = st
	}
	return &streamFile{f: fh, size: fi.Size(), streams: f.streams}, entryOf(p, fi), nil
}

// A download reads ahead one window at a time: a few SFTP READs in
// flight at once (File.ReadAt splits a window into packets). It holds at
// most two windows, the one being sent and the next, read only once the
// one before has been taken, so that its bytes in flight follow what the
// HTTP writer actually consumes. A download starts with one packet's
// window and widens it only once its client has taken rampBytes (more
// than the sockets between them hold): a client that never reads costs
// two packets. The wider window shares readAheadBudget among the
// transfers open at once (Files counts them): 2 MiB each for a few, down
// to one packet each for many.
const (
	maxWindow       = 8 * sftpPacket
	minWindow       = sftpPacket
	readAheadBudget = 32 << 20
	rampBytes       = 8 << 20
)

// windowFor is the read-ahead window of each of n downloads.
func windowFor(n int) int {
	w := readAheadBudget / (2 * max(n, 1))
	w = w / sftpPacket * sftpPacket
	return min(max(w, minWindow), maxWindow)
}

// streamFile is an io.ReadSeeker over an SFTP file that reads ahead one
// window at a time into two reused buffers: while the caller (the HTTP
// writer) takes the bytes of one window, the next is read. A reader
// that stops reading stops the reads: it costs at most two windows.
// http.ServeContent reads it in 32 KiB pieces, which as single READs
// would cost a round trip each.
type streamFile struct {
	f       *sftp.File
	size    int64
	off     int64      // the caller's position
	streams func() int // see FS.streams
	taken   int64      // bytes of the windows the caller started on

	buf  []byte // the current window: buf[pos:] is still to be read
	pos  int
	bufs [2][]byte
	cur  int // which of bufs buf is

	next chan window // the window being read ahead, nil: none
}

// window is a read ahead: n bytes at off into bufs[i], and its error.
type window struct {
	i   int
	off int64
	n   int
	err error
}

// readAhead starts reading the window at off (within the file's size)
// into the buffer that is not current.
func (s *streamFile) readAhead(off int64) {
	if off >= s.size {
		return
	}
	w := minWindow
	if s.taken >= rampBytes {
		n := 1
		if s.streams != nil {
			n = s.streams()
		}
		w = windowFor(n)
	}
	i := 1 - s.cur
	if len(s.bufs[i]) != w {
		s.bufs[i] = make([]byte, w)
	}
	b := s.bufs[i][:min(int64(len(s.bufs[i])), s.size-off)]
	ch := make(chan window, 1)
	s.next = ch
	go func() {
		n, err := s.f.ReadAt(b, off)
		if err == io.EOF && n == len(b) {
			err = nil
		}
		ch <- window{i: i, off: off, n: n, err: err}
	}()
}

// stop abandons the read ahead, waiting for it (it writes into a buffer).
func (s *streamFile) stop() {
	if s.next != nil {
		<-s.next
		s.next = nil
	}
	s.buf, s.pos = nil, 0
}

func (s *streamFile) Read(b []byte) (int, error) {
	if s.size == 0 {
		// Empty, or its size is not known until it is read (/proc,
		// /sys): read it as it comes.
		if _, err := s.f.Seek(s.off, io.SeekStart); err != nil {
			return 0, err
		}
		n, err := s.f.Read(b)
		s.off += int64(n)
		return n, err
	}
	if s.pos >= len(s.buf) {
		if s.off >= s.size {
			return 0, io.EOF
		}
		if s.next == nil {
			s.readAhead(s.off)
		}
		w := <-s.next
		s.next = nil
		if w.n == 0 {
			s.buf, s.pos = nil, 0
			if w.err == nil {
				w.err = io.ErrUnexpectedEOF
			}
			return 0, w.err
		}
		s.cur, s.buf, s.pos = w.i, s.bufs[w.i][:w.n], 0
		s.taken += int64(w.n)
		if w.err == nil {
			// The window after this one, while this one is taken.
			s.readAhead(w.off + int64(w.n))
		}
	}
	n := copy(b, s.buf[s.pos:])
	s.pos += n
	s.off += int64(n)
	return n, nil
}

func (s *streamFile) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = s.off + offset
	case io.SeekEnd:
		abs = s.size + offset
	default:
		return 0, errors.New("seek: invalid whence")
	}
	if abs < 0 {
		return 0, errors.New("seek: negative position")
	}
	if abs != s.off {
		s.stop()
		s.off = abs
	}
	return abs, nil
}

func (s *streamFile) Close() error {
	s.stop()
	return s.f.Close()
}

// List lists the directory p (a final symlink followed); recursive walks
// its subdirectories too, never through a symlink. At most max entries
// (MaxListEntries when max <= 0) are returned; truncated says there were
// more. Entries' paths are p joined with their names.
func (f *FS) List(p string, recursive bool, max int) (entries []Entry, truncated bool, err error) {
	entries, truncated, _, err = f.list(p, recursive, max)
	return entries, truncated, err
}

// ListTree lists p and its subdirectories as List does with recursive,
// and says whether the list is complete: not truncated at max, and with
// no subdirectory skipped because it could not be read (one the
// sandbox's user may not read, or one removed meanwhile). What tells
// deleted files from the list must use only a complete one.
func (f *FS) ListTree(p string, max int) (entries []Entry, complete bool, err error) {
	entries, truncated, skipped, err := f.list(p, true, max)
	return entries, err == nil && !truncated && !skipped, err
}

func (f *FS) list(p string, recursive bool, max int) (entries []Entry, truncated, skipped bool, err error) {
	if max <= 0 {
		max = MaxListEntries
	}
	fi, err := f.c.Stat(p)
	if err != nil {
		return nil, false, false, classify(err, p)
	}
	if !fi.IsDir() {
		return nil, false, false, fileErr(KindNotDir, nil, "%s: not a directory", p)
	}
	entries = []Entry{}
	queue := []string{p}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		fis, err := f.c.ReadDir(dir)
		if err != nil {
			if dir == p {
				return nil, false, false, classify(err, p)
			}
			skipped = true
			continue // a subdirectory the sandbox's user cannot read, or gone
		}
		sort.Slice(fis, func(i, j int) bool { return fis[i].Name() < fis[j].Name() })
		for _, fi := range fis {
			if fi.Name() == "." || fi.Name() == ".." {
				continue
			}
			if len(entries) == max {
				return entries, true, skipped, nil
			}
			e := entryOf(path.Join(dir, fi.Name()), fi)
			entries = append(entries, e)
			if recursive && e.Type == "dir" {
				queue = append(queue, e.Path)
			}
		}
	}
	return entries, false, skipped, nil
}

// WriteOptions tune Write.
type WriteOptions struct {
	// Mkdirs creates the missing parent directories.
	Mkdirs bool
	// Mode is the file's permission bits; nil keeps those of the file it
	// replaces, or 0644 for a new file.
	Mode *fs.FileMode
	// MaxBytes caps the size (0: no cap but the disk's).
	MaxBytes int64
	// NoReplace never replaces what is at the path: the complete file is
	// hard-linked to its name, which fails if the name is taken, so even
	// a file created meanwhile is kept. Then Rename, if set, gives
	// another path to try (up to maxRenames); else Write fails with
	// KindExists.
	NoReplace bool
	Rename    func() string
}

// maxRenames bounds the paths a NoReplace Write tries.
const maxRenames = 100

// errTooLarge ends an upload over its cap.
var errTooLarge = errors.New("over the size cap")

// bodyError marks a failure to read the upload itself, not to write it.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "read upload: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// capReader reads r, failing with errTooLarge past max bytes (0: no cap)
// and marking r's own errors as *bodyError.
type capReader struct {
	r    io.Reader
	max  int64
	n    int64
	over bool
}

func (c *capReader) Read(b []byte) (int, error) {
	if c.max > 0 && int64(len(b)) > c.max-c.n+1 {
		b = b[:c.max-c.n+1]
	}
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.max > 0 && c.n > c.max {
		c.over = true
		return n, errTooLarge
	}
	if err != nil && err != io.EOF {
		err = &bodyError{err}
	}
	return n, err
}

// Write writes r's bytes to p atomically: into a temporary file in p's
// directory, renamed over p (posix-rename) once complete. On any failure
// the temporary file is removed and p is untouched. A symlink at p is
// replaced, not followed. created says p did not exist before.
func (f *FS) Write(p string, r io.Reader, o WriteOptions) (e Entry, created bool, err error) {
	base := path.Base(p)
	if base == "/" || base == "." || base == ".." {
		return Entry{}, false, fileErr(KindInvalid, nil, "%s: not a file name", p)
	}
	dir := path.Dir(p)
	mode := fs.FileMode(0o644)
	for tries := 1; ; tries++ {
		fi, err := f.c.Lstat(p)
		switch {
		case err == nil && o.NoReplace:
			if o.Rename == nil || tries == maxRenames {
				return Entry{}, false, fileErr(KindExists, nil, "%s: already exists", p)
			}
			p = o.Rename()
			continue
		case err == nil && fi.IsDir():
			return Entry{}, false, fileErr(KindIsDir, nil, "%s: is a directory", p)
		case err == nil:
			if fi.Mode().IsRegular() {
				mode = fi.Mode().Perm()
			}
		default:
			ce := classify(err, p)
			if ce.Kind != KindNotFound {
				return Entry{}, false, ce
			}
			created = true
		}
		break
	}
	if o.Mode != nil {
		mode = *o.Mode
	}
	if err := f.parent(dir, o.Mkdirs); err != nil {
		return Entry{}, false, err
	}

	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(dir, tempPrefix+hex.EncodeToString(rnd[:])+".tmp")
	// left: tmp may still be there (its removal failed): its journal
	// entry stays, for the next start's sweep (Files.StaleUploads).
	left := false
	if f.temp != nil {
		// Forgotten once tmp is renamed or removed (the defers below run first).
		forget := f.temp(tmp)
		defer func() {
			if !left {
				forget()
			}
		}()
	}
	fh, err := f.c.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
	if err != nil {
		return Entry{}, false, classify(err, p)
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = fh.Close()
			left = f.removeFailed(tmp)
		}
	}()
	if err := fh.Chmod(mode); err != nil {
		return Entry{}, false, classify(err, p)
	}
	cr := &capReader{r: r, max: o.MaxBytes}
	if _, err := fh.ReadFromWithConcurrency(cr, uploadConcurrency); err != nil {
		var be *bodyError
		switch {
		case cr.over || errors.Is(err, errTooLarge):
			return Entry{}, false, fileErr(KindTooLarge, nil, "%s: larger than the limit of %d bytes", p, o.MaxBytes)
		case errors.As(err, &be):
			return Entry{}, false, fileErr(KindAborted, be.err, "%s: the upload ended early", p)
		}
		return Entry{}, false, f.writeFailure(err, dir, p)
	}
	if err := fh.Close(); err != nil {
		return Entry{}, false, f.writeFailure(err, dir, p)
	}
	if o.NoReplace {
		if p, err = f.linkNew(tmp, p, o.Rename); err != nil {
			return Entry{}, false, err
		}
		renamed = true
		left = f.removeFailed(tmp)
	} else {
		if err := f.c.PosixRename(tmp, p); err != nil {
			return Entry{}, false, classify(err, p)
		}
		renamed = true
	}
	fi, err := f.c.Lstat(p)
	if err != nil {
		return Entry{}, false, classify(err, p)
	}
	return entryOf(p, fi), created, nil
}

// removeFailed removes tmp and reports whether it may still be there.
func (f *FS) removeFailed(tmp string) bool {
	err := f.c.Remove(tmp)
	return err != nil && classify(err, tmp).Kind != KindNotFound
}

// linkNew gives the complete file tmp the name p, or another from rename
// while p is taken, never replacing anything; it returns the name given.
// Where hard links are not supported it renames, after checking that the
// name is free.
func (f *FS) linkNew(tmp, p string, rename func() string) (string, error) {
	for tries := 1; ; tries++ {
		err := f.c.Link(tmp, p)
		var se *sftp.StatusError
		if errors.As(err, &se) && se.Code == 8 { // SSH_FX_OP_UNSUPPORTED
			if _, lerr := f.c.Lstat(p); lerr != nil && classify(lerr, p).Kind == KindNotFound {
				err = f.c.Rename(tmp, p)
				if err == nil {
					return p, nil
				}
			} else {
				err = fileErr(KindExists, nil, "%s: already exists", p)
			}
		}
		if err == nil {
			return p, nil
		}
		ce := classify(err, p)
		if ce.Kind != KindExists || rename == nil || tries == maxRenames {
			return "", ce
		}
		p = rename()
	}
}

// writeFailure classifies a failed WRITE or CLOSE: a bare SSH_FX_FAILURE
// on a filesystem with no free block is a full disk.
func (f *FS) writeFailure(err error, dir, p string) *Error {
	ce := classify(err, p)
	if ce.Kind != KindInternal {
		return ce
	}
	if st, serr := f.c.StatVFS(dir); serr == nil && st.Blocks > 0 && st.Bavail == 0 {
		return fileErr(KindDiskFull, nil, "%s: the sandbox's disk is full", p)
	}
	return ce
}

// parent checks that dir is a directory, creating it (and its parents)
// with mkdirs.
func (f *FS) parent(dir string, mkdirs bool) error {
	fi, err := f.c.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fileErr(KindNotDir, nil, "%s: not a directory", dir)
	}
	if ce := classify(err, dir); ce.Kind != KindNotFound {
		return ce
	}
	if !mkdirs {
		return fileErr(KindNotFound, nil, "%s: the parent directory does not exist (mkdirs=true creates it)", dir)
	}
	if err := f.c.MkdirAll(dir); err != nil {
		return classify(err, dir)
	}
	return nil
}

// Rename moves from to to, replacing what is at to (a directory only by
// an empty one), as rename(2) does.
func (f *FS) Rename(from, to string) error {
	if err := f.c.PosixRename(from, to); err != nil {
		return classify(err, from)
	}
	return nil
}

// ReadLink is the target of the symlink p.
func (f *FS) ReadLink(p string) (string, error) {
	t, err := f.c.ReadLink(p)
	if err != nil {
		return "", classify(err, p)
	}
	return t, nil
}

// Mkdirs creates the directory dir and its missing parents.
func (f *FS) Mkdirs(dir string) error { return f.parent(dir, true) }

// Remove removes p: a file, a symlink (not what it points to) or an empty
// directory; recursive removes a directory with everything in it, never
// following a symlink. The sandbox's root and its workspace (the start
// directory) cannot be removed.
func (f *FS) Remove(p string, recursive bool) error {
	if p == "." || p == "/" {
		return fileErr(KindInvalid, nil, "%s: refusing to delete the sandbox's root or workspace", p)
	}
	fi, err := f.c.Lstat(p)
	if err != nil {
		return classify(err, p)
	}
	if !fi.IsDir() {
		if err := f.c.Remove(p); err != nil {
			return classify(err, p)
		}
		return nil
	}
	// "a/..", "/workspace", a link's target: compare where they resolve.
	if real, err := f.c.RealPath(p); err == nil {
		if real == "/" {
			return fileErr(KindInvalid, nil, "%s: refusing to delete the sandbox's root or workspace", p)
		}
		if home, err := f.c.RealPath("."); err == nil && home == real {
			return fileErr(KindInvalid, nil, "%s: refusing to delete the sandbox's root or workspace", p)
		}
	}
	if recursive {
		return f.removeTree(p, 0)
	}
	if err := f.c.RemoveDirectory(p); err != nil {
		return classify(err, p)
	}
	return nil
}

// maxDepth bounds removeTree's recursion.
const maxDepth = 256

func (f *FS) removeTree(dir string, depth int) error {
	if depth > maxDepth {
		return fileErr(KindInvalid, nil, "%s: deeper than %d levels", dir, maxDepth)
	}
	for attempt := 1; ; attempt++ {
		fis, err := f.c.ReadDir(dir)
		if err != nil {
			return classify(err, dir)
		}
		n := 0
		for _, fi := range fis {
			if fi.Name() == "." || fi.Name() == ".." {
				continue
			}
			n++
			p := path.Join(dir, fi.Name())
			if fi.IsDir() {
				err = f.removeTree(p, depth+1)
			} else {
				err = f.c.Remove(p)
			}
			if err != nil {
				if ce := classify(err, p); ce.Kind != KindNotFound {
					return ce
				}
			}
		}
		err = f.c.RemoveDirectory(dir)
		if err == nil {
			return nil
		}
		ce := classify(err, dir)
		// Something was added meanwhile: go round again, a few times.
		if ce.Kind != KindNotEmpty || n == 0 || attempt == 3 {
			return ce
		}
	}
}
