//go:build linux

package sftpd_test

// Helpers for the SFTP conformance suite (sftp_conformance_test.go): a fresh
// tree per test in confined or host mode, ServeDir run in a goroutine over
// an in-memory pipe, a tiny hand-written SFTP v3 packet client, and the
// pkg/sftp and OpenSSH clients.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/sftpd"
)

// Packet types (draft-ietf-secsh-filexfer-02 §3).
const (
	scInit          byte = 1
	scVersion       byte = 2
	scOpen          byte = 3
	scClose         byte = 4
	scRead          byte = 5
	scWrite         byte = 6
	scLstat         byte = 7
	scFstat         byte = 8
	scSetstat       byte = 9
	scFsetstat      byte = 10
	scOpendir       byte = 11
	scReaddir       byte = 12
	scRemove        byte = 13
	scMkdir         byte = 14
	scRmdir         byte = 15
	scRealpath      byte = 16
	scStat          byte = 17
	scRename        byte = 18
	scReadlink      byte = 19
	scSymlink       byte = 20
	scStatus        byte = 101
	scHandle        byte = 102
	scData          byte = 103
	scName          byte = 104
	scAttrs         byte = 105
	scExtended      byte = 200
	scExtendedReply byte = 201
)

// Status codes (§7). SFTP v3 defines 0..8 and nothing else.
const (
	scOK            uint32 = 0
	scEOF           uint32 = 1
	scNoSuchFile    uint32 = 2
	scPermDenied    uint32 = 3
	scFailure       uint32 = 4
	scBadMessage    uint32 = 5
	scNoConnection  uint32 = 6
	scConnLost      uint32 = 7
	scOpUnsupported uint32 = 8
)

// OPEN pflags (§6.3).
const (
	scFRead   uint32 = 0x01
	scFWrite  uint32 = 0x02
	scFAppend uint32 = 0x04
	scFCreat  uint32 = 0x08
	scFTrunc  uint32 = 0x10
	scFExcl   uint32 = 0x20
)

// Attribute flags (§5).
const (
	scASize     uint32 = 0x01
	scAUIDGID   uint32 = 0x02
	scAPerm     uint32 = 0x04
	scATime     uint32 = 0x08
	scAExtended uint32 = 0x80000000
)

// File type bits of the permissions attribute (POSIX st_mode).
const (
	scIFMT  uint32 = 0o170000
	scIFREG uint32 = 0o100000
	scIFDIR uint32 = 0o040000
	scIFLNK uint32 = 0o120000
)

// scTimeout bounds every wait on the server: a hang fails the test instead
// of stalling the run.
const scTimeout = 10 * time.Second

var scStatusNames = []string{"SSH_FX_OK", "SSH_FX_EOF", "SSH_FX_NO_SUCH_FILE", "SSH_FX_PERMISSION_DENIED",
	"SSH_FX_FAILURE", "SSH_FX_BAD_MESSAGE", "SSH_FX_NO_CONNECTION", "SSH_FX_CONNECTION_LOST", "SSH_FX_OP_UNSUPPORTED"}

func scStatusName(code uint32) string {
	if int(code) < len(scStatusNames) {
		return scStatusNames[code]
	}
	return fmt.Sprintf("status %d (not an SFTP v3 code)", code)
}

// ---------------------------------------------------------------------------
// The tree under test.

// scEnv is one fresh tree served in one mode.
type scEnv struct {
	mode  string // "confined" or "host"
	root  string // the dir given to ServeDir
	start string // the start dir, as the client sees paths
	base  string // the start dir on disk
	outer string // confined mode: the directory holding root (outside the client's view)
}

var scModes = []string{"confined", "host"}

// scNewEnv makes a fresh tree. Confined: outer/root is served, clients see it
// as "/" and start in "/home" (outer/root/home); outer holds what must stay
// out of reach. Host: "/" is served and the start dir is a temp dir.
func scNewEnv(t *testing.T, mode string) *scEnv {
	t.Helper()
	if mode == "host" {
		base := t.TempDir()
		return &scEnv{mode: mode, root: "/", start: base, base: base}
	}
	outer := t.TempDir()
	root := filepath.Join(outer, "root")
	base := filepath.Join(root, "home")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return &scEnv{mode: mode, root: root, start: "/home", base: base, outer: outer}
}

func (e *scEnv) confined() bool { return e.root != "/" }

// p is the absolute path the client uses for name (relative to the start dir).
func (e *scEnv) p(name string) string { return path.Join(e.start, name) }

// disk is name's path on disk (relative to the start dir).
func (e *scEnv) disk(name string) string { return filepath.Join(e.base, filepath.FromSlash(name)) }

func (e *scEnv) writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(e.disk(name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *scEnv) readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(e.disk(name))
	if err != nil {
		t.Fatalf("read back %s on disk: %v", name, err)
	}
	return b
}

func (e *scEnv) mkdir(t *testing.T, name string) {
	t.Helper()
	if err := os.MkdirAll(e.disk(name), 0o755); err != nil {
		t.Fatal(err)
	}
}

func (e *scEnv) symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, e.disk(name)); err != nil {
		t.Fatal(err)
	}
}

// scEach runs f once per mode, each on a fresh tree and a fresh server.
func scEach(t *testing.T, f func(t *testing.T, e *scEnv, c *scConn)) {
	t.Helper()
	for _, mode := range scModes {
		t.Run(mode, func(t *testing.T) {
			e := scNewEnv(t, mode)
			f(t, e, scDial(t, e))
		})
	}
}

// scCases runs each case as a subtest, in both modes (name/mode).
func scCases(t *testing.T, cases []scCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { scEach(t, tc.f) })
	}
}

type scCase struct {
	name string
	f    func(t *testing.T, e *scEnv, c *scConn)
}

func scRandom(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// scUmask is the process umask (read without changing it).
func scUmask(t *testing.T) uint32 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(m)
				}
			}
		}
	}
	t.Fatalf("cannot read the umask from /proc/self/status")
	return 0
}

func scLstatDisk(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s on disk: %v", p, err)
	}
	return &st
}

// ---------------------------------------------------------------------------
// The server.

// scServer is a server running on one end of a net.Pipe: ServeDir in a
// goroutine, or the sandgate binary.
type scServer struct {
	t       *testing.T
	client  net.Conn // the client's end
	done    chan error
	err     error
	exited  bool
	mayFail bool // malformed input: ServeDir may return an error
}

// scStart serves e with ServeDir on a fresh pipe: in confined mode an
// in-memory one (net.Pipe), in host mode two OS pipes, the replies' in
// blocking mode as the drivers give sftp-server its standard output, so
// that READs take the splice(2) path. At cleanup it closes the client's
// end and checks that ServeDir returns nil promptly and that no goroutine
// is left.
func scStart(t *testing.T, e *scEnv) *scServer {
	t.Helper()
	serve := func(rw io.ReadWriteCloser) error {
		return sftpd.ServeDir(e.root, rw, sftpd.WithStartDir(e.start))
	}
	if e.mode == "host" {
		cl, sv := scOSPipes(t)
		return scStartServeOn(t, serve, cl, sv)
	}
	return scStartServe(t, serve)
}

// scPipeConn is the client's ends of two OS pipes as a net.Conn.
type scPipeConn struct {
	r, w *os.File
}

func (c scPipeConn) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c scPipeConn) Write(b []byte) (int, error)        { return c.w.Write(b) }
func (c scPipeConn) Close() error                       { c.w.Close(); return c.r.Close() }
func (c scPipeConn) LocalAddr() net.Addr                { return scPipeAddr{} }
func (c scPipeConn) RemoteAddr() net.Addr               { return scPipeAddr{} }
func (c scPipeConn) SetDeadline(d time.Time) error      { c.r.SetDeadline(d); return c.w.SetDeadline(d) }
func (c scPipeConn) SetReadDeadline(d time.Time) error  { return c.r.SetReadDeadline(d) }
func (c scPipeConn) SetWriteDeadline(d time.Time) error { return c.w.SetWriteDeadline(d) }

type scPipeAddr struct{}

func (scPipeAddr) Network() string { return "pipe" }
func (scPipeAddr) String() string  { return "pipe" }

// scOSPipes returns the client's and the server's ends of two OS pipes.
func scOSPipes(t *testing.T) (net.Conn, io.ReadWriteCloser) {
	t.Helper()
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = outW.Fd() // blocking, as a child's standard output
	return scPipeConn{r: outR, w: reqW}, sftpd.PipeStdio(reqR, outW)
}

// scStartProcess runs `sandgate sftp-server` (as cred when set) on a pipe.
func scStartProcess(t *testing.T, bin, root, start string, cred *syscall.Credential) *scServer {
	t.Helper()
	return scStartServe(t, func(rw io.ReadWriteCloser) error {
		cmd := exec.Command(bin, "sftp-server", "--root", root, "--start", start)
		cmd.Stdin, cmd.Stdout = rw, rw
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w; stderr: %s", err, stderr.String())
		}
		return nil
	})
}

// scStartServe runs serve on the server's end of a fresh net.Pipe.
func scStartServe(t *testing.T, serve func(rw io.ReadWriteCloser) error) *scServer {
	t.Helper()
	cl, sv := net.Pipe()
	return scStartServeOn(t, serve, cl, sv)
}

// scStartServeOn runs serve on sv, the client's end being cl.
func scStartServeOn(t *testing.T, serve func(rw io.ReadWriteCloser) error, cl net.Conn, sv io.ReadWriteCloser) *scServer {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	s := &scServer{t: t, client: cl, done: make(chan error, 1)}
	go func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("ServeDir panicked: %v\n%s", r, debug.Stack())
			}
			sv.Close() // as the binary's exit closes its stdio
			s.done <- err
		}()
		err = serve(sv)
	}()
	t.Cleanup(func() {
		cl.Close()
		err, ok := s.wait(scTimeout)
		if !ok {
			t.Errorf("the server (ServeDir) did not return within %v after the client closed the stream", scTimeout)
			return
		}
		if err != nil && (!s.mayFail || strings.Contains(err.Error(), "panicked")) {
			t.Errorf("the server (ServeDir) returned %v after the client went away, want nil", err)
		}
		goleak.VerifyNone(t, ignore)
	})
	return s
}

// wait waits up to d for ServeDir to return.
func (s *scServer) wait(d time.Duration) (error, bool) {
	if s.exited {
		return s.err, true
	}
	select {
	case err := <-s.done:
		s.err, s.exited = err, true
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// ---------------------------------------------------------------------------
// Encoding.

// scAttr is the ATTRS structure (§5).
type scAttr struct {
	flags        uint32
	size         uint64
	uid, gid     uint32
	perm         uint32
	atime, mtime uint32
}

func scPerm(mode uint32) scAttr { return scAttr{flags: scAPerm, perm: mode} }

func (a scAttr) String() string {
	var parts []string
	if a.flags&scASize != 0 {
		parts = append(parts, fmt.Sprintf("size=%d", a.size))
	}
	if a.flags&scAUIDGID != 0 {
		parts = append(parts, fmt.Sprintf("uid=%d gid=%d", a.uid, a.gid))
	}
	if a.flags&scAPerm != 0 {
		parts = append(parts, fmt.Sprintf("perm=%#o", a.perm))
	}
	if a.flags&scATime != 0 {
		parts = append(parts, fmt.Sprintf("atime=%d mtime=%d", a.atime, a.mtime))
	}
	return fmt.Sprintf("{flags=%#x %s}", a.flags, strings.Join(parts, " "))
}

// scBytes is appended as is (no length prefix): for malformed packets.
type scBytes []byte

// scAppend encodes fields: byte, uint32, uint64, string and []byte (both as
// SFTP strings), scAttr, scBytes.
func scAppend(b []byte, fields ...any) []byte {
	for _, f := range fields {
		switch v := f.(type) {
		case byte:
			b = append(b, v)
		case uint32:
			b = binary.BigEndian.AppendUint32(b, v)
		case uint64:
			b = binary.BigEndian.AppendUint64(b, v)
		case string:
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		case []byte:
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		case scBytes:
			b = append(b, v...)
		case scAttr:
			b = binary.BigEndian.AppendUint32(b, v.flags)
			if v.flags&scASize != 0 {
				b = binary.BigEndian.AppendUint64(b, v.size)
			}
			if v.flags&scAUIDGID != 0 {
				b = binary.BigEndian.AppendUint32(b, v.uid)
				b = binary.BigEndian.AppendUint32(b, v.gid)
			}
			if v.flags&scAPerm != 0 {
				b = binary.BigEndian.AppendUint32(b, v.perm)
			}
			if v.flags&scATime != 0 {
				b = binary.BigEndian.AppendUint32(b, v.atime)
				b = binary.BigEndian.AppendUint32(b, v.mtime)
			}
		default:
			panic(fmt.Sprintf("scAppend: unsupported field %T", f))
		}
	}
	return b
}

// scFrame builds a whole packet: uint32 length, byte type, fields.
func scFrame(typ byte, fields ...any) []byte {
	body := scAppend([]byte{typ}, fields...)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// scReader decodes SFTP fields; the first short read sets err.
type scReader struct {
	b   []byte
	err error
}

func (r *scReader) need(n int) bool {
	if r.err == nil && len(r.b) < n {
		r.err = fmt.Errorf("reply truncated: need %d bytes, have %d", n, len(r.b))
	}
	return r.err == nil
}

func (r *scReader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *scReader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *scReader) str() string {
	n := r.u32()
	if !r.need(int(n)) {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *scReader) attrs() scAttr {
	var a scAttr
	a.flags = r.u32()
	if a.flags&scASize != 0 {
		a.size = r.u64()
	}
	if a.flags&scAUIDGID != 0 {
		a.uid, a.gid = r.u32(), r.u32()
	}
	if a.flags&scAPerm != 0 {
		a.perm = r.u32()
	}
	if a.flags&scATime != 0 {
		a.atime, a.mtime = r.u32(), r.u32()
	}
	if a.flags&scAExtended != 0 {
		for n := r.u32(); n > 0 && r.err == nil; n-- {
			r.str()
			r.str()
		}
	}
	return a
}

// ---------------------------------------------------------------------------
// The raw client.

// scPacket is one reply: its type, id (none for VERSION) and what follows.
type scPacket struct {
	typ  byte
	id   uint32
	body []byte
}

func (p scPacket) String() string {
	r := &scReader{b: p.body}
	switch p.typ {
	case scStatus:
		code := r.u32()
		msg := r.str()
		return fmt.Sprintf("STATUS %s %q", scStatusName(code), msg)
	case scHandle:
		return fmt.Sprintf("HANDLE %q", r.str())
	case scData:
		return fmt.Sprintf("DATA (%d bytes)", len(r.str()))
	case scName:
		return fmt.Sprintf("NAME (%d entries)", r.u32())
	case scAttrs:
		return "ATTRS " + r.attrs().String()
	case scExtendedReply:
		return fmt.Sprintf("EXTENDED_REPLY (%d bytes)", len(p.body))
	case scVersion:
		return "VERSION"
	}
	return fmt.Sprintf("packet type %d (%d bytes)", p.typ, len(p.body))
}

// scConn is a hand-written SFTP v3 client on the raw stream. A goroutine
// reads replies as they come, so the test can pipeline requests without the
// server ever blocking on its output; replies are matched by id.
type scConn struct {
	t       *testing.T
	srv     *scServer
	conn    net.Conn
	in      chan scPacket
	quit    chan struct{}
	readErr error // set by the reader before it closes in
	pending map[uint32]scPacket
	closed  bool // the server closed the stream
	lastID  uint32
	version uint32
	exts    map[string]string
	extList []string
}

// scDial starts a server and completes INIT/VERSION.
func scDial(t *testing.T, e *scEnv) *scConn {
	t.Helper()
	c := scDialNoInit(t, e)
	c.handshake(3)
	return c
}

// scDialNoInit starts a server and connects without sending INIT.
func scDialNoInit(t *testing.T, e *scEnv) *scConn {
	t.Helper()
	return scConnect(t, scStart(t, e))
}

// scConnect connects the raw client to s, without sending INIT.
func scConnect(t *testing.T, s *scServer) *scConn {
	t.Helper()
	c := &scConn{t: t, srv: s, conn: s.client, in: make(chan scPacket, 1024), quit: make(chan struct{}), pending: map[uint32]scPacket{}}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(c.in)
		hdr := make([]byte, 4)
		for {
			if _, err := io.ReadFull(c.conn, hdr); err != nil {
				if err != io.EOF {
					c.readErr = err
				}
				return
			}
			n := binary.BigEndian.Uint32(hdr)
			if n == 0 || n > 64<<20 {
				c.readErr = fmt.Errorf("server sent a packet of length %d", n)
				return
			}
			buf := make([]byte, n)
			if _, err := io.ReadFull(c.conn, buf); err != nil {
				c.readErr = fmt.Errorf("server sent a truncated packet: %w", err)
				return
			}
			p := scPacket{typ: buf[0], body: buf[1:]}
			if p.typ != scVersion {
				if len(buf) < 5 {
					c.readErr = fmt.Errorf("server sent a packet of type %d without an id", p.typ)
					return
				}
				p.id, p.body = binary.BigEndian.Uint32(buf[1:5]), buf[5:]
			}
			select {
			case c.in <- p:
			case <-c.quit:
				return
			}
		}
	}()
	t.Cleanup(func() {
		c.conn.Close()
		close(c.quit)
		<-readerDone
	})
	return c
}

// handshake sends INIT with version and reads VERSION.
func (c *scConn) handshake(version uint32) {
	c.t.Helper()
	c.sendRaw(scFrame(scInit, version))
	p, closed := c.next()
	if closed {
		c.t.Fatalf("INIT(%d): the server closed the stream (%v)", version, c.readErr)
	}
	if p.typ != scVersion {
		c.t.Fatalf("INIT(%d): got %v, want VERSION", version, p)
	}
	r := &scReader{b: p.body}
	c.version = r.u32()
	c.exts = map[string]string{}
	for r.err == nil && len(r.b) > 0 {
		name, data := r.str(), r.str()
		c.exts[name] = data
		c.extList = append(c.extList, name)
	}
	if r.err != nil {
		c.t.Fatalf("VERSION: malformed extension list: %v", r.err)
	}
}

func (c *scConn) has(ext string) bool {
	_, ok := c.exts[ext]
	return ok
}

// next returns the next packet, or closed when the server closed the stream.
// A hang fails the test.
func (c *scConn) next() (p scPacket, closed bool) {
	c.t.Helper()
	if c.closed {
		return scPacket{}, true
	}
	select {
	case p, ok := <-c.in:
		if !ok {
			c.closed = true
			return scPacket{}, true
		}
		return p, false
	case <-time.After(scTimeout):
		c.t.Fatalf("no reply from the server within %v (hang)", scTimeout)
	}
	return scPacket{}, true
}

func (c *scConn) sendRaw(b []byte) {
	c.t.Helper()
	if err := c.writeRaw(b); err != nil {
		c.t.Fatalf("write to the server: %v", err)
	}
}

func (c *scConn) writeRaw(b []byte) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(scTimeout))
	_, err := c.conn.Write(b)
	return err
}

func (c *scConn) nextID() uint32 {
	c.lastID++
	return c.lastID
}

// send sends a request with a fresh id and returns the id.
func (c *scConn) send(typ byte, fields ...any) uint32 {
	c.t.Helper()
	id := c.nextID()
	c.sendRaw(scFrame(typ, append([]any{id}, fields...)...))
	return id
}

// recvOrClose waits for the reply to id; closed reports that the server
// closed the stream instead.
func (c *scConn) recvOrClose(id uint32) (scPacket, bool) {
	c.t.Helper()
	if p, ok := c.pending[id]; ok {
		delete(c.pending, id)
		return p, false
	}
	for {
		p, closed := c.next()
		if closed {
			return p, true
		}
		if p.typ == scVersion {
			c.t.Errorf("unexpected VERSION packet while waiting for the reply to request %d", id)
			continue
		}
		if p.id == id {
			return p, false
		}
		if _, dup := c.pending[p.id]; dup {
			c.t.Errorf("two replies for request %d", p.id)
		}
		c.pending[p.id] = p
	}
}

// recv waits for the reply to id.
func (c *scConn) recv(id uint32) scPacket {
	c.t.Helper()
	p, closed := c.recvOrClose(id)
	if closed {
		c.t.Fatalf("the server closed the stream instead of answering request %d (%v)", id, c.readErr)
	}
	return p
}

func (c *scConn) call(typ byte, fields ...any) scPacket {
	c.t.Helper()
	return c.recv(c.send(typ, fields...))
}

// ext sends an SSH_FXP_EXTENDED request.
func (c *scConn) ext(name string, fields ...any) scPacket {
	c.t.Helper()
	return c.call(scExtended, append([]any{name}, fields...)...)
}

// ---- reply checks

func (c *scConn) status(p scPacket) (uint32, bool) {
	if p.typ != scStatus {
		return 0, false
	}
	r := &scReader{b: p.body}
	code := r.u32()
	return code, r.err == nil
}

// wantStatus fails unless p is a STATUS with one of the codes.
func (c *scConn) wantStatus(p scPacket, what string, codes ...uint32) bool {
	c.t.Helper()
	code, ok := c.status(p)
	if ok {
		for _, w := range codes {
			if code == w {
				return true
			}
		}
	}
	var names []string
	for _, w := range codes {
		names = append(names, scStatusName(w))
	}
	c.t.Errorf("%s: got %v, want %s", what, p, strings.Join(names, " or "))
	return false
}

func (c *scConn) wantOK(p scPacket, what string) bool {
	c.t.Helper()
	return c.wantStatus(p, what, scOK)
}

// wantError fails unless p is an error STATUS of SFTP v3 (2..8).
func (c *scConn) wantError(p scPacket, what string) bool {
	c.t.Helper()
	code, ok := c.status(p)
	if !ok || code < scNoSuchFile || code > scOpUnsupported {
		c.t.Errorf("%s: got %v, want an error status", what, p)
		return false
	}
	return true
}

func (c *scConn) handle(p scPacket, what string) string {
	c.t.Helper()
	if p.typ != scHandle {
		c.t.Fatalf("%s: got %v, want HANDLE", what, p)
	}
	r := &scReader{b: p.body}
	h := r.str()
	if r.err != nil || len(r.b) != 0 {
		c.t.Fatalf("%s: malformed HANDLE reply %x", what, p.body)
	}
	if len(h) > 256 {
		c.t.Errorf("%s: handle of %d bytes; SFTP v3 allows at most 256", what, len(h))
	}
	return h
}

func (c *scConn) data(p scPacket, what string) []byte {
	c.t.Helper()
	if p.typ != scData {
		c.t.Fatalf("%s: got %v, want DATA", what, p)
	}
	r := &scReader{b: p.body}
	d := r.str()
	if r.err != nil {
		c.t.Fatalf("%s: malformed DATA reply: %v", what, r.err)
	}
	return []byte(d)
}

func (c *scConn) attrs(p scPacket, what string) scAttr {
	c.t.Helper()
	if p.typ != scAttrs {
		c.t.Fatalf("%s: got %v, want ATTRS", what, p)
	}
	r := &scReader{b: p.body}
	a := r.attrs()
	if r.err != nil {
		c.t.Fatalf("%s: malformed ATTRS reply: %v", what, r.err)
	}
	return a
}

type scNameEntry struct {
	name, long string
	attrs      scAttr
}

func (c *scConn) names(p scPacket, what string) []scNameEntry {
	c.t.Helper()
	if p.typ != scName {
		c.t.Fatalf("%s: got %v, want NAME", what, p)
	}
	r := &scReader{b: p.body}
	n := r.u32()
	var out []scNameEntry
	for i := uint32(0); i < n && r.err == nil; i++ {
		e := scNameEntry{name: r.str(), long: r.str()}
		e.attrs = r.attrs()
		out = append(out, e)
	}
	if r.err != nil {
		c.t.Fatalf("%s: malformed NAME reply: %v", what, r.err)
	}
	return out
}

// oneName is the single name of a REALPATH/READLINK reply.
func (c *scConn) oneName(p scPacket, what string) string {
	c.t.Helper()
	ns := c.names(p, what)
	if len(ns) != 1 {
		c.t.Fatalf("%s: NAME with %d entries, want 1", what, len(ns))
	}
	return ns[0].name
}

func (c *scConn) extReply(p scPacket, what string) []byte {
	c.t.Helper()
	if p.typ != scExtendedReply {
		c.t.Fatalf("%s: got %v, want EXTENDED_REPLY", what, p)
	}
	return p.body
}

// ---- requests

func (c *scConn) open(p string, pflags uint32, a scAttr) scPacket {
	c.t.Helper()
	return c.call(scOpen, p, pflags, a)
}

func (c *scConn) mustOpen(p string, pflags uint32, a scAttr) string {
	c.t.Helper()
	return c.handle(c.open(p, pflags, a), fmt.Sprintf("OPEN %s flags %#x", p, pflags))
}

func (c *scConn) read(h string, off uint64, n uint32) scPacket {
	c.t.Helper()
	return c.call(scRead, h, off, n)
}

func (c *scConn) write(h string, off uint64, data []byte) scPacket {
	c.t.Helper()
	return c.call(scWrite, h, off, data)
}

func (c *scConn) mustWrite(h string, off uint64, data []byte) {
	c.t.Helper()
	c.wantOK(c.write(h, off, data), fmt.Sprintf("WRITE %d bytes at %d", len(data), off))
}

func (c *scConn) close(h string) scPacket {
	c.t.Helper()
	return c.call(scClose, h)
}

func (c *scConn) mustClose(h string) {
	c.t.Helper()
	c.wantOK(c.close(h), "CLOSE")
}

func (c *scConn) mustStat(typ byte, p string) scAttr {
	c.t.Helper()
	return c.attrs(c.call(typ, p), fmt.Sprintf("stat(%d) %s", typ, p))
}

// readAll reads h from offset 0 to EOF in 32 KiB requests.
func (c *scConn) readAll(h string) []byte {
	c.t.Helper()
	var out []byte
	for {
		p := c.read(h, uint64(len(out)), 32<<10)
		if code, ok := c.status(p); ok && code == scEOF {
			return out
		}
		d := c.data(p, fmt.Sprintf("READ at %d", len(out)))
		if len(d) == 0 {
			c.t.Fatalf("READ at %d: empty DATA before EOF", len(out))
		}
		out = append(out, d...)
	}
}

// readDir lists a directory handle to EOF; calls counts the READDIRs.
func (c *scConn) readDir(h string) (entries []scNameEntry, calls int) {
	c.t.Helper()
	for calls = 1; calls < 10000; calls++ {
		p := c.call(scReaddir, h)
		if code, ok := c.status(p); ok && code == scEOF {
			return entries, calls
		}
		ns := c.names(p, "READDIR")
		if len(ns) == 0 {
			c.t.Fatalf("READDIR: NAME with no entries (end of directory is SSH_FX_EOF)")
		}
		entries = append(entries, ns...)
	}
	c.t.Fatalf("READDIR never reached EOF")
	return nil, 0
}

// limits asks limits@openssh.com; ok is false (and the test marked failed)
// when the server does not answer it.
func (c *scConn) limits() (packet, read, write, handles uint64, ok bool) {
	c.t.Helper()
	p := c.ext("limits@openssh.com")
	if p.typ != scExtendedReply {
		c.t.Errorf("limits@openssh.com (advertised: %v): got %v, want EXTENDED_REPLY", c.has("limits@openssh.com"), p)
		return 0, 0, 0, 0, false
	}
	r := &scReader{b: p.body}
	packet, read, write, handles = r.u64(), r.u64(), r.u64(), r.u64()
	if r.err != nil {
		c.t.Errorf("limits@openssh.com: %v", r.err)
		return 0, 0, 0, 0, false
	}
	return packet, read, write, handles, true
}

// ---------------------------------------------------------------------------
// pkg/sftp's client.

// scClient connects pkg/sftp's client to a fresh server on e.
func scClient(t *testing.T, e *scEnv, opts ...sftp.ClientOption) *sftp.Client {
	t.Helper()
	s := scStart(t, e)
	c, err := sftp.NewClientPipe(s.client, s.client, opts...)
	if err != nil {
		t.Fatalf("sftp.NewClientPipe: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ---------------------------------------------------------------------------
// OpenSSH's sftp and the sandgate binary.

// scSandgateBinary returns $SANDGATE_BIN, or builds cmd/sandgate for t.
func scSandgateBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SANDGATE_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "sandgate")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sandgate")
	cmd.Dir = ".." // the module root: this package is sandbox/
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sandgate: %v\n%s", err, out)
	}
	return bin
}

// scOpenSSH runs OpenSSH's sftp in batch mode against `sandgate sftp-server`
// started directly (-D), in local dir.
type scOpenSSH struct {
	sftp, bin string
	root      string // --root
	start     string // --start
	local     string // sftp's working directory
}

func (o *scOpenSSH) run(t *testing.T, batch string, extra ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := fmt.Sprintf("%s sftp-server --root %s --start %s", o.bin, o.root, o.start)
	args := append(append([]string{}, extra...), "-D", server, "-b", "-")
	cmd := exec.CommandContext(ctx, o.sftp, args...)
	cmd.Dir = o.local
	cmd.Stdin = strings.NewReader(batch)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("sftp did not finish within 30s (hang): %w", err)
	}
	return out.String(), errOut.String(), err
}

// mustRun runs batch and fails the test unless every command succeeded.
func (o *scOpenSSH) mustRun(t *testing.T, batch string, extra ...string) string {
	t.Helper()
	out, errOut, err := o.run(t, batch, extra...)
	if err != nil {
		t.Fatalf("sftp -b:\n%s\n=> %v\nstdout:\n%s\nstderr:\n%s", batch, err, out, errOut)
	}
	return out
}
