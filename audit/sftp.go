package audit

import (
	"encoding/binary"
	"sync"
)

// SFTP v3 packet types the tap reads (draft-ietf-secsh-filexfer-02).
const (
	sftpOpen     = 3
	sftpClose    = 4
	sftpRead     = 5
	sftpWrite    = 6
	sftpLstat    = 7
	sftpFstat    = 8
	sftpSetstat  = 9
	sftpFsetstat = 10
	sftpOpendir  = 11
	sftpRemove   = 13
	sftpMkdir    = 14
	sftpRmdir    = 15
	sftpRealpath = 16
	sftpStat     = 17
	sftpRename   = 18
	sftpReadlink = 19
	sftpSymlink  = 20
	sftpExtended = 200

	sftpStatus = 101
	sftpHandle = 102
	sftpData   = 103
	sftpName   = 104
	sftpAttrs  = 105

	sftpFlagWrite = 0x2
)

// Bounds of the tap: what it keeps of a packet, and how many requests and
// handles it follows at once. Past them the data still flows and the tap
// does not go blind: an operation it cannot follow to its answer is
// reported when asked, with result "untracked" (its path, bytes unknown),
// and the first overflow of a session is itself reported (op
// tap_overflow).
const (
	sftpKeepPath   = 8 << 10 // a path-carrying packet's first bytes
	sftpKeepData   = 512     // a WRITE's or DATA's header (the handle is at most 256 bytes)
	sftpMaxPacket  = 1 << 20 // a longer length means the stream is not SFTP
	sftpMaxPending = 4096
	sftpMaxHandles = 1024
)

var sftpStatusNames = []string{"ok", "eof", "no_such_file", "permission_denied", "failure",
	"bad_message", "no_connection", "connection_lost", "op_unsupported"}

// SFTPTap follows an SFTP session passively, from the bytes the client
// sends (Client) and those the server answers (Server), and reports each
// file operation with its path, bytes and result: a file's transfer when
// it is closed (op read or write; a write also when it is opened, result
// started), a failed open, and every remove,
// mkdir, rmdir, rename, symlink, hardlink and setstat. Reads of metadata
// are reported too, one event per request: stat (stat, lstat, fstat),
// list (opening a directory; its readdir calls are not each reported),
// realpath and readlink (Target: the answer's name).
//
// The SFTP server runs in the sandbox as the sandbox user: the tap, in
// the gateway, reports what the client asked and what the server
// answered, without trusting the server to report on itself. It keeps
// a packet's first bytes only (a WRITE's or DATA's payload is counted,
// not copied) and never changes or delays the stream.
type SFTPTap struct {
	emit   func(Event)
	client sftpStream
	server sftpStream

	mu         sync.Mutex
	pending    map[uint32]sftpReq
	handles    map[string]*sftpFile
	overflowed bool // the overflow was reported
}

// ResultUntracked is the result of an operation the tap saw asked but
// could not follow to its answer (its tables were full).
const ResultUntracked = "untracked"

// ResultStarted is the result of an event written when a write starts (a
// file opened for writing, a REST PUT): its outcome is a second event, so
// a "started" without one is a write cut off by a crash of the gateway.
const ResultStarted = "started"

type sftpReq struct {
	op, path, target string
	handle           string // CLOSE, READ, WRITE, FSETSTAT
	write            bool   // OPEN for writing
	bytes            int64  // WRITE
}

type sftpFile struct {
	path   string
	write  bool
	bytes  int64
	result string // the first error on it, else ""
}

// NewSFTPTap returns a tap that reports operations to emit (called with
// the tap's lock held: it must not call back into the tap).
func NewSFTPTap(emit func(Event)) *SFTPTap {
	t := &SFTPTap{emit: emit, pending: map[uint32]sftpReq{}, handles: map[string]*sftpFile{}}
	t.client.packet = t.request
	t.server.packet = t.reply
	return t
}

// Client feeds bytes the client sent to the server, in order.
func (t *SFTPTap) Client(p []byte) { t.client.feed(p) }

// Server feeds bytes the server sent to the client, in order.
func (t *SFTPTap) Server(p []byte) { t.server.feed(p) }

// Close reports the files still open when the session ended.
func (t *SFTPTap) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for h, f := range t.handles {
		t.emitFile(f, "not_closed")
		delete(t.handles, h)
	}
}

func (t *SFTPTap) emitFile(f *sftpFile, result string) {
	if f.result != "" {
		result = f.result
	}
	t.emit(Event{Kind: KindFile, Source: "sftp", Op: openOp(f.write), Path: f.path, Bytes: f.bytes, Result: result})
}

// request handles a client packet: kept is its first bytes, n its length.
func (t *SFTPTap) request(kept []byte, n int) {
	d := sftpDecoder{b: kept}
	typ := d.byte()
	id := d.u32()
	if d.bad {
		return
	}
	var r sftpReq
	switch typ {
	case sftpOpen:
		r.op, r.path = "open", d.str()
		r.write = d.u32()&sftpFlagWrite != 0
	case sftpClose:
		r.op, r.handle = "close", d.str()
	case sftpRead:
		r.op, r.handle = "read", d.str()
	case sftpWrite:
		r.op, r.handle = "write", d.str()
		d.u64()
		r.bytes = int64(d.u32())
	case sftpStat, sftpLstat:
		r.op, r.path = "stat", d.str()
	case sftpFstat:
		r.op, r.handle = "stat", d.str()
	case sftpOpendir:
		r.op, r.path = "list", d.str()
	case sftpRealpath:
		r.op, r.path = "realpath", d.str()
	case sftpReadlink:
		r.op, r.path = "readlink", d.str()
	case sftpSetstat:
		r.op, r.path = "setstat", d.str()
	case sftpFsetstat:
		r.op, r.handle = "setstat", d.str()
	case sftpRemove:
		r.op, r.path = "remove", d.str()
	case sftpMkdir:
		r.op, r.path = "mkdir", d.str()
	case sftpRmdir:
		r.op, r.path = "rmdir", d.str()
	case sftpRename:
		r.op, r.path, r.target = "rename", d.str(), d.str()
	case sftpSymlink:
		// OpenSSH sends target then link path, the reverse of the draft.
		r.op, r.target, r.path = "symlink", d.str(), d.str()
	case sftpExtended:
		switch d.str() {
		case "posix-rename@openssh.com":
			r.op, r.path, r.target = "rename", d.str(), d.str()
		case "hardlink@openssh.com":
			r.op, r.target, r.path = "hardlink", d.str(), d.str()
		default:
			return
		}
	default:
		return
	}
	if d.bad {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.op == "write" {
		if f := t.handles[r.handle]; f != nil {
			f.write = true
			f.bytes += r.bytes
		}
	}
	if old, dup := t.pending[id]; dup {
		// An id reused before its answer: the answer can be only one's.
		t.untracked(old)
		t.pending[id] = r
		return
	}
	if len(t.pending) < sftpMaxPending {
		t.pending[id] = r
		return
	}
	t.overflow()
	t.untracked(r)
}

// untracked reports request r, which the tap cannot follow to its answer:
// a path operation (an open among them) as asked, result untracked; a
// close ends its file's record now. Reads and writes of a followed file
// are already counted; those of an unfollowed one were reported at its
// open.
func (t *SFTPTap) untracked(r sftpReq) {
	switch {
	case r.op == "close":
		if f := t.handles[r.handle]; f != nil {
			delete(t.handles, r.handle)
			t.emitFile(f, ResultUntracked)
		}
	case r.op == "open":
		t.emit(Event{Kind: KindFile, Source: "sftp", Op: openOp(r.write), Path: r.path, Bytes: -1, Result: ResultUntracked})
	case r.path != "":
		t.emit(Event{Kind: KindFile, Source: "sftp", Op: r.op, Path: r.path, Target: r.target, Result: ResultUntracked})
	}
}

// overflow reports, once, that the tap's tables were full.
func (t *SFTPTap) overflow() {
	if t.overflowed {
		return
	}
	t.overflowed = true
	t.emit(Event{Kind: KindFile, Source: "sftp", Op: "tap_overflow", Result: ResultUntracked})
}

func openOp(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

// reply handles a server packet.
func (t *SFTPTap) reply(kept []byte, n int) {
	d := sftpDecoder{b: kept}
	typ := d.byte()
	id := d.u32()
	if d.bad {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.pending[id]
	if !ok {
		return
	}
	delete(t.pending, id)
	switch typ {
	case sftpAttrs:
		if r.op == "stat" {
			t.status(r, "ok")
		}
	case sftpName:
		if r.op == "realpath" || r.op == "readlink" {
			if d.u32() > 0 { // the count; then the first name
				r.target = d.str()
			}
			t.status(r, "ok")
		}
	case sftpHandle:
		if r.op == "list" {
			t.status(r, "ok")
		}
		if r.op == "open" {
			h := d.str()
			switch {
			case d.bad:
			case t.handles[h] != nil || len(t.handles) < sftpMaxHandles:
				t.handles[h] = &sftpFile{path: r.path, write: r.write}
				if r.write {
					// Its outcome comes at its close; a crash before leaves this.
					t.emit(Event{Kind: KindFile, Source: "sftp", Op: "write", Path: r.path, Result: ResultStarted})
				}
			default: // opened, but its transfer cannot be followed
				t.overflow()
				t.emit(Event{Kind: KindFile, Source: "sftp", Op: openOp(r.write), Path: r.path, Bytes: -1, Result: ResultUntracked})
			}
		}
	case sftpData:
		if f := t.handles[r.handle]; f != nil && r.op == "read" {
			f.bytes += int64(max(0, n-9)) // type, id, the data's length
		}
	case sftpStatus:
		code := d.u32()
		if d.bad {
			return
		}
		result := "status_" + itoa(code)
		if int(code) < len(sftpStatusNames) {
			result = sftpStatusNames[code]
		}
		t.status(r, result)
	}
}

// status handles a request's status reply.
func (t *SFTPTap) status(r sftpReq, result string) {
	switch r.op {
	case "close":
		if f := t.handles[r.handle]; f != nil {
			delete(t.handles, r.handle)
			t.emitFile(f, result)
		}
	case "read":
		// EOF ends a read; anything else but ok is the file's error.
		if f := t.handles[r.handle]; f != nil && result != "eof" && result != "ok" && f.result == "" {
			f.result = result
		}
	case "write":
		if f := t.handles[r.handle]; f != nil && result != "ok" && f.result == "" {
			f.result = result
		}
	case "open":
		t.emit(Event{Kind: KindFile, Source: "sftp", Op: openOp(r.write), Path: r.path, Result: result})
	case "setstat", "stat":
		path := r.path
		if r.handle != "" {
			if f := t.handles[r.handle]; f != nil {
				path = f.path
			}
		}
		t.emit(Event{Kind: KindFile, Source: "sftp", Op: r.op, Path: path, Result: result})
	default:
		t.emit(Event{Kind: KindFile, Source: "sftp", Op: r.op, Path: r.path, Target: r.target, Result: result})
	}
}

// sftpStream cuts one direction's bytes into packets: it keeps each
// packet's first bytes (more for packets that carry paths) and counts the
// rest.
type sftpStream struct {
	packet func(kept []byte, n int)

	lenBuf [4]byte
	nLen   int    // bytes of lenBuf filled
	n      int    // the current packet's length
	left   int    // its bytes still to come
	keep   int    // how many of them to keep (set at its first byte)
	kept   []byte // reused
	broken bool   // not SFTP: stop looking
}

func (s *sftpStream) feed(p []byte) {
	for len(p) > 0 && !s.broken {
		if s.nLen < 4 {
			c := copy(s.lenBuf[s.nLen:], p)
			s.nLen += c
			p = p[c:]
			if s.nLen < 4 {
				return
			}
			s.n = int(binary.BigEndian.Uint32(s.lenBuf[:]))
			if s.n == 0 || s.n > sftpMaxPacket {
				s.broken = true
				return
			}
			s.left, s.keep, s.kept = s.n, 0, s.kept[:0]
			continue
		}
		if s.keep == 0 {
			s.keep = min(s.n, sftpKeepPath)
			if p[0] == sftpWrite || p[0] == sftpData {
				s.keep = min(s.n, sftpKeepData)
			}
		}
		take := min(len(p), s.left)
		if want := s.keep - len(s.kept); want > 0 {
			s.kept = append(s.kept, p[:min(want, take)]...)
		}
		s.left -= take
		p = p[take:]
		if s.left == 0 {
			s.packet(s.kept, s.n)
			s.nLen = 0
		}
	}
}

// sftpDecoder reads SSH wire types from a kept prefix; bad is set once
// it runs out.
type sftpDecoder struct {
	b   []byte
	bad bool
}

func (d *sftpDecoder) byte() byte {
	if len(d.b) < 1 {
		d.bad = true
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *sftpDecoder) u32() uint32 {
	if len(d.b) < 4 {
		d.bad = true
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *sftpDecoder) u64() uint64 {
	if len(d.b) < 8 {
		d.bad = true
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *sftpDecoder) str() string {
	n := d.u32()
	if d.bad || uint64(n) > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	v := string(d.b[:n])
	d.b = d.b[n:]
	return v
}

func itoa(v uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
