//go:build linux

package sftpd_test

// The SFTP conformance suite: what clients rely on from sandgate's SFTP
// server (ServeDir and `sandgate sftp-server`), written to the protocol
// (draft-ietf-secsh-filexfer-02, SFTP v3), to OpenSSH's extensions and to
// what OpenSSH's sftp-server does, not to any implementation's quirks.
//
// Every case runs in both modes unless it says otherwise: "confined" serves
// a directory through os.Root (clients see it as "/", start in "/home"),
// "host" serves "/" with absolute paths under a temp dir, over two OS pipes
// as the drivers run the server (so READs splice). Each case gets a
// fresh tree and a fresh server; at the end the server must return nil once
// the client has gone and leave no goroutine behind.
//
// Three clients drive it: a hand-written packet client (exact status codes,
// pipelining, malformed input), github.com/pkg/sftp's client, and OpenSSH's
// sftp (-D, no ssh).
//
// Cases marked "needs the new server" test what only the replacement
// implements (limits@openssh.com...): they fail against the old one.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/gwtest"
)

func TestSFTPConformanceVersion(t *testing.T) {
	// OpenSSH's client only uses an extension whose revision it knows.
	revisions := map[string]string{
		"posix-rename@openssh.com": "1",
		"statvfs@openssh.com":      "2",
		"fstatvfs@openssh.com":     "2",
		"hardlink@openssh.com":     "1",
		"fsync@openssh.com":        "1",
		"lsetstat@openssh.com":     "1",
		"limits@openssh.com":       "1",
		"expand-path@openssh.com":  "1",
	}
	required := []string{
		"posix-rename@openssh.com",
		"statvfs@openssh.com",
		"fstatvfs@openssh.com", // needs the new server
		"hardlink@openssh.com",
		"fsync@openssh.com",  // needs the new server
		"limits@openssh.com", // needs the new server
	}
	scCases(t, []scCase{
		{"version-3", func(t *testing.T, e *scEnv, c *scConn) {
			if c.version != 3 {
				t.Errorf("VERSION %d, want 3", c.version)
			}
		}},
		{"extensions", func(t *testing.T, e *scEnv, c *scConn) {
			for _, ext := range required {
				if !c.has(ext) {
					t.Errorf("VERSION does not advertise %s (advertised: %q)", ext, c.extList)
				}
			}
			for ext, data := range c.exts {
				if want, ok := revisions[ext]; ok && data != want {
					t.Errorf("VERSION advertises %s revision %q, want %q (OpenSSH's)", ext, data, want)
				}
			}
			for i, ext := range c.extList {
				if slices.Contains(c.extList[:i], ext) {
					t.Errorf("VERSION advertises %s twice", ext)
				}
			}
		}},
	})
	t.Run("newer-client-version", func(t *testing.T) {
		scEachNoInit(t, func(t *testing.T, e *scEnv, c *scConn) {
			c.handshake(6)
			if c.version != 3 {
				t.Errorf("INIT 6: VERSION %d, want 3", c.version)
			}
			c.wantStillServes(e)
		})
	})
	t.Run("init-with-extension-data", func(t *testing.T) {
		scEachNoInit(t, func(t *testing.T, e *scEnv, c *scConn) {
			c.sendRaw(scFrame(scInit, uint32(3), "x-test@example.com", "1"))
			p, closed := c.next()
			if closed || p.typ != scVersion {
				t.Fatalf("INIT with extension data: got %v (closed %v), want VERSION", p, closed)
			}
			c.wantStillServes(e)
		})
	})
}

// needs the new server: limits@openssh.com.
func TestSFTPConformanceLimits(t *testing.T) {
	scCases(t, []scCase{
		{"values", func(t *testing.T, e *scEnv, c *scConn) {
			if !c.has("limits@openssh.com") {
				t.Errorf("limits@openssh.com is not advertised (advertised: %q)", c.extList)
			}
			pk, rd, wr, hs, ok := c.limits()
			if !ok {
				return
			}
			t.Logf("limits: packet %d, read %d, write %d, handles %d", pk, rd, wr, hs)
			if pk < 34000 {
				t.Errorf("max packet length %d, want >= 34000 (the draft's minimum)", pk)
			}
			for _, l := range []struct {
				name string
				v    uint64
			}{{"read", rd}, {"write", wr}} {
				if l.v < 32768 || l.v > pk {
					t.Errorf("max %s length %d, want in [32768, max packet length %d]", l.name, l.v, pk)
				}
			}
			if hs == 0 {
				t.Errorf("max open handles 0, want > 0")
			}
		}},
		{"read-max-length", func(t *testing.T, e *scEnv, c *scConn) {
			_, rd, _, _, ok := c.limits()
			if !ok {
				t.FailNow()
			}
			data := scRandom(int(rd) + 1000)
			e.writeFile(t, "big", data)
			h := c.mustOpen(e.p("big"), scFRead, scAttr{})
			for _, off := range []uint64{0, 1000} {
				got := c.data(c.read(h, off, uint32(rd)), fmt.Sprintf("READ %d bytes (the max read length) at %d", rd, off))
				if len(got) != int(rd) || !bytes.Equal(got, data[off:off+rd]) {
					t.Errorf("READ of the max read length %d at %d: %d bytes (equal prefix: %v), want all %d in one DATA",
						rd, off, len(got), bytes.HasPrefix(data[off:], got), rd)
				}
			}
			c.mustClose(h)
		}},
		{"write-max-length", func(t *testing.T, e *scEnv, c *scConn) {
			_, _, wr, _, ok := c.limits()
			if !ok {
				t.FailNow()
			}
			data := scRandom(int(wr))
			h := c.mustOpen(e.p("big"), scFWrite|scFCreat, scAttr{})
			c.mustWrite(h, 0, data)
			c.mustClose(h)
			if got := e.readFile(t, "big"); !bytes.Equal(got, data) {
				t.Errorf("WRITE of the max write length %d: %d bytes on disk, content equal %v", wr, len(got), bytes.Equal(got, data))
			}
		}},
		{"oversized-packet-closes-stream", func(t *testing.T, e *scEnv, c *scConn) {
			c.srv.mayFail = true
			pk, _, _, _, ok := c.limits()
			if !ok {
				pk = 256 << 10
				t.Logf("no limits: trying OpenSSH's max packet length %d", pk)
			}
			h := c.mustOpen(e.p("f"), scFWrite|scFCreat, scAttr{})
			// A WRITE whose length field (type byte onwards) is one byte more
			// than the max packet length.
			id := c.nextID()
			body := scAppend([]byte{scWrite}, id, h, uint64(0))
			n := int(pk) + 1
			body = scAppend(body, make([]byte, n-len(body)-4))
			frame := append(binary.BigEndian.AppendUint32(nil, uint32(n)), body...)
			wrote := make(chan error, 1)
			go func() { wrote <- c.writeRaw(frame) }()
			if p, closed := c.recvOrClose(id); !closed {
				t.Errorf("a packet of %d bytes (max %d): the server answered %v; OpenSSH's sftp-server closes the stream", n, pk, p)
				c.conn.Close()
			}
			<-wrote
			if _, ok := c.srv.wait(scTimeout); !ok {
				t.Errorf("ServeDir did not return after an oversized packet")
			}
		}},
	})
}

func TestSFTPConformanceOpen(t *testing.T) {
	scCases(t, []scCase{
		{"read", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("hello world"))
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			if got := c.readAll(h); string(got) != "hello world" {
				t.Errorf("read %q, want %q", got, "hello world")
			}
			c.wantError(c.write(h, 0, []byte("X")), "WRITE on a handle opened READ only")
			c.mustClose(h)
			if got := e.readFile(t, "f"); string(got) != "hello world" {
				t.Errorf("file is %q after a refused write", got)
			}
		}},
		{"relative-path", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("rel"))
			h := c.mustOpen("f", scFRead, scAttr{})
			if got := c.readAll(h); string(got) != "rel" {
				t.Errorf("OPEN of a path relative to the start dir read %q", got)
			}
			c.mustClose(h)
		}},
		{"write-keeps-content", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("hello world"))
			h := c.mustOpen(e.p("f"), scFWrite, scAttr{})
			c.mustWrite(h, 0, []byte("HE"))
			c.mustClose(h)
			if got := e.readFile(t, "f"); string(got) != "HEllo world" {
				t.Errorf("WRITE without TRUNC: file %q, want %q", got, "HEllo world")
			}
		}},
		{"write-missing-without-creat", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.open(e.p("missing"), scFWrite, scAttr{}), "OPEN WRITE of a missing file without CREAT", scNoSuchFile)
			if _, err := os.Lstat(e.disk("missing")); err == nil {
				t.Errorf("OPEN without CREAT created the file")
			}
		}},
		{"creat", func(t *testing.T, e *scEnv, c *scConn) {
			h := c.mustOpen(e.p("new"), scFWrite|scFCreat, scAttr{})
			c.mustWrite(h, 0, []byte("abc"))
			c.mustClose(h)
			if got := e.readFile(t, "new"); string(got) != "abc" {
				t.Errorf("created file holds %q, want %q", got, "abc")
			}
			// CREAT on an existing file neither fails nor truncates.
			e.writeFile(t, "old", []byte("hello world"))
			h = c.mustOpen(e.p("old"), scFWrite|scFCreat, scAttr{})
			c.mustWrite(h, 0, []byte("J"))
			c.mustClose(h)
			if got := e.readFile(t, "old"); string(got) != "Jello world" {
				t.Errorf("CREAT without TRUNC on an existing file: %q, want %q", got, "Jello world")
			}
		}},
		{"trunc", func(t *testing.T, e *scEnv, c *scConn) {
			for _, flags := range []uint32{scFWrite | scFCreat | scFTrunc, scFWrite | scFTrunc} {
				e.writeFile(t, "f", []byte("hello world"))
				h := c.mustOpen(e.p("f"), flags, scAttr{})
				if a := c.attrs(c.call(scFstat, h), "FSTAT"); a.flags&scASize == 0 || a.size != 0 {
					t.Errorf("OPEN flags %#x: FSTAT right after says %v, want size 0", flags, a)
				}
				c.mustWrite(h, 0, []byte("x"))
				c.mustClose(h)
				if got := e.readFile(t, "f"); string(got) != "x" {
					t.Errorf("OPEN flags %#x: file %q, want %q", flags, got, "x")
				}
			}
		}},
		{"append", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("hello"))
			h := c.mustOpen(e.p("f"), scFWrite|scFAppend, scAttr{})
			c.mustWrite(h, 0, []byte("XY"))
			c.mustWrite(h, 1, []byte("Z"))
			c.mustClose(h)
			if got := e.readFile(t, "f"); string(got) != "helloXYZ" {
				t.Errorf("APPEND: writes at offsets 0 and 1 gave %q, want %q (writes go to the end)", got, "helloXYZ")
			}
			h = c.mustOpen(e.p("new"), scFWrite|scFAppend|scFCreat, scAttr{})
			c.mustWrite(h, 100, []byte("a"))
			c.mustWrite(h, 0, []byte("b"))
			c.mustClose(h)
			if got := e.readFile(t, "new"); string(got) != "ab" {
				t.Errorf("APPEND|CREAT: %q, want %q", got, "ab")
			}
		}},
		{"excl", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("keep"))
			c.wantStatus(c.open(e.p("f"), scFWrite|scFCreat|scFExcl, scAttr{}), "OPEN CREAT|EXCL of an existing file", scFailure)
			c.wantStatus(c.open(e.p("f"), scFWrite|scFCreat|scFExcl|scFTrunc, scAttr{}), "OPEN CREAT|EXCL|TRUNC of an existing file", scFailure)
			if got := e.readFile(t, "f"); string(got) != "keep" {
				t.Errorf("failed EXCL open changed the file to %q", got)
			}
			h := c.mustOpen(e.p("new"), scFWrite|scFCreat|scFExcl, scAttr{})
			c.mustClose(h)
			if _, err := os.Stat(e.disk("new")); err != nil {
				t.Errorf("OPEN CREAT|EXCL of a new file: %v", err)
			}
		}},
		{"excl-dangling-symlink", func(t *testing.T, e *scEnv, c *scConn) {
			// O_EXCL does not follow a symlink: no file appears at its target.
			e.symlink(t, "target", "dangling")
			c.wantStatus(c.open(e.p("dangling"), scFWrite|scFCreat|scFExcl, scAttr{}), "OPEN CREAT|EXCL of a dangling symlink", scFailure)
			if _, err := os.Lstat(e.disk("target")); err == nil {
				t.Errorf("OPEN CREAT|EXCL created the dangling symlink's target")
			}
		}},
		{"create-permissions", func(t *testing.T, e *scEnv, c *scConn) {
			umask := scUmask(t)
			for _, tc := range []struct {
				name string
				a    scAttr
				want uint32
			}{
				{"p0600", scPerm(0o600), 0o600},
				{"p0755", scPerm(0o755), 0o755 &^ umask},
				{"p0640-with-type-bits", scPerm(scIFREG | 0o640), 0o640 &^ umask},
				{"no-attrs", scAttr{}, 0o666 &^ umask}, // OpenSSH's default
			} {
				h := c.mustOpen(e.p(tc.name), scFWrite|scFCreat, tc.a)
				c.mustClose(h)
				if st := scLstatDisk(t, e.disk(tc.name)); st.Mode&0o7777 != tc.want || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
					t.Errorf("OPEN CREAT with %v (umask %#o): mode %#o, want a regular file %#o", tc.a, umask, st.Mode, tc.want)
				}
			}
			// The mode applies to a new file only.
			e.writeFile(t, "existing", nil)
			os.Chmod(e.disk("existing"), 0o644)
			c.mustClose(c.mustOpen(e.p("existing"), scFWrite|scFCreat, scPerm(0o600)))
			if st := scLstatDisk(t, e.disk("existing")); st.Mode&0o7777 != 0o644 {
				t.Errorf("OPEN CREAT of an existing file with perm 0600 changed its mode to %#o", st.Mode&0o7777)
			}
		}},
		{"directory", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			// OpenSSH hands out a handle (open(2) of a directory O_RDONLY
			// works) and fails the READ; refusing the OPEN is fine too.
			p := c.open(e.p("d"), scFRead, scAttr{})
			if p.typ == scHandle {
				h := c.handle(p, "OPEN READ of a directory")
				c.wantError(c.read(h, 0, 1024), "READ on a directory opened as a file")
				c.mustClose(h)
			} else {
				c.wantError(p, "OPEN READ of a directory")
			}
			c.wantError(c.open(e.p("d"), scFWrite, scAttr{}), "OPEN WRITE of a directory")
			c.wantError(c.open(e.p("d"), scFWrite|scFCreat|scFTrunc, scAttr{}), "OPEN WRITE|CREAT|TRUNC of a directory")
			c.wantStillServes(e)
		}},
		{"missing", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.open(e.p("missing"), scFRead, scAttr{}), "OPEN READ of a missing file", scNoSuchFile)
			c.wantStatus(c.open(e.p("nodir/f"), scFRead, scAttr{}), "OPEN READ in a missing dir", scNoSuchFile)
			c.wantStatus(c.open(e.p("nodir/f"), scFWrite|scFCreat, scAttr{}), "OPEN CREAT in a missing dir", scNoSuchFile)
		}},
		{"permission-denied", func(t *testing.T, e *scEnv, c *scConn) {
			if os.Geteuid() == 0 {
				t.Skip("root is not subject to permission checks (TestSFTPConformancePermissions runs the server as nobody)")
			}
			e.writeFile(t, "f", []byte("x"))
			os.Chmod(e.disk("f"), 0)
			c.wantStatus(c.open(e.p("f"), scFRead, scAttr{}), "OPEN READ of a mode-0 file", scPermDenied)
			c.wantStatus(c.open(e.p("f"), scFWrite, scAttr{}), "OPEN WRITE of a mode-0 file", scPermDenied)
		}},
	})
}

func TestSFTPConformanceRead(t *testing.T) {
	scCases(t, []scCase{
		{"eof", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			e.writeFile(t, "empty", nil)
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			c.wantStatus(c.read(h, 10, 100), "READ at the end of the file", scEOF)
			c.wantStatus(c.read(h, 1<<40, 100), "READ past the end of the file", scEOF)
			c.mustClose(h)
			h = c.mustOpen(e.p("empty"), scFRead, scAttr{})
			c.wantStatus(c.read(h, 0, 100), "READ of an empty file", scEOF)
			c.mustClose(h)
		}},
		{"short-read-at-end", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			if got := c.data(c.read(h, 7, 100), "READ 100 at 7"); string(got) != "789" {
				t.Errorf("READ 100 bytes at 7 of a 10-byte file: %q, want %q", got, "789")
			}
			// Offsets are explicit: no hidden file position.
			if got := c.data(c.read(h, 2, 3), "READ 3 at 2"); string(got) != "234" {
				t.Errorf("READ 3 at 2: %q, want %q", got, "234")
			}
			c.mustClose(h)
		}},
		{"zero-length", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			// OpenSSH answers an empty DATA; EOF is tolerated.
			for _, off := range []uint64{0, 10} {
				p := c.read(h, off, 0)
				if code, ok := c.status(p); ok && code == scEOF {
					continue
				}
				if d := c.data(p, fmt.Sprintf("READ of length 0 at %d", off)); len(d) != 0 {
					t.Errorf("READ of length 0 at %d returned %d bytes", off, len(d))
				}
			}
			if got := c.data(c.read(h, 0, 4), "READ after a zero-length READ"); string(got) != "0123" {
				t.Errorf("READ after a zero-length READ: %q", got)
			}
			c.mustClose(h)
		}},
		{"longer-than-max", func(t *testing.T, e *scEnv, c *scConn) {
			// A server may send fewer bytes than asked (the draft, §6.4);
			// OpenSSH clamps to its max read length. It must not refuse.
			data := scRandom(1 << 20)
			e.writeFile(t, "f", data)
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			for _, n := range []uint32{4 << 20, math.MaxUint32} {
				got := c.data(c.read(h, 0, n), fmt.Sprintf("READ of %d bytes", n))
				if len(got) == 0 || !bytes.HasPrefix(data, got) {
					t.Errorf("READ of %d bytes: %d bytes, prefix of the file %v", n, len(got), bytes.HasPrefix(data, got))
				}
			}
			c.mustClose(h)
		}},
		{"closed-handle", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			c.mustClose(h)
			c.wantStatus(c.read(h, 0, 10), "READ on a closed handle", scFailure)
		}},
		{"unknown-handle", func(t *testing.T, e *scEnv, c *scConn) {
			for _, h := range []string{"", "bogus", "\x00\x00\x00\x07", strings.Repeat("h", 300)} {
				c.wantStatus(c.read(h, 0, 10), fmt.Sprintf("READ on the unknown handle %q", h), scFailure)
			}
			c.wantStillServes(e)
		}},
		{"pipelined-64", func(t *testing.T, e *scEnv, c *scConn) {
			const chunk, n = 32 << 10, 64
			data := scRandom(chunk * n)
			e.writeFile(t, "f", data)
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			ids := make([]uint32, n)
			for i := range n { // every request before any reply is read
				ids[i] = c.send(scRead, h, uint64(i*chunk), uint32(chunk))
			}
			for i := n - 1; i >= 0; i-- { // replies matched by id, any order
				got := c.data(c.recv(ids[i]), fmt.Sprintf("pipelined READ %d", i))
				if !bytes.Equal(got, data[i*chunk:(i+1)*chunk]) {
					t.Errorf("pipelined READ %d (offset %d): %d bytes, want the file's %d bytes there", i, i*chunk, len(got), chunk)
				}
			}
			c.mustClose(h)
		}},
	})
}

func TestSFTPConformanceWrite(t *testing.T) {
	scCases(t, []scCase{
		{"sparse", func(t *testing.T, e *scEnv, c *scConn) {
			const off = 1 << 20
			h := c.mustOpen(e.p("f"), scFWrite|scFRead|scFCreat, scAttr{})
			c.mustWrite(h, off, []byte("end"))
			c.mustWrite(h, 0, []byte("start"))
			if got := c.data(c.read(h, 4096, 4096), "READ in the hole"); !bytes.Equal(got, make([]byte, 4096)) {
				t.Errorf("READ in the hole: %d bytes, not all zero", len(got))
			}
			c.mustClose(h)
			want := append(append([]byte("start"), make([]byte, off-5)...), "end"...)
			if got := e.readFile(t, "f"); !bytes.Equal(got, want) {
				t.Errorf("sparse file: %d bytes on disk, want %d: start, zeros, end", len(got), len(want))
			}
		}},
		{"pipelined-64", func(t *testing.T, e *scEnv, c *scConn) {
			const chunk, n = 32 << 10, 64
			data := scRandom(chunk * n)
			h := c.mustOpen(e.p("f"), scFWrite|scFCreat, scAttr{})
			ids := make([]uint32, n)
			for i := n - 1; i >= 0; i-- { // last chunk first, no reply read yet
				ids[i] = c.send(scWrite, h, uint64(i*chunk), data[i*chunk:(i+1)*chunk])
			}
			for i := range n {
				c.wantOK(c.recv(ids[i]), fmt.Sprintf("pipelined WRITE %d", i))
			}
			c.mustClose(h)
			if got := e.readFile(t, "f"); !bytes.Equal(got, data) {
				t.Errorf("after 64 pipelined WRITEs: %d bytes on disk, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
			}
		}},
		{"overwrite-middle", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("aaaaaaaaaa"))
			h := c.mustOpen(e.p("f"), scFWrite, scAttr{})
			c.mustWrite(h, 3, []byte("BBB"))
			c.mustClose(h)
			if got := e.readFile(t, "f"); string(got) != "aaaBBBaaaa" {
				t.Errorf("overwrite in the middle: %q, want %q", got, "aaaBBBaaaa")
			}
		}},
		{"empty-write", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("abc"))
			h := c.mustOpen(e.p("f"), scFWrite, scAttr{})
			c.mustWrite(h, 1, nil)
			c.mustClose(h)
			if got := e.readFile(t, "f"); string(got) != "abc" {
				t.Errorf("empty WRITE changed the file to %q", got)
			}
		}},
		{"unknown-handle", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantError(c.write("bogus", 0, []byte("x")), "WRITE on an unknown handle")
		}},
	})
}

func TestSFTPConformanceClose(t *testing.T) {
	scCases(t, []scCase{
		{"file", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("abc"))
			h := c.mustOpen(e.p("f"), scFRead|scFWrite, scAttr{})
			c.mustClose(h)
			c.wantStatus(c.read(h, 0, 3), "READ after CLOSE", scFailure)
			c.wantError(c.write(h, 0, []byte("x")), "WRITE after CLOSE")
			c.wantError(c.call(scFstat, h), "FSTAT after CLOSE")
			c.wantError(c.call(scFsetstat, h, scPerm(0o600)), "FSETSTAT after CLOSE")
			c.wantError(c.close(h), "second CLOSE")
			if got := e.readFile(t, "f"); string(got) != "abc" {
				t.Errorf("file changed to %q through a closed handle", got)
			}
		}},
		{"dir", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			h := c.handle(c.call(scOpendir, e.p("d")), "OPENDIR")
			c.mustClose(h)
			c.wantError(c.call(scReaddir, h), "READDIR after CLOSE")
			c.wantError(c.close(h), "second CLOSE")
		}},
		{"unknown-handle", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantError(c.close("bogus"), "CLOSE of an unknown handle")
		}},
	})
}

func TestSFTPConformanceStat(t *testing.T) {
	const atime, mtime = 1000000000, 1100000000
	setup := func(t *testing.T, e *scEnv) *syscall.Stat_t {
		e.writeFile(t, "f", make([]byte, 1234))
		if err := os.Chmod(e.disk("f"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(e.disk("f"), time.Unix(atime, 0), time.Unix(mtime, 0)); err != nil {
			t.Fatal(err)
		}
		return scLstatDisk(t, e.disk("f"))
	}
	check := func(t *testing.T, what string, a scAttr, st *syscall.Stat_t) {
		t.Helper()
		want := scAttr{flags: scASize | scAUIDGID | scAPerm | scATime, size: 1234, uid: st.Uid, gid: st.Gid,
			perm: scIFREG | 0o640, atime: atime, mtime: mtime}
		if a != want {
			t.Errorf("%s: %v, want %v", what, a, want)
		}
	}
	scCases(t, []scCase{
		{"file", func(t *testing.T, e *scEnv, c *scConn) {
			st := setup(t, e)
			check(t, "LSTAT", c.mustStat(scLstat, e.p("f")), st)
			check(t, "STAT", c.mustStat(scStat, e.p("f")), st)
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			check(t, "FSTAT", c.attrs(c.call(scFstat, h), "FSTAT"), st)
			c.mustClose(h)
		}},
		{"directory", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			os.Chmod(e.disk("d"), 0o750)
			for _, typ := range []byte{scLstat, scStat} {
				if a := c.mustStat(typ, e.p("d")); a.flags&scAPerm == 0 || a.perm != scIFDIR|0o750 {
					t.Errorf("stat(%d) of a directory: %v, want perm %#o", typ, a, scIFDIR|0o750)
				}
			}
		}},
		{"symlink", func(t *testing.T, e *scEnv, c *scConn) {
			st := setup(t, e)
			e.symlink(t, "f", "link")
			if a := c.mustStat(scLstat, e.p("link")); a.perm&scIFMT != scIFLNK {
				t.Errorf("LSTAT of a symlink: %v, want a symlink (perm type %#o)", a, scIFLNK)
			}
			check(t, "STAT through a symlink", c.mustStat(scStat, e.p("link")), st)
		}},
		{"dangling-symlink", func(t *testing.T, e *scEnv, c *scConn) {
			e.symlink(t, "nowhere", "dangling")
			if a := c.mustStat(scLstat, e.p("dangling")); a.perm&scIFMT != scIFLNK {
				t.Errorf("LSTAT of a dangling symlink: %v", a)
			}
			c.wantStatus(c.call(scStat, e.p("dangling")), "STAT of a dangling symlink", scNoSuchFile)
		}},
		{"missing", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			for _, p := range []string{"missing", "missing/x", "f/x"} {
				for _, typ := range []byte{scLstat, scStat} {
					c.wantStatus(c.call(typ, e.p(p)), fmt.Sprintf("stat(%d) %s", typ, p), scNoSuchFile)
				}
			}
		}},
		{"fstat-unknown-handle", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantError(c.call(scFstat, "bogus"), "FSTAT of an unknown handle")
		}},
	})
}

func TestSFTPConformanceSetstat(t *testing.T) {
	scCases(t, []scCase{
		{"size", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			c.wantOK(c.call(scSetstat, e.p("f"), scAttr{flags: scASize, size: 4}), "SETSTAT size 4")
			if got := e.readFile(t, "f"); string(got) != "0123" {
				t.Errorf("truncate to 4: %q", got)
			}
			c.wantOK(c.call(scSetstat, e.p("f"), scAttr{flags: scASize, size: 100}), "SETSTAT size 100")
			if got := e.readFile(t, "f"); len(got) != 100 || string(got[:4]) != "0123" || !bytes.Equal(got[4:], make([]byte, 96)) {
				t.Errorf("extend to 100: %d bytes %q", len(got), got)
			}
		}},
		{"permissions", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			e.mkdir(t, "d")
			e.symlink(t, "f", "link")
			for _, tc := range []struct {
				name string
				perm uint32
				file string
				want uint32
			}{
				{"file 0600", 0o600, "f", 0o600},
				{"file 0755 (no umask)", 0o755, "f", 0o755},
				{"with type bits", scIFREG | 0o604, "f", 0o604},
				{"directory 0700", 0o700, "d", 0o700},
				{"through a symlink changes the target", 0o640, "link", 0o640},
			} {
				c.wantOK(c.call(scSetstat, e.p(tc.file), scPerm(tc.perm)), "SETSTAT "+tc.name)
				target := tc.file
				if target == "link" {
					target = "f"
				}
				if m := scLstatDisk(t, e.disk(target)).Mode & 0o7777; m != tc.want {
					t.Errorf("SETSTAT %s: mode %#o, want %#o", tc.name, m, tc.want)
				}
			}
		}},
		{"times", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			times := [][2]uint32{{1234567890, 1300000000}}
			// 3000000000 does not fit an int32: times are uint32. Only where
			// the filesystem can store it.
			os.Chtimes(e.disk("f"), time.Unix(1, 0), time.Unix(3000000000, 0))
			if scLstatDisk(t, e.disk("f")).Mtim.Sec == 3000000000 {
				times = append(times, [2]uint32{1, 3000000000})
			}
			for _, tm := range times {
				c.wantOK(c.call(scSetstat, e.p("f"), scAttr{flags: scATime, atime: tm[0], mtime: tm[1]}), fmt.Sprintf("SETSTAT times %v", tm))
				st := scLstatDisk(t, e.disk("f"))
				if st.Atim.Sec != int64(tm[0]) || st.Mtim.Sec != int64(tm[1]) {
					t.Errorf("SETSTAT atime %d mtime %d: disk has %d %d", tm[0], tm[1], st.Atim.Sec, st.Mtim.Sec)
				}
				if a := c.mustStat(scStat, e.p("f")); a.atime != tm[0] || a.mtime != tm[1] {
					t.Errorf("STAT after SETSTAT times %v: %v", tm, a)
				}
			}
		}},
		{"all-at-once", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			st := scLstatDisk(t, e.disk("f"))
			a := scAttr{flags: scASize | scAUIDGID | scAPerm | scATime, size: 5, uid: st.Uid, gid: st.Gid, perm: 0o604, atime: 1500000000, mtime: 1600000000}
			c.wantOK(c.call(scSetstat, e.p("f"), a), "SETSTAT size, own uid/gid, perm, times")
			st = scLstatDisk(t, e.disk("f"))
			if st.Size != 5 || st.Mode&0o7777 != 0o604 || st.Atim.Sec != 1500000000 || st.Mtim.Sec != 1600000000 {
				t.Errorf("SETSTAT %v: disk size %d mode %#o atime %d mtime %d", a, st.Size, st.Mode&0o7777, st.Atim.Sec, st.Mtim.Sec)
			}
		}},
		{"missing", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.call(scSetstat, e.p("missing"), scPerm(0o600)), "SETSTAT of a missing file", scNoSuchFile)
		}},
		{"fsetstat", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("0123456789"))
			h := c.mustOpen(e.p("f"), scFWrite, scAttr{})
			c.wantOK(c.call(scFsetstat, h, scAttr{flags: scASize, size: 3}), "FSETSTAT size 3")
			c.wantOK(c.call(scFsetstat, h, scAttr{flags: scASize, size: 8}), "FSETSTAT size 8")
			c.wantOK(c.call(scFsetstat, h, scPerm(0o640)), "FSETSTAT perm 0640")
			// Last: a truncate would set the mtime.
			c.wantOK(c.call(scFsetstat, h, scAttr{flags: scATime, atime: 1234567890, mtime: 1300000000}), "FSETSTAT times")
			c.mustClose(h)
			st := scLstatDisk(t, e.disk("f"))
			if got := e.readFile(t, "f"); string(got) != "012\x00\x00\x00\x00\x00" {
				t.Errorf("FSETSTAT size 3 then 8: %q", got)
			}
			if st.Mode&0o7777 != 0o640 || st.Atim.Sec != 1234567890 || st.Mtim.Sec != 1300000000 {
				t.Errorf("FSETSTAT: mode %#o atime %d mtime %d", st.Mode&0o7777, st.Atim.Sec, st.Mtim.Sec)
			}
		}},
		{"lsetstat-symlink", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			os.Chmod(e.disk("f"), 0o644)
			os.Chtimes(e.disk("f"), time.Unix(1000000000, 0), time.Unix(1000000000, 0))
			e.symlink(t, "f", "link")
			p := c.ext("lsetstat@openssh.com", e.p("link"), scAttr{flags: scATime, atime: 1200000000, mtime: 1300000000})
			if code, _ := c.status(p); code == scOpUnsupported && !c.has("lsetstat@openssh.com") {
				t.Skip("lsetstat@openssh.com is not supported")
			}
			c.wantOK(p, "lsetstat@openssh.com times on a symlink")
			if st := scLstatDisk(t, e.disk("link")); st.Mtim.Sec != 1300000000 {
				t.Errorf("lsetstat times: the link's mtime is %d, want 1300000000", st.Mtim.Sec)
			}
			// Linux cannot chmod a symlink: OpenSSH answers an error. Either
			// way the target stays as it was.
			c.ext("lsetstat@openssh.com", e.p("link"), scPerm(0o600))
			if st := scLstatDisk(t, e.disk("f")); st.Mode&0o7777 != 0o644 || st.Mtim.Sec != 1000000000 {
				t.Errorf("lsetstat on a symlink changed its target: mode %#o mtime %d", st.Mode&0o7777, st.Mtim.Sec)
			}
			c.wantStatus(c.ext("lsetstat@openssh.com", e.p("missing"), scPerm(0o600)), "lsetstat of a missing file", scNoSuchFile)
		}},
	})
}

func TestSFTPConformanceReaddir(t *testing.T) {
	modeRE := regexp.MustCompile(`^[-dlcbps][-r][-w][-xsS][-r][-w][-xsS][-r][-w][-xtT]`)
	scCases(t, []scCase{
		{"300-entries", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "big/sub")
			want := map[string]byte{"sub": 'd', "ln": 'l'}
			for i := range 300 {
				name := fmt.Sprintf("f%03d", i)
				e.writeFile(t, "big/"+name, make([]byte, i%10))
				want[name] = '-'
			}
			e.symlink(t, "f000", "big/ln")
			h := c.handle(c.call(scOpendir, e.p("big")), "OPENDIR")
			entries, calls := c.readDir(h)
			t.Logf("%d entries in %d READDIR calls", len(entries), calls)
			seen := map[string]int{}
			for _, ent := range entries {
				seen[ent.name]++
				if seen[ent.name] == 2 {
					t.Errorf("READDIR returned %q more than once", ent.name)
				}
				if ent.name == "." || ent.name == ".." {
					continue
				}
				typ, ok := want[ent.name]
				if !ok {
					t.Errorf("READDIR returned %q, which is not in the directory", ent.name)
					continue
				}
				if ent.long == "" {
					t.Errorf("%s: empty longname", ent.name)
				} else if !modeRE.MatchString(ent.long) || ent.long[0] != typ || !strings.Contains(ent.long, ent.name) {
					t.Errorf("%s: longname %q, want `ls -l` style: mode string starting with %q, then the name", ent.name, ent.long, typ)
				} else if len(ent.long) < 12 || ent.long[10:12] != "  " {
					// OpenSSH's mode field is strmode's 11 characters
					// (the last one for an ACL mark), then a space.
					t.Errorf("%s: longname %q, want the mode then two spaces, as OpenSSH's", ent.name, ent.long)
				}
				if typ == '-' {
					size := uint64(mustAtoi(t, ent.name[1:])) % 10
					if ent.attrs.flags&scASize == 0 || ent.attrs.size != size || ent.attrs.perm&scIFMT != scIFREG {
						t.Errorf("%s: attrs %v, want size %d, a regular file", ent.name, ent.attrs, size)
					}
					if !slices.Contains(strings.Fields(ent.long), strconv.FormatUint(size, 10)) {
						t.Errorf("%s: longname %q lacks the size %d", ent.name, ent.long, size)
					}
				}
			}
			for name := range want {
				if seen[name] == 0 {
					t.Errorf("READDIR never returned %q", name)
				}
			}
			c.wantStatus(c.call(scReaddir, h), "READDIR after EOF", scEOF)
			c.mustClose(h)
		}},
		{"empty", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			h := c.handle(c.call(scOpendir, e.p("d")), "OPENDIR")
			entries, _ := c.readDir(h)
			for _, ent := range entries {
				if ent.name != "." && ent.name != ".." {
					t.Errorf("empty dir lists %q", ent.name)
				}
			}
			c.mustClose(h)
		}},
		{"start-dir", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "here", nil)
			for _, p := range []string{".", e.start} {
				h := c.handle(c.call(scOpendir, p), fmt.Sprintf("OPENDIR %q", p))
				entries, _ := c.readDir(h)
				if !slices.ContainsFunc(entries, func(n scNameEntry) bool { return n.name == "here" }) {
					t.Errorf("OPENDIR %q does not list the start dir's file", p)
				}
				c.mustClose(h)
			}
		}},
		{"opendir-file", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			c.wantError(c.call(scOpendir, e.p("f")), "OPENDIR of a file")
		}},
		{"opendir-missing", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.call(scOpendir, e.p("missing")), "OPENDIR of a missing dir", scNoSuchFile)
		}},
		{"readdir-file-handle", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("x"))
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			c.wantError(c.call(scReaddir, h), "READDIR on a file handle")
			c.mustClose(h)
			c.wantError(c.call(scReaddir, "bogus"), "READDIR on an unknown handle")
		}},
	})
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSFTPConformanceRemove(t *testing.T) {
	umask := scUmask(t)
	scCases(t, []scCase{
		{"remove-file", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			c.wantOK(c.call(scRemove, e.p("f")), "REMOVE")
			if _, err := os.Lstat(e.disk("f")); err == nil {
				t.Errorf("file still there after REMOVE")
			}
			c.wantStatus(c.call(scRemove, e.p("f")), "REMOVE of a missing file", scNoSuchFile)
		}},
		{"remove-directory", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			c.wantError(c.call(scRemove, e.p("d")), "REMOVE of a directory")
			if _, err := os.Stat(e.disk("d")); err != nil {
				t.Errorf("REMOVE of a directory removed it")
			}
		}},
		{"remove-symlink", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("x"))
			e.symlink(t, "f", "link")
			c.wantOK(c.call(scRemove, e.p("link")), "REMOVE of a symlink")
			if _, err := os.Lstat(e.disk("link")); err == nil {
				t.Errorf("symlink still there")
			}
			if _, err := os.Stat(e.disk("f")); err != nil {
				t.Errorf("REMOVE of a symlink removed its target")
			}
		}},
		{"mkdir", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantOK(c.call(scMkdir, e.p("d"), scPerm(0o700)), "MKDIR perm 0700")
			c.wantOK(c.call(scMkdir, e.p("d2"), scPerm(0o750)), "MKDIR perm 0750")
			c.wantOK(c.call(scMkdir, e.p("d3"), scAttr{}), "MKDIR without attrs")
			for name, want := range map[string]uint32{"d": 0o700 &^ umask, "d2": 0o750 &^ umask, "d3": 0o777 &^ umask} {
				if st := scLstatDisk(t, e.disk(name)); st.Mode&syscall.S_IFMT != syscall.S_IFDIR || st.Mode&0o7777 != want {
					t.Errorf("MKDIR %s: mode %#o, want a directory %#o", name, st.Mode, want)
				}
			}
		}},
		{"mkdir-exists", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			e.writeFile(t, "f", nil)
			c.wantStatus(c.call(scMkdir, e.p("d"), scAttr{}), "MKDIR of an existing dir", scFailure)
			c.wantStatus(c.call(scMkdir, e.p("f"), scAttr{}), "MKDIR over an existing file", scFailure)
		}},
		{"mkdir-missing-parent", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.call(scMkdir, e.p("nodir/d"), scAttr{}), "MKDIR in a missing dir", scNoSuchFile)
		}},
		{"rmdir", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			c.wantOK(c.call(scRmdir, e.p("d")), "RMDIR")
			if _, err := os.Lstat(e.disk("d")); err == nil {
				t.Errorf("dir still there after RMDIR")
			}
		}},
		{"rmdir-non-empty", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			e.writeFile(t, "d/f", nil)
			c.wantStatus(c.call(scRmdir, e.p("d")), "RMDIR of a non-empty dir", scFailure)
			if _, err := os.Stat(e.disk("d/f")); err != nil {
				t.Errorf("RMDIR of a non-empty dir removed content")
			}
		}},
		{"rmdir-missing", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.call(scRmdir, e.p("missing")), "RMDIR of a missing dir", scNoSuchFile)
		}},
		{"rmdir-file", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			c.wantError(c.call(scRmdir, e.p("f")), "RMDIR of a file")
			if _, err := os.Stat(e.disk("f")); err != nil {
				t.Errorf("RMDIR of a file removed it")
			}
		}},
	})
}

func TestSFTPConformanceRealpath(t *testing.T) {
	scCases(t, []scCase{
		{"paths", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "a")
			tests := []struct{ in, want string }{
				{".", e.start},
				{"", e.start}, // OpenSSH: "" is "."
				{"a/../b", e.p("b")},
				{"a/./x//", e.p("a/x")},
				{"missing-leaf", e.p("missing-leaf")},
				{e.p("a/missing-leaf"), e.p("a/missing-leaf")},
				{"/", "/"},
			}
			if e.confined() {
				tests = append(tests, struct{ in, want string }{"/..", "/"}, struct{ in, want string }{"../../../..", "/"},
					struct{ in, want string }{"/../home/../..", "/"})
			} else {
				tests = append(tests, struct{ in, want string }{e.start + "/..", filepath.Dir(e.base)})
			}
			for _, tt := range tests {
				if got := c.oneName(c.call(scRealpath, tt.in), fmt.Sprintf("REALPATH %q", tt.in)); got != tt.want {
					t.Errorf("REALPATH %q = %q, want %q", tt.in, got, tt.want)
				}
			}
		}},
		{"dotdot-after-a-symlink", func(t *testing.T, e *scEnv, c *scConn) {
			if e.confined() {
				t.Skip("under a root, os.Root refuses .. itself")
			}
			// ".." after a symlink is the link target's parent, as the
			// kernel resolves it: "lnk/../f" is a/f, not ./f.
			e.mkdir(t, "a")
			e.mkdir(t, "a/in")
			e.writeFile(t, "a/f", []byte("target"))
			e.writeFile(t, "f", []byte("wrong"))
			if err := os.Symlink(e.disk("a/in"), e.disk("lnk")); err != nil {
				t.Fatal(err)
			}
			if got := c.oneName(c.call(scRealpath, "lnk/.."), "REALPATH lnk/.."); got != e.p("a") {
				t.Errorf("REALPATH lnk/.. = %q, want %q", got, e.p("a"))
			}
			c.wantStatus(c.call(scRealpath, "missing-dir/x"), "REALPATH under a missing directory", scNoSuchFile)
			c.wantOK(c.call(scRemove, e.start+"/lnk/../f"), "REMOVE lnk/../f") // not e.p: it cleans
			if _, err := os.Lstat(e.disk("a/f")); err == nil {
				t.Error("REMOVE lnk/../f left a/f")
			}
			if _, err := os.Lstat(e.disk("f")); err != nil {
				t.Errorf("REMOVE lnk/../f removed ./f: %v", err)
			}
		}},
	})
}

func TestSFTPConformanceRename(t *testing.T) {
	scCases(t, []scCase{
		{"rename", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "a", []byte("A"))
			c.wantOK(c.call(scRename, e.p("a"), e.p("b")), "RENAME a b")
			if got := e.readFile(t, "b"); string(got) != "A" {
				t.Errorf("renamed file holds %q", got)
			}
			if _, err := os.Lstat(e.disk("a")); err == nil {
				t.Errorf("source still there after RENAME")
			}
		}},
		{"onto-existing-file", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "a", []byte("A"))
			e.writeFile(t, "b", []byte("B"))
			c.wantStatus(c.call(scRename, e.p("a"), e.p("b")), "RENAME onto an existing file (SFTP v3)", scFailure)
			if a, b := e.readFile(t, "a"), e.readFile(t, "b"); string(a) != "A" || string(b) != "B" {
				t.Errorf("failed RENAME changed the files: a=%q b=%q", a, b)
			}
		}},
		{"onto-existing-dir", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d1")
			e.mkdir(t, "d2")
			c.wantStatus(c.call(scRename, e.p("d1"), e.p("d2")), "RENAME a dir onto an existing dir (SFTP v3)", scFailure)
			if _, err := os.Stat(e.disk("d1")); err != nil {
				t.Errorf("failed RENAME moved the source dir")
			}
		}},
		{"directory", func(t *testing.T, e *scEnv, c *scConn) {
			e.mkdir(t, "d")
			e.writeFile(t, "d/f", []byte("x"))
			c.wantOK(c.call(scRename, e.p("d"), e.p("e")), "RENAME of a directory")
			if got := e.readFile(t, "e/f"); string(got) != "x" {
				t.Errorf("renamed dir content: %q", got)
			}
		}},
		{"missing", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.call(scRename, e.p("missing"), e.p("b")), "RENAME of a missing file", scNoSuchFile)
		}},
		{"posix-rename", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "a", []byte("A"))
			e.writeFile(t, "b", []byte("B"))
			c.wantOK(c.ext("posix-rename@openssh.com", e.p("a"), e.p("b")), "posix-rename@openssh.com onto an existing file")
			if got := e.readFile(t, "b"); string(got) != "A" {
				t.Errorf("posix-rename target holds %q, want %q", got, "A")
			}
			if _, err := os.Lstat(e.disk("a")); err == nil {
				t.Errorf("posix-rename left the source")
			}
			c.wantStatus(c.ext("posix-rename@openssh.com", e.p("missing"), e.p("c")), "posix-rename of a missing file", scNoSuchFile)
		}},
	})
}

func TestSFTPConformanceSymlink(t *testing.T) {
	scCases(t, []scCase{
		{"argument-order", func(t *testing.T, e *scEnv, c *scConn) {
			// OpenSSH's order: target first, then the new link's path (the
			// reverse of the draft). Both dangling, so the order shows.
			c.wantOK(c.call(scSymlink, "some-target", e.p("link")), "SYMLINK some-target link")
			got, err := os.Readlink(e.disk("link"))
			if err != nil || got != "some-target" {
				t.Errorf("SYMLINK(target, linkpath): link -> %q (%v), want link -> some-target", got, err)
			}
			if _, err := os.Lstat(e.disk("some-target")); err == nil {
				t.Errorf("SYMLINK created a file at the target's path: arguments taken in the draft's order")
			}
		}},
		{"follow", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("data"))
			c.wantOK(c.call(scSymlink, "f", e.p("link")), "SYMLINK f link")
			h := c.mustOpen(e.p("link"), scFRead, scAttr{})
			if got := c.readAll(h); string(got) != "data" {
				t.Errorf("read through a new symlink: %q", got)
			}
			c.mustClose(h)
		}},
		{"target-stored-as-given", func(t *testing.T, e *scEnv, c *scConn) {
			for i, target := range []string{"f", "../x/y", "/abs/nowhere", "sub/../f", "with space", "./f"} {
				link := fmt.Sprintf("l%d", i)
				c.wantOK(c.call(scSymlink, target, e.p(link)), fmt.Sprintf("SYMLINK %q %s", target, link))
				if got, err := os.Readlink(e.disk(link)); err != nil || got != target {
					t.Errorf("SYMLINK %q: on disk -> %q (%v)", target, got, err)
				}
				if got := c.oneName(c.call(scReadlink, e.p(link)), "READLINK "+link); got != target {
					t.Errorf("READLINK of a link to %q = %q", target, got)
				}
			}
		}},
		{"link-exists", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("keep"))
			c.wantStatus(c.call(scSymlink, "elsewhere", e.p("f")), "SYMLINK onto an existing file", scFailure)
			if got := e.readFile(t, "f"); string(got) != "keep" {
				t.Errorf("failed SYMLINK changed the file")
			}
		}},
		{"readlink-errors", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			c.wantError(c.call(scReadlink, e.p("f")), "READLINK of a regular file")
			c.wantStatus(c.call(scReadlink, e.p("missing")), "READLINK of a missing file", scNoSuchFile)
		}},
	})
}

func TestSFTPConformanceExtensions(t *testing.T) {
	statvfs := func(t *testing.T, e *scEnv, c *scConn, p scPacket, what string) {
		t.Helper()
		b := c.extReply(p, what)
		if len(b) != 11*8 {
			t.Fatalf("%s: reply of %d bytes, want 11 uint64 (88 bytes)", what, len(b))
		}
		r := &scReader{b: b}
		var v [11]uint64
		for i := range v {
			v[i] = r.u64()
		}
		var st unix.Statfs_t
		if err := unix.Statfs(e.base, &st); err != nil {
			t.Fatal(err)
		}
		bsize, frsize, blocks, namemax := v[0], v[1], v[2], v[10]
		if bsize == 0 || frsize == 0 || blocks == 0 || namemax == 0 {
			t.Errorf("%s: f_bsize %d f_frsize %d f_blocks %d f_namemax %d, want all > 0", what, bsize, frsize, blocks, namemax)
		}
		if bsize != uint64(st.Bsize) || namemax != uint64(st.Namelen) {
			t.Errorf("%s: f_bsize %d f_namemax %d, statfs(2) says %d %d", what, bsize, namemax, st.Bsize, st.Namelen)
		}
	}
	scCases(t, []scCase{
		{"hardlink", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("one"))
			c.wantOK(c.ext("hardlink@openssh.com", e.p("f"), e.p("h")), "hardlink@openssh.com f h")
			a, errA := os.Stat(e.disk("f"))
			b, errB := os.Stat(e.disk("h"))
			if errA != nil || errB != nil || !os.SameFile(a, b) {
				t.Errorf("hardlink: f and h are not the same file (%v %v)", errA, errB)
			}
			e.writeFile(t, "x", nil)
			c.wantStatus(c.ext("hardlink@openssh.com", e.p("f"), e.p("x")), "hardlink onto an existing file", scFailure)
			c.wantStatus(c.ext("hardlink@openssh.com", e.p("missing"), e.p("y")), "hardlink of a missing file", scNoSuchFile)
		}},
		{"fsync", func(t *testing.T, e *scEnv, c *scConn) { // needs the new server
			h := c.mustOpen(e.p("f"), scFWrite|scFCreat, scAttr{})
			c.mustWrite(h, 0, []byte("durable"))
			c.wantOK(c.ext("fsync@openssh.com", h), "fsync@openssh.com on a write handle")
			c.mustClose(h)
			c.wantError(c.ext("fsync@openssh.com", h), "fsync@openssh.com on a closed handle")
		}},
		{"statvfs", func(t *testing.T, e *scEnv, c *scConn) {
			statvfs(t, e, c, c.ext("statvfs@openssh.com", e.start), "statvfs@openssh.com of the start dir")
			statvfs(t, e, c, c.ext("statvfs@openssh.com", "."), `statvfs@openssh.com "."`)
			c.wantStatus(c.ext("statvfs@openssh.com", e.p("missing")), "statvfs of a missing path", scNoSuchFile)
		}},
		{"fstatvfs", func(t *testing.T, e *scEnv, c *scConn) { // needs the new server
			e.writeFile(t, "f", nil)
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			statvfs(t, e, c, c.ext("fstatvfs@openssh.com", h), "fstatvfs@openssh.com")
			c.mustClose(h)
			c.wantError(c.ext("fstatvfs@openssh.com", h), "fstatvfs@openssh.com on a closed handle")
		}},
		{"expand-path", func(t *testing.T, e *scEnv, c *scConn) {
			if !c.has("expand-path@openssh.com") {
				t.Skip("expand-path@openssh.com is not advertised")
			}
			e.mkdir(t, "sub")
			for _, tt := range []struct{ in, want string }{
				{"~", e.start}, {".", e.start}, {"", e.start}, {"~/sub", e.p("sub")}, {"sub/..", e.start},
			} {
				if got := c.oneName(c.ext("expand-path@openssh.com", tt.in), "expand-path "+tt.in); got != tt.want {
					t.Errorf("expand-path %q = %q, want %q", tt.in, got, tt.want)
				}
			}
		}},
		{"unknown-extended", func(t *testing.T, e *scEnv, c *scConn) {
			c.wantStatus(c.ext("no-such-extension@example.com", "arg"), "unknown extended request", scOpUnsupported)
			c.wantStatus(c.ext(""), "extended request with an empty name", scOpUnsupported)
			c.wantStillServes(e)
		}},
	})
}

// wantStillServes checks that the server still answers a plain request.
func (c *scConn) wantStillServes(e *scEnv) {
	c.t.Helper()
	if got := c.oneName(c.call(scRealpath, "."), "REALPATH . (is the server still serving?)"); got != e.start {
		c.t.Errorf("REALPATH . = %q, want %q", got, e.start)
	}
}

// scEachNoInit is scEach without the INIT/VERSION handshake.
func scEachNoInit(t *testing.T, f func(t *testing.T, e *scEnv, c *scConn)) {
	t.Helper()
	for _, mode := range scModes {
		t.Run(mode, func(t *testing.T) {
			e := scNewEnv(t, mode)
			f(t, e, scDialNoInit(t, e))
		})
	}
}

func TestSFTPConformanceMalformed(t *testing.T) {
	// frame builds a packet whose length field covers exactly body.
	frame := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	// answered: the server must answer id with one of codes, or close the
	// stream; never hang or panic. If it answered, it must still serve.
	answered := func(t *testing.T, e *scEnv, c *scConn, raw []byte, id uint32, what string, codes ...uint32) {
		t.Helper()
		c.srv.mayFail = true
		c.sendRaw(raw)
		p, closed := c.recvOrClose(id)
		if closed {
			t.Logf("%s: the server closed the stream", what)
			if _, ok := c.srv.wait(scTimeout); !ok {
				t.Errorf("%s: the stream is closed but ServeDir did not return", what)
			}
			return
		}
		c.wantStatus(p, what, codes...)
		c.wantStillServes(e)
	}
	scCases(t, []scCase{
		{"unknown-packet-type", func(t *testing.T, e *scEnv, c *scConn) {
			id := c.nextID()
			c.sendRaw(scFrame(99, id, "payload"))
			if p, closed := c.recvOrClose(id); closed {
				t.Errorf("unknown packet type 99: the server closed the stream, want SSH_FX_OP_UNSUPPORTED for id %d", id)
			} else {
				c.wantStatus(p, "unknown packet type 99", scOpUnsupported)
				c.wantStillServes(e)
			}
		}},
		{"truncated-open", func(t *testing.T, e *scEnv, c *scConn) {
			id := c.nextID()
			// The name's length says 1000 bytes; the packet ends after 5.
			answered(t, e, c, frame(scAppend([]byte{scOpen}, id, uint32(1000), scBytes("short"))), id,
				"OPEN with a string running past the packet", scBadMessage, scFailure)
		}},
		{"string-length-overflow", func(t *testing.T, e *scEnv, c *scConn) {
			id := c.nextID()
			answered(t, e, c, frame(scAppend([]byte{scStat}, id, uint32(math.MaxUint32), scBytes("x"))), id,
				"STAT with a string length of 2^32-1", scBadMessage, scFailure)
		}},
		{"truncated-read", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("x"))
			h := c.mustOpen(e.p("f"), scFRead, scAttr{})
			id := c.nextID()
			answered(t, e, c, frame(scAppend([]byte{scRead}, id, h)), id, "READ without offset and length", scBadMessage, scFailure)
		}},
		{"truncated-write", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("keep"))
			h := c.mustOpen(e.p("f"), scFWrite, scAttr{})
			id := c.nextID()
			answered(t, e, c, frame(scAppend([]byte{scWrite}, id, h, uint64(0), uint32(1<<20), scBytes("0123456789"))), id,
				"WRITE whose data runs past the packet", scBadMessage, scFailure)
		}},
		{"truncated-attrs", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", nil)
			id := c.nextID()
			answered(t, e, c, frame(scAppend([]byte{scSetstat}, id, e.p("f"), scASize|scAPerm|scATime|scAExtended, uint64(1))), id,
				"SETSTAT whose attrs run past the packet", scBadMessage, scFailure)
		}},
		{"no-id", func(t *testing.T, e *scEnv, c *scConn) {
			// A packet of just a type byte: nothing to answer to. The server
			// may skip it or close the stream, but must not hang.
			c.srv.mayFail = true
			c.sendRaw(frame([]byte{scRealpath}))
			id := c.nextID()
			if err := c.writeRaw(scFrame(scRealpath, id, ".")); err != nil {
				t.Logf("the server closed the stream after a packet without id")
			} else if p, closed := c.recvOrClose(id); closed {
				t.Logf("the server closed the stream after a packet without id")
			} else if p.typ != scName {
				t.Errorf("REALPATH right after a packet without id: %v, want NAME", p)
			}
		}},
		{"huge-length", func(t *testing.T, e *scEnv, c *scConn) {
			// 4 GiB announced: the server cannot skip it; it must close the
			// stream (OpenSSH exits), not try to allocate or wait for it.
			c.srv.mayFail = true
			id := c.nextID()
			raw := append(binary.BigEndian.AppendUint32(nil, math.MaxUint32), scAppend([]byte{scRealpath}, id, ".")...)
			wrote := make(chan error, 1)
			go func() { wrote <- c.writeRaw(raw) }()
			if p, closed := c.recvOrClose(id); !closed {
				t.Errorf("a packet announcing 4 GiB: the server answered %v, want it to close the stream", p)
				c.conn.Close()
			}
			<-wrote
			if _, ok := c.srv.wait(scTimeout); !ok {
				t.Errorf("ServeDir did not return after a packet announcing 4 GiB")
			}
		}},
	})
	t.Run("request-before-init", func(t *testing.T) {
		scEachNoInit(t, func(t *testing.T, e *scEnv, c *scConn) {
			// OpenSSH exits; answering is fine too. Hanging is not.
			c.srv.mayFail = true
			id := c.send(scRealpath, ".")
			p, closed := c.recvOrClose(id)
			t.Logf("REALPATH before INIT: reply %v, closed %v", p, closed)
		})
	})
	t.Run("eof-mid-packet", func(t *testing.T) {
		scEach(t, func(t *testing.T, e *scEnv, c *scConn) {
			// The client goes away halfway through a packet: ServeDir returns.
			c.srv.mayFail = true
			raw := scFrame(scRealpath, uint32(1), ".")
			c.sendRaw(raw[:len(raw)-2])
			c.conn.Close()
			if _, ok := c.srv.wait(scTimeout); !ok {
				t.Errorf("ServeDir did not return when the client closed mid-packet")
			}
		})
	})
}

func TestSFTPConformanceConfinement(t *testing.T) {
	t.Run("confined", func(t *testing.T) {
		e := scNewEnv(t, "confined")
		c := scDial(t, e)
		secret := "canary-" + fmt.Sprintf("%x", scRandom(8))
		canary := filepath.Join(e.outer, "canary.txt")
		os.WriteFile(canary, []byte(secret), 0o644)
		os.MkdirAll(filepath.Join(e.outer, "secret"), 0o755)
		os.WriteFile(filepath.Join(e.outer, "secret", "inner.txt"), []byte(secret), 0o644)
		os.Mkdir(filepath.Join(e.outer, "emptydir"), 0o755)
		e.writeFile(t, "inside.txt", []byte("inside"))
		os.Symlink("/etc", filepath.Join(e.root, "esc"))
		os.Symlink(strings.Repeat("../", 32), filepath.Join(e.root, "esc2")) // up to the host's "/"
		os.Symlink("..", filepath.Join(e.root, "up"))
		e.symlink(t, "../../canary.txt", "canlink")
		e.symlink(t, canary, "abslink")
		e.symlink(t, "../../secret", "secretlink")
		outerBefore := scTree(t, e.outer, e.root)

		// leaked fails the test if b holds anything from outside the root.
		leaked := func(what string, b []byte) {
			t.Helper()
			if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte("root:x:0:0")) {
				t.Errorf("%s read a file outside the root", what)
			}
		}
		mustFail := func(p scPacket, what string) {
			t.Helper()
			switch p.typ {
			case scHandle:
				// Read (never write) what it opened, to report a leak.
				t.Errorf("%s: got a handle, want an error status", what)
				h := c.handle(p, what)
				if d := c.read(h, 0, 1<<16); d.typ == scData {
					leaked(what, c.data(d, what))
				}
				c.close(h)
			case scName:
				for _, n := range c.names(p, what) {
					if n.name == "canary.txt" || n.name == "inner.txt" || n.name == "passwd" {
						t.Errorf("%s listed %q, outside the root", what, n.name)
					}
				}
				t.Errorf("%s: got %v, want an error status", what, p)
			default:
				c.wantError(p, what)
			}
		}

		// Paths through a component that leads outside. The host's /etc
		// only gets read-only requests: a broken server must not damage the
		// host. Everything that writes targets this test's own files.
		for _, p := range []string{"/esc/passwd", "/esc2/etc/passwd", "/up/canary.txt", "/up/secret/inner.txt", "secretlink/inner.txt"} {
			mustFail(c.call(scStat, p), "STAT "+p)
			mustFail(c.call(scLstat, p), "LSTAT "+p)
			mustFail(c.open(p, scFRead, scAttr{}), "OPEN READ "+p)
			mustFail(c.call(scReadlink, p), "READLINK "+p)
			mustFail(c.ext("statvfs@openssh.com", p), "statvfs "+p)
		}
		for _, p := range []string{"/up/canary.txt", "/up/secret/inner.txt", "secretlink/inner.txt", "/up/new.txt", "secretlink/new.txt"} {
			mustFail(c.open(p, scFWrite, scAttr{}), "OPEN WRITE "+p)
			mustFail(c.open(p, scFWrite|scFCreat, scAttr{}), "OPEN WRITE|CREAT "+p)
			mustFail(c.open(p, scFWrite|scFCreat|scFTrunc, scAttr{}), "OPEN WRITE|CREAT|TRUNC "+p)
			mustFail(c.call(scSetstat, p, scAttr{flags: scASize | scAPerm, size: 0, perm: 0o600}), "SETSTAT "+p)
			mustFail(c.call(scRemove, p), "REMOVE "+p)
			mustFail(c.call(scRename, p, e.p("stolen")), "RENAME "+p+" into the root")
			mustFail(c.call(scRename, e.p("inside.txt"), p), "RENAME into "+p)
			mustFail(c.ext("posix-rename@openssh.com", e.p("inside.txt"), p), "posix-rename into "+p)
			mustFail(c.ext("hardlink@openssh.com", p, e.p("hl")), "hardlink of "+p)
			mustFail(c.ext("hardlink@openssh.com", e.p("inside.txt"), p), "hardlink into "+p)
			mustFail(c.call(scSymlink, "x", p), "SYMLINK at "+p)
			mustFail(c.call(scMkdir, p, scAttr{}), "MKDIR "+p)
		}
		for _, p := range []string{"/esc", "/esc2", "/up", "/up/secret", "secretlink", "/esc2/etc", "/up/emptydir"} {
			mustFail(c.call(scOpendir, p), "OPENDIR "+p)
			mustFail(c.call(scStat, p), "STAT "+p)
		}
		mustFail(c.call(scRmdir, "/up/emptydir"), "RMDIR /up/emptydir")
		mustFail(c.call(scMkdir, "/up/newdir", scAttr{}), "MKDIR /up/newdir")
		// Leaf links pointing outside: following them fails.
		for _, p := range []string{"canlink", "abslink"} {
			mustFail(c.call(scStat, p), "STAT "+p)
			mustFail(c.open(p, scFRead, scAttr{}), "OPEN READ "+p)
			mustFail(c.open(p, scFWrite, scAttr{}), "OPEN WRITE "+p)
			mustFail(c.open(p, scFWrite|scFTrunc, scAttr{}), "OPEN WRITE|TRUNC "+p)
			mustFail(c.call(scSetstat, p, scAttr{flags: scASize | scAPerm, size: 0, perm: 0o600}), "SETSTAT "+p)
		}
		// ".." stops at the root: these name missing files inside it.
		for _, p := range []string{"../../canary.txt", "/../canary.txt", "/../../etc/passwd", "/home/../../../canary.txt"} {
			c.wantStatus(c.call(scStat, p), "STAT "+p, scNoSuchFile)
			c.wantStatus(c.open(p, scFRead, scAttr{}), "OPEN READ "+p, scNoSuchFile)
		}
		h := c.handle(c.call(scOpendir, "/.."), "OPENDIR /..")
		entries, _ := c.readDir(h)
		c.mustClose(h)
		if !slices.ContainsFunc(entries, func(n scNameEntry) bool { return n.name == "home" }) ||
			slices.ContainsFunc(entries, func(n scNameEntry) bool { return n.name == "canary.txt" || n.name == "root" }) {
			t.Errorf("OPENDIR /.. must list the root (home, esc, ...), lists %v", entries)
		}
		// A client may create a link pointing outside (stored as given) but
		// not follow it.
		for target, follow := range map[string]string{"/etc": "mine/passwd", strings.Repeat("../", 32): "mine/etc/passwd", "../../canary.txt": "mine"} {
			c.call(scRemove, e.p("mine"))
			c.wantOK(c.call(scSymlink, target, e.p("mine")), "SYMLINK "+target+" mine")
			if got := c.oneName(c.call(scReadlink, e.p("mine")), "READLINK mine"); got != target {
				t.Errorf("READLINK of a link to %q = %q", target, got)
			}
			mustFail(c.open(follow, scFRead, scAttr{}), "OPEN READ "+follow+" (mine -> "+target+")")
			mustFail(c.call(scStat, follow), "STAT "+follow+" (mine -> "+target+")")
			mustFail(c.call(scOpendir, "mine"), "OPENDIR mine (mine -> "+target+")")
		}
		// What the server holds: REALPATH never leaves "/".
		if got := c.oneName(c.call(scRealpath, "/.."), "REALPATH /.."); got != "/" {
			t.Errorf("REALPATH /.. = %q, want /", got)
		}

		// Outside the root nothing changed and nothing appeared.
		if got, _ := os.ReadFile(canary); string(got) != secret {
			t.Errorf("the canary outside the root now holds %q", got)
		}
		if st := scLstatDisk(t, canary); st.Mode&0o7777 != 0o644 {
			t.Errorf("the canary's mode changed to %#o", st.Mode&0o7777)
		}
		if after := scTree(t, e.outer, e.root); !slices.Equal(after, outerBefore) {
			t.Errorf("outside the root: before %q, after %q", outerBefore, after)
		}
		for _, p := range []string{"/etc/sandgate-conformance-new", "/etc/x"} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s appeared on the host", p)
			}
		}
	})
	t.Run("host-absolute-symlinks", func(t *testing.T) {
		e := scNewEnv(t, "host")
		c := scDial(t, e)
		e.writeFile(t, "target.txt", []byte("through an absolute link"))
		e.symlink(t, e.disk("target.txt"), "abs")
		e.symlink(t, "/etc", "etc")
		h := c.mustOpen(e.p("abs"), scFRead, scAttr{})
		if got := c.readAll(h); string(got) != "through an absolute link" {
			t.Errorf("read through an absolute symlink: %q", got)
		}
		c.mustClose(h)
		if a := c.mustStat(scStat, e.p("abs")); a.size != uint64(len("through an absolute link")) {
			t.Errorf("STAT through an absolute symlink: %v", a)
		}
		h = c.handle(c.call(scOpendir, e.p("etc")), "OPENDIR of a link to /etc")
		entries, _ := c.readDir(h)
		c.mustClose(h)
		if len(entries) < 3 {
			t.Errorf("OPENDIR of a link to /etc: %d entries", len(entries))
		}
		if got := c.oneName(c.call(scRealpath, e.start+"/.."), "REALPATH .."); got != filepath.Dir(e.base) {
			t.Errorf("host mode REALPATH %s/.. = %q, want %q", e.base, got, filepath.Dir(e.base))
		}
	})
}

// scTree lists dir recursively (names, sizes and modes), skipping skip.
func scTree(t *testing.T, dir, skip string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			out = append(out, "root/")
			return filepath.SkipDir
		}
		out = append(out, fmt.Sprintf("%s %v %d", strings.TrimPrefix(p, dir), info.Mode(), info.Size()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSFTPConformanceHandles(t *testing.T) {
	scCases(t, []scCase{
		{"many-handles", func(t *testing.T, e *scEnv, c *scConn) {
			e.writeFile(t, "f", []byte("x"))
			e.mkdir(t, "d")
			limit := uint64(0)
			if c.has("limits@openssh.com") {
				_, _, _, limit, _ = c.limits()
			}
			n := 200
			small := limit > 0 && limit < 1000
			if small {
				n = int(limit)
			}
			seen := map[string]bool{}
			var handles []string
			for i := range n {
				var h string
				if i%4 == 3 {
					h = c.handle(c.call(scOpendir, e.p("d")), fmt.Sprintf("OPENDIR #%d", i))
				} else {
					h = c.mustOpen(e.p("f"), scFRead, scAttr{})
				}
				if seen[h] {
					t.Fatalf("handle %q handed out twice while open", h)
				}
				seen[h] = true
				handles = append(handles, h)
			}
			if small {
				// One more than advertised: a clean status, not a crash.
				p := c.open(e.p("f"), scFRead, scAttr{})
				if p.typ == scHandle {
					t.Errorf("opened %d handles, one more than the advertised %d", n+1, limit)
					handles = append(handles, c.handle(p, "OPEN"))
				} else {
					c.wantError(p, fmt.Sprintf("OPEN beyond the %d advertised handles", limit))
					c.mustClose(handles[0])
					handles[0] = c.mustOpen(e.p("f"), scFRead, scAttr{}) // freed by CLOSE
				}
			}
			for i, h := range handles {
				if i%4 != 3 {
					if got := c.data(c.read(h, 0, 1), "READ on one of many handles"); string(got) != "x" {
						t.Errorf("READ on handle %d: %q", i, got)
					}
				}
			}
			for _, h := range handles {
				c.mustClose(h)
			}
			for _, h := range handles[:10] {
				c.wantError(c.close(h), "CLOSE of an already closed handle")
			}
			c.mustClose(c.mustOpen(e.p("f"), scFRead, scAttr{}))
		}},
	})
}

func TestSFTPConformanceConcurrency(t *testing.T) {
	for _, mode := range scModes {
		t.Run(mode, func(t *testing.T) {
			e := scNewEnv(t, mode)
			cl := scClient(t, e, sftp.UseConcurrentWrites(true), sftp.UseConcurrentReads(true), sftp.MaxConcurrentRequestsPerFile(64))
			data := scRandom(32 << 20)
			f, err := cl.Create(e.p("big"))
			if err != nil {
				t.Fatal(err)
			}
			if n, err := f.ReadFrom(bytes.NewReader(data)); err != nil || n != int64(len(data)) {
				t.Fatalf("File.ReadFrom (concurrent writes): %d, %v", n, err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if got := e.readFile(t, "big"); !bytes.Equal(got, data) {
				t.Fatalf("after a concurrent upload of 32 MiB: %d bytes on disk, equal %v", len(got), bytes.Equal(got, data))
			}
			// Several concurrent downloads of the same file.
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i := range errs {
				wg.Go(func() {
					f, err := cl.Open(e.p("big"))
					if err != nil {
						errs[i] = err
						return
					}
					defer f.Close()
					var buf bytes.Buffer
					if _, err := f.WriteTo(&buf); err != nil {
						errs[i] = fmt.Errorf("File.WriteTo: %w", err)
					} else if !bytes.Equal(buf.Bytes(), data) {
						errs[i] = fmt.Errorf("download %d: %d bytes, equal %v", i, buf.Len(), bytes.Equal(buf.Bytes(), data))
					}
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func TestSFTPConformanceClient(t *testing.T) {
	for _, mode := range scModes {
		t.Run(mode, func(t *testing.T) {
			e := scNewEnv(t, mode)
			cl := scClient(t, e)
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			wd, err := cl.Getwd()
			must("Getwd", err)
			if wd != e.start {
				t.Errorf("Getwd = %q, want the start dir %q", wd, e.start)
			}
			f, err := cl.Create("a.txt") // relative to the start dir
			must("Create", err)
			_, err = f.Write([]byte("hello"))
			must("Write", err)
			must("Close", f.Close())
			if got := e.readFile(t, "a.txt"); string(got) != "hello" {
				t.Errorf("a.txt holds %q", got)
			}
			must("Mkdir", cl.Mkdir(e.p("d")))
			must("Rename", cl.Rename(e.p("a.txt"), e.p("d/b.txt")))
			must("Symlink", cl.Symlink("d/b.txt", e.p("link")))
			if got, err := os.Readlink(e.disk("link")); err != nil || got != "d/b.txt" {
				t.Errorf("Client.Symlink(target, link): link -> %q (%v)", got, err)
			}
			if got, err := cl.ReadLink(e.p("link")); err != nil || got != "d/b.txt" {
				t.Errorf("ReadLink = %q, %v", got, err)
			}
			must("Chmod", cl.Chmod(e.p("d/b.txt"), 0o600))
			mt := time.Unix(1234567890, 0)
			must("Chtimes", cl.Chtimes(e.p("d/b.txt"), mt, mt))
			st, err := cl.Stat(e.p("link"))
			must("Stat", err)
			if st.Size() != 5 || st.Mode() != 0o600 || !st.ModTime().Equal(mt) {
				t.Errorf("Stat through a link: size %d mode %v mtime %v", st.Size(), st.Mode(), st.ModTime())
			}
			lst, err := cl.Lstat(e.p("link"))
			must("Lstat", err)
			if lst.Mode()&os.ModeSymlink == 0 {
				t.Errorf("Lstat of a link: mode %v", lst.Mode())
			}
			must("Link", cl.Link(e.p("d/b.txt"), e.p("hard")))
			must("Truncate", cl.Truncate(e.p("hard"), 2))
			if got := e.readFile(t, "d/b.txt"); string(got) != "he" {
				t.Errorf("truncate through a hard link: %q", got)
			}
			infos, err := cl.ReadDir(e.p("."))
			must("ReadDir", err)
			var names []string
			for _, fi := range infos {
				names = append(names, fi.Name())
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{"d", "hard", "link"}) {
				t.Errorf("ReadDir = %q, want d hard link", names)
			}
			vfs, err := cl.StatVFS(e.start)
			must("StatVFS", err)
			if vfs.Bsize == 0 {
				t.Errorf("StatVFS: %+v", vfs)
			}
			if err := cl.Rename(e.p("link"), e.p("hard")); err == nil {
				t.Errorf("Rename onto an existing file succeeded (SFTP v3 forbids it)")
			}
			must("PosixRename", cl.PosixRename(e.p("link"), e.p("hard")))
			if _, err := cl.Stat(e.p("missing")); !os.IsNotExist(err) {
				t.Errorf("Stat of a missing file: %v, want not-exist", err)
			}
			if _, err := cl.Open(e.p("missing")); !os.IsNotExist(err) {
				t.Errorf("Open of a missing file: %v, want not-exist", err)
			}
			must("Remove", cl.Remove(e.p("hard")))
			must("Remove", cl.Remove(e.p("d/b.txt")))
			must("RemoveDirectory", cl.RemoveDirectory(e.p("d")))
			f, err = cl.OpenFile(e.p("sync.txt"), os.O_WRONLY|os.O_CREATE)
			must("OpenFile", err)
			_, err = f.Write([]byte("x"))
			must("Write", err)
			if err := f.Sync(); err != nil { // needs the new server: fsync@openssh.com
				t.Errorf("File.Sync (fsync@openssh.com): %v", err)
			}
			must("Close", f.Close())
			rf, err := cl.Open(e.p("sync.txt"))
			must("Open", err)
			b, _ := io.ReadAll(rf)
			rf.Close()
			if string(b) != "x" {
				t.Errorf("read back %q", b)
			}
		})
	}
}

func TestSFTPConformanceOpenSSH(t *testing.T) {
	sftpPath := gwtest.RequireTool(t, "sftp")
	bin := scSandgateBinary(t)
	for _, mode := range scModes {
		t.Run(mode, func(t *testing.T) {
			newEnv := func(t *testing.T) (*scEnv, *scOpenSSH) {
				e := scNewEnv(t, mode)
				o := &scOpenSSH{sftp: sftpPath, bin: bin, root: e.root, start: e.start, local: t.TempDir()}
				if e.confined() {
					o.start = "/" // --root DIR --start /
				}
				return e, o
			}
			// remote is the absolute path sftp uses for name.
			remote := func(e *scEnv, name string) string { return e.p(name) }

			t.Run("put-get", func(t *testing.T) {
				e, o := newEnv(t)
				data := scRandom(5<<20 + 12345)
				local := filepath.Join(o.local, "local.bin")
				os.WriteFile(local, data, 0o644)
				o.mustRun(t, fmt.Sprintf("put %s %s\nget %s back.bin\n", local, remote(e, "up.bin"), remote(e, "up.bin")))
				if got := e.readFile(t, "up.bin"); !bytes.Equal(got, data) {
					t.Errorf("put: %d bytes on the server, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
				}
				if got, _ := os.ReadFile(filepath.Join(o.local, "back.bin")); !bytes.Equal(got, data) {
					t.Errorf("get: %d bytes back, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
				}
			})
			t.Run("ls-l", func(t *testing.T) {
				e, o := newEnv(t)
				e.writeFile(t, "file.txt", make([]byte, 1234))
				os.Chmod(e.disk("file.txt"), 0o644)
				e.mkdir(t, "sub")
				e.symlink(t, "file.txt", "ln")
				out := o.mustRun(t, "ls -l "+remote(e, "")+"\n")
				// With users-groups-by-id@openssh.com the client lays the
				// lines out itself from the attributes, as against OpenSSH's
				// own server: "?" for the link count and full paths.
				for name, re := range map[string]string{
					"file.txt": `(?m)^-rw-r--r--\s+(\d+|\?)\s+\S+\s+\S+\s+1234\s.*[\s/]file\.txt$`,
					"sub":      `(?m)^d[-rwxsStT]{9}\s.*[\s/]sub$`,
					"ln":       `(?m)^l[-rwxsStT]{9}\s.*[\s/]ln( -> file\.txt)?$`,
				} {
					if !regexp.MustCompile(re).MatchString(out) {
						t.Errorf("ls -l: no line for %s matching %s\nfull output:\n%s", name, re, out)
					}
				}
			})
			t.Run("file-ops", func(t *testing.T) {
				e, o := newEnv(t)
				local := filepath.Join(o.local, "local.txt")
				os.WriteFile(local, []byte("content"), 0o644)
				e.writeFile(t, "gone.txt", nil)
				e.mkdir(t, "empty")
				o.mustRun(t, strings.Join([]string{
					"mkdir " + remote(e, "d"),
					"put " + local + " " + remote(e, "d/x.txt"),
					"rename " + remote(e, "d/x.txt") + " " + remote(e, "d/y.txt"),
					"ln -s d/y.txt " + remote(e, "link"),
					"ln " + remote(e, "d/y.txt") + " " + remote(e, "hard"),
					"chmod 600 " + remote(e, "d/y.txt"),
					"rm " + remote(e, "gone.txt"),
					"rmdir " + remote(e, "empty"),
				}, "\n")+"\n")
				if got := e.readFile(t, "d/y.txt"); string(got) != "content" {
					t.Errorf("d/y.txt holds %q", got)
				}
				if st := scLstatDisk(t, e.disk("d/y.txt")); st.Mode&0o7777 != 0o600 {
					t.Errorf("chmod 600: mode %#o", st.Mode&0o7777)
				}
				if got, err := os.Readlink(e.disk("link")); err != nil || got != "d/y.txt" {
					t.Errorf("ln -s: link -> %q (%v)", got, err)
				}
				a, _ := os.Stat(e.disk("d/y.txt"))
				if b, err := os.Stat(e.disk("hard")); err != nil || !os.SameFile(a, b) {
					t.Errorf("ln (hardlink@openssh.com): hard is not d/y.txt (%v)", err)
				}
				for _, gone := range []string{"gone.txt", "empty", "d/x.txt"} {
					if _, err := os.Lstat(e.disk(gone)); err == nil {
						t.Errorf("%s still exists", gone)
					}
				}
				// A failing command fails the batch.
				if _, _, err := o.run(t, "rmdir "+remote(e, "d")+"\n"); err == nil {
					t.Errorf("sftp -b: rmdir of a non-empty dir succeeded")
				}
			})
			t.Run("df", func(t *testing.T) {
				e, o := newEnv(t)
				out := o.mustRun(t, "df "+remote(e, "")+"\ndf -i "+remote(e, "")+"\n")
				if !regexp.MustCompile(`(?m)^\s*Size\s+Used\s+Avail`).MatchString(out) ||
					!regexp.MustCompile(`(?m)^\s*\d+\s+\d+\s+\d+\s+\d+\s+\d+%`).MatchString(out) {
					t.Errorf("df (statvfs@openssh.com) output:\n%s", out)
				}
			})
			t.Run("reput-reget", func(t *testing.T) {
				e, o := newEnv(t)
				data := scRandom(3<<20 + 777)
				local := filepath.Join(o.local, "full.bin")
				os.WriteFile(local, data, 0o644)
				e.writeFile(t, "part.bin", data[:1<<20])
				e.writeFile(t, "full.bin", data)
				os.WriteFile(filepath.Join(o.local, "back.bin"), data[:1<<20+5], 0o644)
				o.mustRun(t, fmt.Sprintf("reput %s %s\nreget %s back.bin\n", local, remote(e, "part.bin"), remote(e, "full.bin")))
				if got := e.readFile(t, "part.bin"); !bytes.Equal(got, data) {
					t.Errorf("reput: %d bytes on the server, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
				}
				if got, _ := os.ReadFile(filepath.Join(o.local, "back.bin")); !bytes.Equal(got, data) {
					t.Errorf("reget: %d bytes, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
				}
			})
			t.Run("pwd-and-extensions", func(t *testing.T) { // needs the new server (fstatvfs, fsync, limits)
				e, o := newEnv(t)
				out, errOut, err := o.run(t, "pwd\n", "-vvv")
				if err != nil {
					t.Fatalf("sftp -vvv: %v\n%s\n%s", err, out, errOut)
				}
				if want := "Remote working directory: " + o.start; !strings.Contains(out, want+"\n") {
					t.Errorf("pwd: %q, want %q", out, want)
				}
				for _, ext := range []string{"posix-rename@openssh.com", "statvfs@openssh.com", "fstatvfs@openssh.com",
					"hardlink@openssh.com", "fsync@openssh.com", "limits@openssh.com"} {
					if !strings.Contains(errOut, `Server supports extension "`+ext+`"`) {
						t.Errorf("sftp -vvv: the server does not announce %s", ext)
					}
				}
				_ = e
			})
		})
	}
}

// TestSFTPConformancePermissions runs `sandgate sftp-server` as an
// unprivileged user (as in a sandbox) on files it may not touch: the
// errors are SSH_FX_PERMISSION_DENIED. Needs root, to switch to nobody.
func TestSFTPConformancePermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the server as another user (TestSFTPConformanceOpen/permission-denied covers the rest)")
	}
	const nobody = 65534
	// nobody must reach the binary and the trees: not under t.TempDir (0700).
	shared, err := os.MkdirTemp("", "sftp-conformance-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	os.Chmod(shared, 0o755)
	built, err := os.ReadFile(scSandgateBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(shared, "sandgate")
	if err := os.WriteFile(bin, built, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range scModes {
		t.Run(mode, func(t *testing.T) {
			dir := filepath.Join(shared, mode)
			e := &scEnv{mode: mode, root: "/", start: filepath.Join(dir, "base"), base: filepath.Join(dir, "base")}
			if mode == "confined" {
				e = &scEnv{mode: mode, root: filepath.Join(dir, "root"), start: "/home", base: filepath.Join(dir, "root", "home"), outer: dir}
			}
			if err := os.MkdirAll(e.base, 0o755); err != nil {
				t.Fatal(err)
			}
			e.writeFile(t, "secret", []byte("root only"))
			os.Chmod(e.disk("secret"), 0o600)
			e.writeFile(t, "readonly", []byte("everyone reads"))
			e.mkdir(t, "private")
			os.Chmod(e.disk("private"), 0o700)
			e.mkdir(t, "mine")
			os.Chown(e.disk("mine"), nobody, nobody)

			c := scConnect(t, scStartProcess(t, bin, e.root, e.start, &syscall.Credential{Uid: nobody, Gid: nobody}))
			c.handshake(3)
			denied := func(p scPacket, what string) {
				t.Helper()
				c.wantStatus(p, what+" (as nobody)", scPermDenied)
			}
			denied(c.open(e.p("secret"), scFRead, scAttr{}), "OPEN READ of a root-only file")
			denied(c.open(e.p("readonly"), scFWrite, scAttr{}), "OPEN WRITE of a read-only file")
			denied(c.open(e.p("new"), scFWrite|scFCreat, scAttr{}), "OPEN CREAT in a dir owned by root")
			denied(c.call(scMkdir, e.p("newdir"), scAttr{}), "MKDIR in a dir owned by root")
			denied(c.call(scRemove, e.p("readonly")), "REMOVE in a dir owned by root")
			denied(c.call(scRename, e.p("readonly"), e.p("moved")), "RENAME in a dir owned by root")
			denied(c.call(scSetstat, e.p("readonly"), scPerm(0o666)), "SETSTAT perm of root's file")
			denied(c.call(scOpendir, e.p("private")), "OPENDIR of a mode-0700 dir owned by root")
			denied(c.call(scStat, e.p("private/x")), "STAT inside a mode-0700 dir owned by root")

			h := c.mustOpen(e.p("readonly"), scFRead, scAttr{})
			if got := c.readAll(h); string(got) != "everyone reads" {
				t.Errorf("read of a world-readable file: %q", got)
			}
			c.mustClose(h)
			h = c.mustOpen(e.p("mine/new"), scFWrite|scFCreat, scAttr{})
			c.mustWrite(h, 0, []byte("x"))
			c.mustClose(h)
			if st := scLstatDisk(t, e.disk("mine/new")); st.Uid != nobody {
				t.Errorf("a file the server created belongs to uid %d, want %d (the server's user)", st.Uid, nobody)
			}
			if got := e.readFile(t, "secret"); string(got) != "root only" {
				t.Errorf("root-only file changed: %q", got)
			}
		})
	}
}
