//go:build linux

package sftpd

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

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

	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// A child's standard output is a pipe in blocking mode; Fd makes it so.
	_ = outW.Fd()
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
	if sp.sent < size {
		t.Errorf("%d bytes spliced, want at least the file's %d", sp.sent, size)
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
