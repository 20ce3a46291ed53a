// Package sftpd is the SFTP server that `sandgate sftp-server` runs inside
// a sandbox: protocol version 3 (draft-ietf-secsh-filexfer-02) with the
// OpenSSH extensions its clients use, limits@openssh.com among them, so
// that OpenSSH's sftp and scp move 255 KiB per request instead of 32 KiB.
//
// It serves one client on a reader and a writer, one request at a time in
// arrival order, like OpenSSH's sftp-server; replies are batched while more
// requests are already waiting, and file data goes between the file and
// the packet buffers with no copy in between. When the output is a pipe,
// large READs are spliced from the file into it (splice_linux.go).
package sftpd

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limits, reported by limits@openssh.com. They are OpenSSH's sftp-server's.
const (
	maxPacket  = 256 << 10        // longest request accepted
	maxData    = maxPacket - 1024 // longest READ answered, longest WRITE taken
	maxHandles = 512              // open files and directories per client
	readdirMax = 100              // names per READDIR reply

	flushAt = 512 << 10 // replies are written out once this much waits

	// spliceMin is the shortest READ answered by splice(2): below it the
	// three system calls cost more than the copies they save, and small
	// replies batch.
	spliceMin = 16 << 10
)

// extensions are announced in VERSION, with their revisions.
var extensions = [][2]string{
	{"posix-rename@openssh.com", "1"},
	{"statvfs@openssh.com", "2"},
	{"fstatvfs@openssh.com", "2"},
	{"hardlink@openssh.com", "1"},
	{"fsync@openssh.com", "1"},
	{"lsetstat@openssh.com", "1"},
	{"limits@openssh.com", "1"},
	{"expand-path@openssh.com", "1"},
	{"copy-data", "1"},
	{"home-directory", "1"},
	{"users-groups-by-id@openssh.com", "1"},
}

// Options configures Serve.
type Options struct {
	// Root confines every path: clients see it as "/". Nil serves the
	// process's own filesystem, for a process the kernel confines.
	Root *os.Root
	// StartDir is where relative paths start, as clients see paths; it is
	// also what "." and "~" expand to. Default "/".
	StartDir string
}

// Serve serves SFTP to one client, reading requests from r and writing
// replies to w, until the client closes its end (nil) or the stream breaks
// (the error). Every handle still open is closed on return.
func Serve(r io.Reader, w io.Writer, opts Options) error {
	return newServer(r, w, opts).run()
}

func newServer(r io.Reader, w io.Writer, opts Options) *server {
	start := "/"
	if opts.StartDir != "" {
		start = path.Clean("/" + opts.StartDir)
	}
	s := &server{
		fs:         fsys{root: opts.Root},
		privileged: opts.Root != nil && os.Geteuid() == 0,
		start:      start,
		in:         bufio.NewReaderSize(r, maxPacket+4096),
		w:          w,
		out:        make(encoder, 0, 64<<10),
		handles:    map[string]*handle{},
		names:      newNameCache(),
	}
	if out := outputFile(w); out != nil {
		s.splice = newSplicer(out)
	}
	return s
}

// run serves until the end of the stream, then closes what is open.
func (s *server) run() error {
	defer s.closeAll()
	err := s.serve()
	if err != nil && len(s.out) > 0 {
		// Replies already made still reach the client before the end.
		_ = s.flush()
	}
	if errors.Is(err, syscall.EPIPE) {
		return nil
	}
	return err
}

type server struct {
	fs fsys
	// privileged: confined by a root while running as root, so setuid or
	// setgid bits and owner changes would reach host users.
	privileged bool
	start      string
	in         *bufio.Reader
	w          io.Writer
	out        encoder

	// splice, when the output is a pipe, answers large READs by
	// splice(2); nil reads them.
	splice *splicer

	inited  bool
	handles map[string]*handle
	nextID  uint64
	names   *nameCache
}

// handle is an open file or directory.
type handle struct {
	f      *os.File
	name   string // the client's path
	dir    bool
	append bool
	// noSplice: its filesystem cannot splice; READs read(2).
	noSplice bool
}

func (s *server) serve() error {
	for {
		if len(s.out) > 0 && !s.packetBuffered() {
			if err := s.flush(); err != nil {
				return err
			}
		}
		hdr, err := s.in.Peek(4)
		if err != nil {
			return endOfStream(err)
		}
		n := binary.BigEndian.Uint32(hdr)
		if n < 1 || n > maxPacket {
			// OpenSSH's sftp-server ends the session too: the stream
			// cannot be resynchronised.
			return fmt.Errorf("sftp: packet of %d bytes (limit %d)", n, maxPacket)
		}
		pkt, err := s.in.Peek(4 + int(n))
		if err != nil {
			return endOfStream(err)
		}
		if err := s.dispatch(pkt[4], pkt[5:]); err != nil {
			return err
		}
		if _, err := s.in.Discard(4 + int(n)); err != nil {
			return err
		}
		if len(s.out) >= flushAt {
			if err := s.flush(); err != nil {
				return err
			}
		}
	}
}

func endOfStream(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return err
}

// packetBuffered reports whether a whole request is already read in, so
// that its reply can join the pending ones.
func (s *server) packetBuffered() bool {
	b := s.in.Buffered()
	if b < 4 {
		return false
	}
	hdr, _ := s.in.Peek(4)
	return uint64(binary.BigEndian.Uint32(hdr))+4 <= uint64(b)
}

func (s *server) flush() error {
	n, err := s.w.Write(s.out)
	if s.splice != nil {
		s.splice.wrote(n)
	}
	s.out = s.out[:0]
	if err != nil {
		return fmt.Errorf("sftp: write reply: %w", err)
	}
	return nil
}

func (s *server) closeAll() {
	for k, h := range s.handles {
		h.f.Close()
		delete(s.handles, k)
	}
	if s.splice != nil {
		s.splice.close()
		s.splice = nil
	}
}

// outputFile is the file behind w, when it is one.
func outputFile(w io.Writer) *os.File {
	switch w := w.(type) {
	case *os.File:
		return w
	case interface{ outFile() *os.File }:
		return w.outFile()
	}
	return nil
}

// begin starts a reply packet and returns where it starts, for end.
func (s *server) begin(typ byte, id uint32) int {
	at := len(s.out)
	s.out = s.out.uint32(0).byte(typ).uint32(id)
	return at
}

// end fills in the length of the reply begun at at.
func (s *server) end(at int) {
	binary.BigEndian.PutUint32(s.out[at:], uint32(len(s.out)-at-4))
}

func (s *server) status(id uint32, code uint32, msg string) {
	at := s.begin(fxpStatus, id)
	s.out = s.out.uint32(code).string(msg).string("")
	s.end(at)
}

func (s *server) ok(id uint32) { s.status(id, fxOK, "Success") }

// result answers a request that returns only a status.
func (s *server) result(id uint32, err error) {
	if err != nil {
		s.fail(id, err)
		return
	}
	s.ok(id)
}

// fail answers a request with the status err maps to; the errno mapping
// is OpenSSH's. Messages name the failure, never a host path.
func (s *server) fail(id uint32, err error) {
	var errno syscall.Errno
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EBADF):
		s.status(id, fxNoSuchFile, "No such file")
	case errors.Is(err, fs.ErrPermission):
		s.status(id, fxPermissionDenied, "Permission denied")
	case escaped(err):
		s.status(id, fxPermissionDenied, "Permission denied: the path leaves the session's root")
	case errors.Is(err, errors.ErrUnsupported), errors.Is(err, syscall.ENOSYS):
		s.status(id, fxOpUnsupported, "Operation unsupported")
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG):
		errors.As(err, &errno)
		s.status(id, fxBadMessage, "Bad message: "+errno.Error())
	case errors.As(err, &errno):
		s.status(id, fxFailure, "Failure: "+errno.Error())
	case errors.Is(err, errSetID):
		s.status(id, fxPermissionDenied, "Permission denied: "+err.Error())
	case errors.Is(err, errIsDir), errors.Is(err, errNotFile), errors.Is(err, errBadHandle), errors.Is(err, errOverlap),
		errors.Is(err, errTooManyHandles), errors.Is(err, errLsetstatSize):
		s.status(id, fxFailure, "Failure: "+err.Error())
	default:
		s.status(id, fxFailure, "Failure")
	}
}

var (
	errNotFile        = errors.New("not a regular file or device")
	errOverlap        = errors.New("the copy's source and destination overlap")
	errSetID          = errors.New("setuid and setgid bits are not granted by a server running as root")
	errBadHandle      = errors.New("invalid handle")
	errTooManyHandles = fmt.Errorf("too many open handles (limit %d)", maxHandles)
	errLsetstatSize   = errors.New("lsetstat cannot set a size")
)

// path resolves a client path: relative ones start at the start dir.
func (s *server) path(p string) string {
	if !strings.HasPrefix(p, "/") {
		p = s.start + "/" + p
	}
	if s.fs.root == nil && hasDotDot(p) {
		// Host paths: the kernel resolves a ".." after the symlinks
		// before it, as under OpenSSH's server; cleaned as text,
		// "link/../f" would name another file. (Under a root, os.Root
		// refuses ".." anyway.)
		return p
	}
	return path.Clean(p)
}

// hasDotDot reports whether p has a ".." component.
func hasDotDot(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// realpath answers REALPATH: under a root, the cleaned path (os.Root
// resolves within it); on host paths, the canonical path, symlinks
// resolved, as OpenSSH's server answers it, a missing last component
// tolerated and any other missing one an error.
func (s *server) realpath(p string) (string, error) {
	name := s.path(p)
	if s.fs.root != nil {
		return name, nil
	}
	if r, err := filepath.EvalSymlinks(name); err == nil {
		return r, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	dir, base := path.Split(strings.TrimSuffix(name, "/"))
	if base == "" || base == "." || base == ".." {
		return "", fs.ErrNotExist
	}
	d, err := filepath.EvalSymlinks(cmp.Or(dir, "/"))
	if err != nil {
		return "", err
	}
	return path.Join(d, base), nil
}

func (s *server) handle(b []byte, dir bool) (*handle, error) {
	h, ok := s.handles[string(b)]
	if !ok || h.dir != dir {
		return nil, errBadHandle
	}
	return h, nil
}

func (s *server) newHandle(h *handle) string {
	s.nextID++
	k := strconv.FormatUint(s.nextID, 10)
	s.handles[k] = h
	return k
}

func (s *server) replyHandle(id uint32, k string) {
	at := s.begin(fxpHandle, id)
	s.out = s.out.string(k)
	s.end(at)
}

func (s *server) replyAttrs(id uint32, fi fs.FileInfo) {
	at := s.begin(fxpAttrs, id)
	s.out = s.out.attrs(fileAttrs(fi))
	s.end(at)
}

// replyName answers REALPATH, READLINK and expand-path: one name, no attrs.
func (s *server) replyName(id uint32, name string) {
	at := s.begin(fxpName, id)
	s.out = s.out.uint32(1).string(name).string(name).uint32(0)
	s.end(at)
}

// dispatch answers one request. An error ends the session: only a broken
// stream or a request without an id does.
func (s *server) dispatch(typ byte, body []byte) error {
	d := &decoder{b: body}
	if typ == fxpInit {
		if s.inited {
			return errors.New("sftp: second INIT")
		}
		s.inited = true
		at := s.begin(fxpVersion, 3) // the "id" field is the version here
		for _, e := range extensions {
			s.out = s.out.string(e[0]).string(e[1])
		}
		s.end(at)
		return nil
	}
	if !s.inited {
		return fmt.Errorf("sftp: request type %d before INIT", typ)
	}
	id := d.uint32()
	if d.err != nil {
		return fmt.Errorf("sftp: request type %d without an id", typ)
	}
	if s.splice != nil && changesData(typ, d.b) {
		// Spliced replies must not show what this request changes.
		if err := s.splice.settle(); err != nil {
			return err
		}
	}
	switch typ {
	case fxpRead:
		if err := s.read(id, d); err != nil {
			return err
		}
	case fxpWrite:
		s.write(id, d)
	case fxpOpen:
		s.open(id, d)
	case fxpClose:
		s.close(id, d)
	case fxpLstat, fxpStat:
		name := s.path(d.string())
		if d.err != nil {
			break
		}
		var fi fs.FileInfo
		var err error
		if typ == fxpStat {
			fi, err = s.fs.Stat(name)
		} else {
			fi, err = s.fs.Lstat(name)
		}
		if err != nil {
			s.fail(id, err)
		} else {
			s.replyAttrs(id, fi)
		}
	case fxpFstat:
		h, err := s.anyHandle(d.bytes())
		if d.err != nil {
			break
		}
		var fi fs.FileInfo
		if err == nil {
			fi, err = h.f.Stat()
		}
		if err != nil {
			s.fail(id, err)
		} else {
			s.replyAttrs(id, fi)
		}
	case fxpSetstat:
		name := s.path(d.string())
		a := d.attrs()
		if d.err == nil {
			s.result(id, s.setstat(name, nil, a, true))
		}
	case fxpFsetstat:
		h, err := s.anyHandle(d.bytes())
		a := d.attrs()
		if d.err == nil {
			if err == nil {
				err = s.setstat(h.name, h.f, a, true)
			}
			s.result(id, err)
		}
	case fxpOpendir:
		s.opendir(id, d)
	case fxpReaddir:
		s.readdir(id, d)
	case fxpRemove:
		name := s.path(d.string())
		if d.err == nil {
			s.result(id, s.fs.Remove(name, false))
		}
	case fxpMkdir:
		name := s.path(d.string())
		a := d.attrs()
		if d.err == nil {
			perm := fs.FileMode(0o777)
			if a.flags&attrPermissions != 0 {
				perm = unixToMode(a.perm)
			}
			s.result(id, s.fs.Mkdir(name, perm))
		}
	case fxpRmdir:
		name := s.path(d.string())
		if d.err == nil {
			s.result(id, s.fs.Remove(name, true))
		}
	case fxpRealpath:
		p := d.string()
		if d.err != nil {
			break
		}
		if r, err := s.realpath(p); err != nil {
			s.fail(id, err)
		} else {
			s.replyName(id, r)
		}
	case fxpRename:
		oldname, newname := s.path(d.string()), s.path(d.string())
		if d.err == nil {
			s.result(id, s.fs.Rename(oldname, newname, false))
		}
	case fxpReadlink:
		name := s.path(d.string())
		if d.err != nil {
			break
		}
		if t, err := s.fs.Readlink(name); err != nil {
			s.fail(id, err)
		} else {
			s.replyName(id, t)
		}
	case fxpSymlink:
		// OpenSSH's order, which every client follows: the target first,
		// then the new link. The target is stored as given.
		target, name := d.string(), s.path(d.string())
		if d.err == nil {
			s.result(id, s.fs.Symlink(target, name))
		}
	case fxpExtended:
		s.extended(id, d)
	default:
		s.status(id, fxOpUnsupported, fmt.Sprintf("Operation unsupported: request type %d", typ))
		return nil
	}
	if d.err != nil {
		s.status(id, fxBadMessage, "Bad message: the request is truncated")
	}
	return nil
}

// anyHandle finds an open file or directory.
func (s *server) anyHandle(b []byte) (*handle, error) {
	if h, ok := s.handles[string(b)]; ok {
		return h, nil
	}
	return nil, errBadHandle
}

func (s *server) open(id uint32, d *decoder) {
	name := s.path(d.string())
	pflags := d.uint32()
	a := d.attrs()
	if d.err != nil {
		return
	}
	if len(s.handles) >= maxHandles {
		s.fail(id, errTooManyHandles)
		return
	}
	var flags int
	switch {
	case pflags&fxfRead != 0 && pflags&fxfWrite != 0:
		flags = os.O_RDWR
	case pflags&fxfWrite != 0:
		flags = os.O_WRONLY
	default:
		flags = os.O_RDONLY
	}
	if pflags&fxfAppend != 0 {
		flags |= os.O_APPEND
	}
	if pflags&fxfCreat != 0 {
		flags |= os.O_CREATE
	}
	if pflags&fxfTrunc != 0 {
		flags |= os.O_TRUNC
	}
	if pflags&fxfExcl != 0 {
		flags |= os.O_EXCL
	}
	perm := fs.FileMode(0o666)
	if a.flags&attrPermissions != 0 {
		perm = unixToMode(a.perm)
	}
	// O_NONBLOCK: opening a FIFO must not stall the server (reads and
	// writes go by offset, which regular files and devices ignore it for).
	f, err := s.fs.OpenFile(name, flags|syscall.O_NOCTTY|syscall.O_NONBLOCK, perm)
	if err != nil {
		s.fail(id, err)
		return
	}
	if fi, err := f.Stat(); err != nil || fi.IsDir() || fi.Mode()&(fs.ModeNamedPipe|fs.ModeSocket) != 0 {
		f.Close()
		switch {
		case err != nil:
		case fi.IsDir():
			err = errIsDir
		default:
			err = errNotFile
		}
		s.fail(id, err)
		return
	}
	s.replyHandle(id, s.newHandle(&handle{f: f, name: name, append: flags&os.O_APPEND != 0}))
}

func (s *server) close(id uint32, d *decoder) {
	k := d.bytes()
	if d.err != nil {
		return
	}
	h, err := s.anyHandle(k)
	if err != nil {
		s.fail(id, err)
		return
	}
	delete(s.handles, string(k))
	s.result(id, h.f.Close())
}

// read answers READ with the file's bytes spliced, or read straight into
// the reply. An error is the output's: the session ends.
func (s *server) read(id uint32, d *decoder) error {
	h, herr := s.handle(d.bytes(), false)
	off := d.uint64()
	n := d.uint32()
	if d.err != nil {
		return nil
	}
	if herr != nil {
		s.fail(id, herr)
		return nil
	}
	if n > maxData {
		n = maxData
	}
	if off > 1<<63-1 {
		s.status(id, fxEOF, "End of file")
		return nil
	}
	if s.splice != nil && !h.noSplice && n >= spliceMin && int(n) <= s.splice.max {
		got, err := s.splice.fill(h.f, int64(off), int(n))
		switch {
		case errors.Is(err, errNoSplice):
			h.noSplice = true
		case errors.Is(err, errNoSpliceHere):
		case errors.Is(err, errStagingShort):
			return err
		case got == 0:
			s.readFailed(id, err)
			return nil
		default:
			// The pending replies and this one's header, then its data.
			at := s.begin(fxpData, id)
			s.out = s.out.uint32(uint32(got))
			binary.BigEndian.PutUint32(s.out[at:], uint32(len(s.out)-at-4+got))
			if err := s.flush(); err != nil {
				return err
			}
			return s.splice.send(got)
		}
	}
	at := s.begin(fxpData, id)
	s.out = s.out.uint32(0)
	data := len(s.out)
	if cap(s.out)-data < int(n) {
		grown := make(encoder, data, max(2*cap(s.out), data+int(n)))
		copy(grown, s.out)
		s.out = grown
	}
	got, err := h.f.ReadAt(s.out[data:data+int(n)], int64(off))
	if got == 0 {
		s.out = s.out[:at]
		s.readFailed(id, err)
		return nil
	}
	s.out = s.out[:data+got]
	binary.BigEndian.PutUint32(s.out[data-4:], uint32(got))
	s.end(at)
	return nil
}

// readFailed answers a READ that got no bytes: nothing read, a zero
// length included, is EOF, as OpenSSH answers.
func (s *server) readFailed(id uint32, err error) {
	if err == nil || errors.Is(err, io.EOF) {
		s.status(id, fxEOF, "End of file")
	} else {
		s.fail(id, err)
	}
}

// write answers WRITE from the request's buffer. Handles opened to append
// write at the end whatever the offset, as OpenSSH's server does.
func (s *server) write(id uint32, d *decoder) {
	h, herr := s.handle(d.bytes(), false)
	off := d.uint64()
	data := d.bytes()
	if d.err != nil {
		return
	}
	if herr != nil {
		s.fail(id, herr)
		return
	}
	var err error
	switch {
	case h.append:
		_, err = h.f.Write(data)
	case off > 1<<63-1:
		err = syscall.EFBIG
	default:
		_, err = h.f.WriteAt(data, int64(off))
	}
	s.result(id, err)
}

func (s *server) opendir(id uint32, d *decoder) {
	name := s.path(d.string())
	if d.err != nil {
		return
	}
	if len(s.handles) >= maxHandles {
		s.fail(id, errTooManyHandles)
		return
	}
	f, err := s.fs.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		s.fail(id, err)
		return
	}
	s.replyHandle(id, s.newHandle(&handle{f: f, name: name, dir: true}))
}

func (s *server) readdir(id uint32, d *decoder) {
	h, err := s.handle(d.bytes(), true)
	if d.err != nil {
		return
	}
	if err != nil {
		s.fail(id, err)
		return
	}
	ents, err := h.f.ReadDir(readdirMax)
	if len(ents) == 0 {
		if err == nil || errors.Is(err, io.EOF) {
			s.status(id, fxEOF, "End of file")
		} else {
			s.fail(id, err)
		}
		return
	}
	at := s.begin(fxpName, id)
	countAt := len(s.out)
	s.out = s.out.uint32(0)
	var count uint32
	now := time.Now()
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed since it was listed
		}
		a := fileAttrs(fi)
		s.out = s.out.string(e.Name()).string(s.longname(e.Name(), fi, a, now)).attrs(a)
		count++
	}
	binary.BigEndian.PutUint32(s.out[countAt:], count)
	s.end(at)
}

// What a splicer's fill says when it staged nothing (splice_linux.go).
var (
	// errNoSplice: the file cannot be spliced from; read it instead.
	errNoSplice = errors.New("sftp: file does not splice")
	// errNoSpliceHere: this READ cannot be spliced; read it, and splice
	// the next.
	errNoSpliceHere = errors.New("sftp: read does not splice")
	// errStagingShort: the staging pipe held fewer bytes than were
	// staged; the session ends.
	errStagingShort = errors.New("staging pipe short")
)

// changesData reports whether a request (its body after the id) may change
// a file's bytes: WRITE, SETSTAT, FSETSTAT and lsetstat (a size), OPEN
// with TRUNC, and copy-data.
func changesData(typ byte, rest []byte) bool {
	switch typ {
	case fxpWrite, fxpSetstat, fxpFsetstat:
		return true
	case fxpOpen:
		d := &decoder{b: rest}
		_ = d.bytes()
		return d.uint32()&fxfTrunc != 0 && d.err == nil
	case fxpExtended:
		d := &decoder{b: rest}
		name := d.string()
		return d.err == nil && (name == "copy-data" || name == "lsetstat@openssh.com")
	}
	return false
}
