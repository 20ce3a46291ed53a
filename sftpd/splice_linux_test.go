//go:build linux

package sftpd

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pkg/sftp"
)

// TestReadSplice reads a file over real pipes, where READs of spliceMin
// bytes and more are spliced: every size and offset, EOF and past it, must
// give the file's bytes, as the read(2) path does, and nothing may be left
// open after the session.
func TestReadSplice(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20+12345)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	fds := openFDs(t)

	reqR, reqW, outR, outW := serverPipes(t)
	s := newServer(reqR, outW, Options{Root: root})
	sp := s.splice
	if sp == nil {
		t.Fatal("no splicer for a pipe in blocking mode")
	}
	done := make(chan error, 1)
	go func() {
		err := s.run()
		outW.Close()
		reqR.Close()
		done <- err
	}()

	c, err := sftp.NewClientPipe(outR, reqW, sftp.MaxPacketUnchecked(maxData))
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Open("/f")
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(data))
	for _, n := range []int{spliceMin - 1, spliceMin, 32 << 10, 100000, maxData, 3 * maxData} {
		for _, off := range []int64{0, 1, 4095, 3*4096 + 7, size - 1000, size - 1, size, size + 5} {
			buf := make([]byte, n)
			got, err := f.ReadAt(buf, off)
			want := data[min(off, size):min(off+int64(n), size)]
			if got != len(want) || !bytes.Equal(buf[:got], want) {
				t.Fatalf("ReadAt(%d bytes, at %d): %d bytes (err %v), want the file's %d", n, off, got, err, len(want))
			}
			if len(want) < n && !errors.Is(err, io.EOF) {
				t.Fatalf("ReadAt(%d bytes, at %d) past the end: err %v, want EOF", n, off, err)
			}
		}
	}
	// The whole file, as OpenSSH's sftp reads it: many requests in flight.
	var all bytes.Buffer
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteTo(&all); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all.Bytes(), data) {
		t.Fatalf("whole file: %d bytes, not the file's %d", all.Len(), len(data))
	}
	f.Close()
	// A handle open for writing only fails a READ the same way, spliced
	// or read.
	w, err := c.OpenFile("/f", os.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	var errs [2]error
	for i, n := range []int{spliceMin - 1, spliceMin} {
		if _, errs[i] = w.ReadAt(make([]byte, n), 0); errs[i] == nil {
			t.Fatalf("READ of %d bytes on a write-only handle succeeded", n)
		}
	}
	if errs[0].Error() != errs[1].Error() {
		t.Errorf("READ on a write-only handle: %v read, %v spliced; want one answer", errs[0], errs[1])
	}
	w.Close()
	c.Close()
	reqW.Close()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	outR.Close()
	if sp.sent.Load() < size {
		t.Errorf("%d bytes spliced, want at least the file's %d", sp.sent.Load(), size)
	}
	if after := openFDs(t); after != fds {
		t.Errorf("%d descriptors open after the session, %d before", after, fds)
	}
}

// TestNoSplicer: outputs splice(2) cannot serve get no splicer.
func TestNoSplicer(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// os.Pipe leaves w non-blocking until Fd is called.
	if sp := newSplicer(w); sp != nil {
		sp.close()
		t.Error("a splicer for a non-blocking pipe")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "file"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if sp := newSplicer(f); sp != nil {
		sp.close()
		t.Error("a splicer for a regular file")
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// pipeServer is Serve on real pipes, its output in blocking mode (so that
// READs splice), driven by hand-built packets.
type pipeServer struct {
	t     *testing.T
	req   *os.File // the client's end of the requests
	out   *os.File // the client's end of the replies
	sp    *splicer
	done  chan error
	ended bool
}

// serverPipes returns the requests' pipe and the replies' pipe, the
// replies' write end in blocking mode as a child's standard output is (Fd
// makes it so).
func serverPipes(t *testing.T) (reqR, reqW, outR, outW *os.File) {
	t.Helper()
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err = os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = outW.Fd()
	return reqR, reqW, outR, outW
}

func startPipeServer(t *testing.T, opts Options) *pipeServer {
	t.Helper()
	reqR, reqW, outR, outW := serverPipes(t)
	s := newServer(reqR, outW, opts)
	if s.splice == nil {
		t.Fatal("no splicer for a pipe in blocking mode")
	}
	p := &pipeServer{t: t, req: reqW, out: outR, sp: s.splice, done: make(chan error, 1)}
	go func() {
		err := s.run()
		outW.Close()
		reqR.Close()
		p.done <- err
	}()
	t.Cleanup(func() { p.end() })
	p.send(encoder{}.byte(fxpInit).uint32(3))
	if typ, _, _ := p.recv(); typ != fxpVersion {
		t.Fatalf("INIT answered with type %d", typ)
	}
	return p
}

func (p *pipeServer) end() {
	if p.ended {
		return
	}
	p.ended = true
	p.req.Close()
	_, _ = io.Copy(io.Discard, p.out)
	if err := <-p.done; err != nil {
		p.t.Errorf("Serve: %v", err)
	}
	p.out.Close()
}

// send writes the packets, each framed, in one write.
func (p *pipeServer) send(pkts ...encoder) {
	p.t.Helper()
	var b encoder
	for _, pk := range pkts {
		b = b.uint32(uint32(len(pk)))
		b = append(b, pk...)
	}
	if _, err := p.req.Write(b); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pipeServer) recv() (typ byte, id uint32, body []byte) {
	p.t.Helper()
	var hdr [4]byte
	if _, err := io.ReadFull(p.out, hdr[:]); err != nil {
		p.t.Fatal(err)
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(p.out, b); err != nil {
		p.t.Fatal(err)
	}
	if b[0] == fxpVersion {
		return b[0], 0, b[1:]
	}
	return b[0], binary.BigEndian.Uint32(b[1:5]), b[5:]
}

func (p *pipeServer) open(name string, pflags uint32) []byte {
	p.t.Helper()
	p.send(encoder{}.byte(fxpOpen).uint32(1).string(name).uint32(pflags).uint32(0))
	typ, _, body := p.recv()
	if typ != fxpHandle {
		p.t.Fatalf("OPEN %s: reply type %d", name, typ)
	}
	d := &decoder{b: body}
	return d.bytes()
}

func readReq(id uint32, h []byte, off uint64, n uint32) encoder {
	return encoder{}.byte(fxpRead).uint32(id).string(string(h)).uint64(off).uint32(n)
}

// data is a DATA reply's bytes.
func data(t *testing.T, typ byte, body []byte) []byte {
	t.Helper()
	if typ != fxpData {
		t.Fatalf("reply type %d, want DATA", typ)
	}
	d := &decoder{b: body}
	return d.bytes()
}

// TestSplicedReadsInRequestOrder: a READ's spliced reply must not show a
// WRITE or a truncation that came after it, even when the reply sits in
// the output until the client reads it; and replies keep request order.
func TestSplicedReadsInRequestOrder(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	old := bytes.Repeat([]byte("A"), 64<<10)
	if err := os.WriteFile(name, old, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPipeServer(t, Options{})
	h := p.open(name, fxfRead|fxfWrite)

	// READ, then WRITE over the same bytes, sent together; the output is
	// read only later.
	p.send(readReq(10, h, 0, 32<<10),
		encoder{}.byte(fxpWrite).uint32(11).string(string(h)).uint64(0).string(string(bytes.Repeat([]byte("B"), 32<<10))))
	time.Sleep(200 * time.Millisecond)
	typ, id, body := p.recv()
	if got := data(t, typ, body); id != 10 || !bytes.Equal(got, old[:32<<10]) {
		t.Fatalf("READ before a WRITE (reply %d): %q..., want the bytes before the WRITE", id, got[:min(8, len(got))])
	}
	if typ, id, _ := p.recv(); typ != fxpStatus || id != 11 {
		t.Fatalf("WRITE: reply type %d id %d", typ, id)
	}

	// READ, then a truncation to 100 bytes.
	p.send(readReq(12, h, 32<<10, 32<<10),
		encoder{}.byte(fxpFsetstat).uint32(13).string(string(h)).attrs(attrs{flags: attrSize, size: 100}))
	time.Sleep(200 * time.Millisecond)
	typ, id, body = p.recv()
	if got := data(t, typ, body); id != 12 || !bytes.Equal(got, old[32<<10:]) {
		t.Fatalf("READ before a truncation (reply %d): %d bytes, %q..., want the %d bytes before it", id, len(got), got[:min(8, len(got))], 32<<10)
	}
	if typ, id, _ := p.recv(); typ != fxpStatus || id != 13 {
		t.Fatalf("FSETSTAT: reply type %d id %d", typ, id)
	}

	// READ, then lsetstat@openssh.com truncating the file by name.
	if err := os.WriteFile(name, old, 0o644); err != nil {
		t.Fatal(err)
	}
	p.send(readReq(14, h, 0, 32<<10),
		encoder{}.byte(fxpExtended).uint32(15).string("lsetstat@openssh.com").string(name).attrs(attrs{flags: attrSize, size: 100}))
	time.Sleep(200 * time.Millisecond)
	typ, id, body = p.recv()
	if got := data(t, typ, body); id != 14 || !bytes.Equal(got, old[:32<<10]) {
		t.Fatalf("READ before an lsetstat truncation (reply %d): %d bytes, %q at 100, want the bytes before it", id, len(got), got[100:min(108, len(got))])
	}
	if typ, id, _ := p.recv(); typ != fxpStatus || id != 15 {
		t.Fatalf("lsetstat: reply type %d id %d", typ, id)
	}

	// Replies waiting to go out leave before a spliced one.
	if err := os.WriteFile(name, old, 0o644); err != nil {
		t.Fatal(err)
	}
	p.send(encoder{}.byte(fxpStat).uint32(20).string(name), readReq(21, h, 0, 32<<10), encoder{}.byte(fxpStat).uint32(22).string(name))
	for _, want := range []uint32{20, 21, 22} {
		if _, id, _ := p.recv(); id != want {
			t.Fatalf("reply for request %d, want %d", id, want)
		}
	}
	if p.sp.sent.Load() < 3*32<<10 {
		t.Errorf("%d bytes spliced, want the three READs'", p.sp.sent.Load())
	}
}

// TestSpliceFallback: files splice(2) refuses are read as before.
func TestSpliceFallback(t *testing.T) {
	p := startPipeServer(t, Options{})
	h := p.open("/proc/self/maps", fxfRead)
	p.send(readReq(2, h, 0, 64<<10))
	typ, _, body := p.recv()
	if got := data(t, typ, body); len(got) == 0 || !bytes.Contains(got, []byte("-")) {
		t.Fatalf("READ of /proc/self/maps: %q", got)
	}
	h = p.open("/dev/null", fxfRead)
	p.send(readReq(3, h, 0, 64<<10))
	if typ, id, body := p.recv(); typ != fxpStatus || id != 3 || binary.BigEndian.Uint32(body) != fxEOF {
		t.Fatalf("READ of /dev/null: reply type %d id %d, want EOF", typ, id)
	}
	// A READ the kernel's range check refuses leaves the handle spliceable.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), bytes.Repeat([]byte("x"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	h = p.open(filepath.Join(dir, "f"), fxfRead)
	p.send(readReq(4, h, 1<<63-1-1000, 32<<10))
	p.recv()
	before := p.sp.sent.Load()
	p.send(readReq(5, h, 0, 32<<10))
	typ, _, body = p.recv()
	if got := data(t, typ, body); len(got) != 32<<10 || p.sp.sent.Load() != before+32<<10 {
		t.Fatalf("READ after one at the end of the range: %d bytes, %d spliced", len(got), p.sp.sent.Load()-before)
	}
}

// TestSettleReaderGone: a request waiting for spliced bytes to be read
// ends the session, with nothing leaked, once the reader is gone.
func TestSettleReaderGone(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(name, bytes.Repeat([]byte("A"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPipeServer(t, Options{})
	h := p.open(name, fxfRead|fxfWrite)
	p.send(readReq(2, h, 0, 32<<10), encoder{}.byte(fxpWrite).uint32(3).string(string(h)).uint64(0).string("B"))
	time.Sleep(50 * time.Millisecond)
	p.ended = true
	p.out.Close()
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("Serve: %v, want nil once the reader is gone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still waiting 5s after the output's reader went away")
	}
	p.req.Close()
	if b, _ := os.ReadFile(name); b[0] != 'A' {
		t.Error("the WRITE behind the unread READ was applied")
	}
}
