package audit

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pkg/sftp"

	"github.com/sandgate/sandgate/sftpd"
)

// tee shows each write to tap before passing it on, as sshd does.
type tee struct {
	tap func([]byte)
	w   io.WriteCloser
}

func (t tee) Write(p []byte) (int, error) { t.tap(p); return t.w.Write(p) }
func (t tee) Close() error                { return t.w.Close() }

// TestSFTPTap runs a real SFTP client against sandgate's SFTP server with
// the tap between them and checks what it reports.
func TestSFTPTap(t *testing.T) {
	root := t.TempDir()
	var mu sync.Mutex
	var events []Event
	tap := NewSFTPTap(func(e Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	c2s, toServer := io.Pipe() // client -> server
	fromServer, s2c := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- sftpd.ServeDir(root, struct {
			io.Reader
			io.WriteCloser
		}{c2s, tee{tap.Server, s2c}})
		s2c.Close()
	}()
	c, err := sftp.NewClientPipe(fromServer, tee{tap.Client, toServer})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 300000)
	f, err := c.Create("a.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	f.Close()
	g, err := c.Open("a.bin")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := io.Copy(io.Discard, g); n != int64(len(data)) {
		t.Fatalf("read %d bytes", n)
	}
	g.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Mkdir("d"))
	must(c.Rename("a.bin", "d/b.bin"))
	must(c.PosixRename("d/b.bin", "d/c.bin"))
	must(c.Symlink("d/c.bin", "link"))
	must(c.Chmod("d/c.bin", 0o600))
	must(c.Remove("link"))
	// Reads of metadata.
	_, err = c.Stat("d/c.bin")
	must(err)
	if _, err := c.Lstat("nope"); err == nil {
		t.Fatal("stat of a missing file")
	}
	_, err = c.ReadDir("d")
	must(err)
	if _, err := c.ReadDir("nodir"); err == nil {
		t.Fatal("listed a missing directory")
	}
	must(c.Symlink("d/c.bin", "l2"))
	target, err := c.ReadLink("l2")
	must(err)
	real, err := c.RealPath("d/../d")
	must(err)
	if _, err := c.Open("missing"); err == nil {
		t.Fatal("opened a missing file")
	}
	open, err := c.Create("left-open")
	must(err)
	_, err = open.Write([]byte("abc"))
	must(err)
	c.Close()
	toServer.Close()
	<-served
	tap.Close()

	want := []Event{
		{Op: "write", Path: "a.bin", Result: ResultStarted}, // at the open: a crash before its close leaves this
		{Op: "write", Path: "a.bin", Bytes: 300000, Result: "ok"},
		{Op: "stat", Path: "a.bin", Result: "ok"}, // fstat of the open file (the client's io.Copy)
		{Op: "read", Path: "a.bin", Bytes: 300000, Result: "ok"},
		{Op: "mkdir", Path: "d", Result: "ok"},
		{Op: "rename", Path: "a.bin", Target: "d/b.bin", Result: "ok"},
		{Op: "rename", Path: "d/b.bin", Target: "d/c.bin", Result: "ok"},
		{Op: "symlink", Path: "link", Target: "d/c.bin", Result: "ok"},
		{Op: "setstat", Path: "d/c.bin", Result: "ok"},
		{Op: "remove", Path: "link", Result: "ok"},
		{Op: "stat", Path: "d/c.bin", Result: "ok"},
		{Op: "stat", Path: "nope", Result: "no_such_file"},
		{Op: "list", Path: "d", Result: "ok"},
		{Op: "list", Path: "nodir", Result: "no_such_file"},
		{Op: "symlink", Path: "l2", Target: "d/c.bin", Result: "ok"},
		{Op: "readlink", Path: "l2", Target: target, Result: "ok"},
		{Op: "realpath", Path: "d/../d", Target: real, Result: "ok"},
		{Op: "read", Path: "missing", Result: "no_such_file"},
		{Op: "write", Path: "left-open", Result: ResultStarted},
		{Op: "write", Path: "left-open", Bytes: 3, Result: "not_closed"},
	}
	for i := range want {
		want[i].Kind, want[i].Source = KindFile, "sftp"
	}
	if !slices.Equal(events, want) {
		t.Errorf("events:\n%s\nwant:\n%s", brief(events), brief(want))
	}
	if _, err := os.Stat(filepath.Join(root, "d", "c.bin")); err != nil {
		t.Error(err)
	}
	if target != "d/c.bin" || !strings.HasSuffix(real, "/d") {
		t.Errorf("readlink %q, realpath %q", target, real)
	}
}

// brief lists events' file fields, one a line.
func brief(es []Event) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%s %s %q %q %d %s\n", e.Kind, e.Op, e.Path, e.Target, e.Bytes, e.Result)
	}
	return b.String()
}

// FuzzSFTPTap: no input, in either direction and cut anywhere, makes the
// tap panic or hold more than its bounds.
func FuzzSFTPTap(f *testing.F) {
	f.Add([]byte{0, 0, 0, 9, 3, 0, 0, 0, 1, 0, 0, 0, 0}, []byte{0, 0, 0, 9, 102, 0, 0, 0, 1, 0, 0, 0, 1, 'h'}, 3)
	f.Add([]byte{0, 0, 0, 5, 6, 0, 0, 0, 2}, []byte{0, 0, 0, 13, 101, 0, 0, 0, 2, 0, 0, 0, 0}, 1)
	f.Fuzz(func(t *testing.T, client, server []byte, cut int) {
		tap := NewSFTPTap(func(Event) {})
		cut = max(1, cut%64+1)
		for len(client) > 0 || len(server) > 0 {
			n := min(cut, len(client))
			tap.Client(client[:n])
			client = client[n:]
			m := min(cut, len(server))
			tap.Server(server[:m])
			server = server[m:]
		}
		tap.Close()
		if len(tap.pending) > sftpMaxPending || len(tap.handles) > 0 {
			t.Fatalf("pending %d, handles %d after Close", len(tap.pending), len(tap.handles))
		}
	})
}

// BenchmarkSFTPTapStat is the tap's cost of one STAT request and its
// ATTRS reply (one event), the commonest metadata read.
func BenchmarkSFTPTapStat(b *testing.B) {
	path := "/home/sandbox/some/dir/file.txt"
	req := []byte{0, 0, 0, 0, sftpStat, 0, 0, 0, 7, 0, 0, 0, byte(len(path))}
	req = append(req, path...)
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	rep := []byte{0, 0, 0, 13, sftpAttrs, 0, 0, 0, 7, 0, 0, 0, 0} // no attributes
	events := 0
	tap := NewSFTPTap(func(Event) { events++ })
	b.ReportAllocs()
	for b.Loop() {
		tap.Client(req)
		tap.Server(rep)
	}
	if events == 0 {
		b.Fatal("no event")
	}
}

// sftpPipe runs a real SFTP client against pkg/sftp's SFTP server in
// root with tap between them; stop ends both and closes the tap. That
// server keeps any number of files open (sandgate's own stops at 512, but
// the tap does not count on the server in the sandbox being sandgate's).
func sftpPipe(t *testing.T, root string, tap *SFTPTap) (c *sftp.Client, stop func()) {
	t.Helper()
	c2s, toServer := io.Pipe()
	fromServer, s2c := io.Pipe()
	srv, err := sftp.NewServer(struct {
		io.Reader
		io.WriteCloser
	}{c2s, tee{tap.Server, s2c}}, sftp.WithServerWorkingDirectory(root))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve()
		s2c.Close()
	}()
	c, err = sftp.NewClientPipe(fromServer, tee{tap.Client, toServer})
	if err != nil {
		t.Fatal(err)
	}
	return c, func() {
		c.Close()
		toServer.Close()
		<-served
		tap.Close()
	}
}

// TestSFTPTapOverflow: past the tap's bounds (open handles, requests in
// flight, an id reused) an operation is still reported, untracked, and
// the overflow itself once.
func TestSFTPTapOverflow(t *testing.T) {
	var events []Event
	var mu sync.Mutex
	tap := NewSFTPTap(func(e Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	c, stop := sftpPipe(t, t.TempDir(), tap)
	var files []*sftp.File
	for i := range sftpMaxHandles {
		f, err := c.Create(fmt.Sprintf("f%d", i))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	f, err := c.Create("secret-exfil.txt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("exfiltrated")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, f := range files {
		f.Close()
	}
	stop()
	var got []Event
	for _, e := range events {
		if e.Op == "tap_overflow" || e.Path == "secret-exfil.txt" {
			got = append(got, e)
		}
	}
	want := []Event{
		{Kind: KindFile, Source: "sftp", Op: "tap_overflow", Result: ResultUntracked},
		{Kind: KindFile, Source: "sftp", Op: "write", Path: "secret-exfil.txt", Bytes: -1, Result: ResultUntracked},
	}
	if !slices.Equal(got, want) {
		t.Errorf("past %d open handles:\n%s\nwant:\n%s", sftpMaxHandles, brief(got), brief(want))
	}
	// Each file within the bound: started at its open, ok at its close.
	if n := len(events) - len(got); n != 2*sftpMaxHandles {
		t.Errorf("%d events of the files within the bound, want %d", n, 2*sftpMaxHandles)
	}

	// Requests in flight past the bound, and an id reused, from raw packets.
	events = nil
	tap = NewSFTPTap(func(e Event) { events = append(events, e) })
	pkt := func(typ byte, id uint32, strs ...string) []byte {
		b := []byte{0, 0, 0, 0, typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[5:], id)
		for _, s := range strs {
			b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
			b = append(b, s...)
		}
		if typ == sftpOpen {
			b = binary.BigEndian.AppendUint32(b, sftpFlagWrite)
			b = binary.BigEndian.AppendUint32(b, 0) // no attributes
		}
		binary.BigEndian.PutUint32(b, uint32(len(b)-4))
		return b
	}
	for i := range sftpMaxPending {
		tap.Client(pkt(sftpStat, uint32(i), "x"))
	}
	tap.Client(pkt(sftpOpen, 1<<20, "/secret-exfil.txt"))
	tap.Client(pkt(sftpRemove, 1<<20+1, "/evidence"))
	tap.Client(pkt(sftpMkdir, 7, "/reused")) // id 7 is a stat still in flight
	tap.Close()
	want = []Event{
		{Kind: KindFile, Source: "sftp", Op: "tap_overflow", Result: ResultUntracked},
		{Kind: KindFile, Source: "sftp", Op: "write", Path: "/secret-exfil.txt", Bytes: -1, Result: ResultUntracked},
		{Kind: KindFile, Source: "sftp", Op: "remove", Path: "/evidence", Result: ResultUntracked},
		{Kind: KindFile, Source: "sftp", Op: "stat", Path: "x", Result: ResultUntracked},
	}
	if !slices.Equal(events, want) {
		t.Errorf("past %d requests in flight:\n%s\nwant:\n%s", sftpMaxPending, brief(events), brief(want))
	}
}
