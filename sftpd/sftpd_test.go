package sftpd

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func packet(typ byte, fields ...any) []byte {
	e := encoder{}.byte(typ)
	for _, f := range fields {
		switch v := f.(type) {
		case uint32:
			e = e.uint32(v)
		case uint64:
			e = e.uint64(v)
		case string:
			e = e.string(v)
		case []byte:
			e = append(e, v...)
		}
	}
	return append(encoder{}.uint32(uint32(len(e))), e...)
}

// serveBytes runs Serve on in, confined to a fresh root, and returns what
// it wrote.
func serveBytes(t testing.TB, in []byte) ([]byte, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), bytes.Repeat([]byte("x"), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	return serveIn(t, dir, in)
}

// serveIn runs Serve on in, confined to dir, and returns what it wrote.
func serveIn(t testing.TB, dir string, in []byte) ([]byte, error) {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- Serve(bytes.NewReader(in), &out, Options{Root: root}) }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return at the end of its input")
		return nil, nil
	}
}

// replies splits a reply stream into packets.
func replies(t testing.TB, b []byte) [][]byte {
	t.Helper()
	var ps [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			t.Fatalf("trailing %d bytes", len(b))
		}
		n := binary.BigEndian.Uint32(b)
		if uint64(n)+4 > uint64(len(b)) {
			t.Fatalf("reply of %d bytes, %d left", n, len(b)-4)
		}
		ps = append(ps, b[4:4+n])
		b = b[4+n:]
	}
	return ps
}

func TestRequestsAnsweredInOrderAndBatched(t *testing.T) {
	in := packet(fxpInit, uint32(3))
	in = append(in, packet(fxpOpen, uint32(1), "/f", uint32(fxfRead), uint32(0))...)
	in = append(in, packet(fxpRead, uint32(2), "1", uint64(90), uint32(100))...)
	in = append(in, packet(fxpRead, uint32(3), "1", uint64(100), uint32(100))...)
	in = append(in, packet(fxpRead, uint32(4), "nope", uint64(0), uint32(1))...)
	in = append(in, packet(99, uint32(5))...)
	in = append(in, packet(fxpExtended, uint32(6), "limits@openssh.com")...)
	in = append(in, packet(fxpOpen, uint32(7), "/../../etc/passwd", uint32(fxfRead), uint32(0))...)
	in = append(in, packet(fxpOpen, uint32(8))...) // truncated
	out, err := serveBytes(t, in)
	if err != nil {
		t.Fatal(err)
	}
	ps := replies(t, out)
	if len(ps) != 9 {
		t.Fatalf("%d replies, want 9", len(ps))
	}
	want := []struct {
		typ  byte
		code uint32 // status code, for status replies
	}{{fxpVersion, 0}, {fxpHandle, 0}, {fxpData, 0}, {fxpStatus, fxEOF}, {fxpStatus, fxFailure},
		{fxpStatus, fxOpUnsupported}, {fxpExtendedReply, 0}, {fxpStatus, fxNoSuchFile}, {fxpStatus, fxBadMessage}}
	for i, w := range want {
		p := ps[i]
		if p[0] != w.typ {
			t.Fatalf("reply %d: type %d, want %d", i, p[0], w.typ)
		}
		if i > 0 && binary.BigEndian.Uint32(p[1:]) != uint32(i) {
			t.Fatalf("reply %d: id %d", i, binary.BigEndian.Uint32(p[1:]))
		}
		if w.typ == fxpStatus && binary.BigEndian.Uint32(p[5:]) != w.code {
			t.Fatalf("reply %d: status %d, want %d", i, binary.BigEndian.Uint32(p[5:]), w.code)
		}
	}
	if n := binary.BigEndian.Uint32(ps[2][5:]); n != 10 {
		t.Fatalf("short read at the end: %d bytes, want 10", n)
	}
	d := &decoder{b: ps[6][5:]}
	if pk, rd, wr, h := d.uint64(), d.uint64(), d.uint64(), d.uint64(); pk != maxPacket || rd != maxData || wr != maxData || h != maxHandles {
		t.Fatalf("limits %d %d %d %d", pk, rd, wr, h)
	}
}

func TestOversizedPacketEndsTheSession(t *testing.T) {
	in := packet(fxpInit, uint32(3))
	in = append(in, encoder{}.uint32(maxPacket+1).byte(fxpWrite)...)
	if _, err := serveBytes(t, in); err == nil {
		t.Fatal("Serve accepted a packet over the limit")
	}
}

func TestModeString(t *testing.T) {
	for v, want := range map[uint32]string{
		sIFREG | 0o644:  "-rw-r--r--",
		sIFDIR | 0o755:  "drwxr-xr-x",
		sIFLNK | 0o777:  "lrwxrwxrwx",
		sIFREG | 0o4755: "-rwsr-xr-x",
		sIFDIR | 0o1777: "drwxrwxrwt",
		sIFREG | 0o2640: "-rw-r-S---",
	} {
		if got := modeString(v); got != want {
			t.Errorf("modeString(%o) = %q, want %q", v, got, want)
		}
	}
}

// FuzzServe feeds arbitrary requests after INIT: the server must neither
// panic nor hang, and what it writes must be well-formed packets.
func FuzzServe(f *testing.F) {
	f.Add(packet(fxpOpen, uint32(1), "/f", uint32(fxfRead), uint32(0)))
	f.Add(packet(fxpExtended, uint32(1), "posix-rename@openssh.com", "/f", "/g"))
	f.Add(packet(fxpSetstat, uint32(1), "/f", uint32(attrSize|attrExtended), uint64(5), uint32(1), "a", "b"))
	f.Add(packet(fxpOpendir, uint32(1), "/"))
	f.Fuzz(func(t *testing.T, req []byte) {
		in := append(packet(fxpInit, uint32(3)), req...)
		out, _ := serveBytes(t, in)
		replies(t, out)
	})
}

// statusOf returns the status code of a STATUS reply (or 255 for another type).
func statusOf(p []byte) uint32 {
	if p[0] != fxpStatus {
		return 255
	}
	return binary.BigEndian.Uint32(p[5:])
}

// TestFIFODoesNotStall: requests that touch a FIFO fail or succeed at once;
// none may block the single-threaded server (review finding).
func TestFIFODoesNotStall(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "p"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := packet(fxpInit, uint32(3))
	in = append(in, packet(fxpExtended, uint32(1), "statvfs@openssh.com", "/p")...)
	in = append(in, packet(fxpSetstat, uint32(2), "/p", uint32(attrSize), uint64(0))...)
	in = append(in, packet(fxpRemove, uint32(3), "/p/x")...)
	in = append(in, packet(fxpOpen, uint32(4), "/p", uint32(fxfRead), uint32(0))...)
	in = append(in, packet(fxpOpen, uint32(5), "/p", uint32(fxfWrite), uint32(0))...)
	out, err := serveIn(t, dir, in)
	if err != nil {
		t.Fatal(err)
	}
	ps := replies(t, out)
	if len(ps) != 6 {
		t.Fatalf("%d replies, want 6", len(ps))
	}
	if ps[1][0] != fxpExtendedReply {
		t.Errorf("statvfs on a FIFO: reply type %d", ps[1][0])
	}
	for i, want := range map[int]uint32{2: fxFailure, 3: fxNoSuchFile, 4: fxFailure, 5: fxFailure} {
		if got := statusOf(ps[i]); got != want {
			t.Errorf("reply %d: status %d, want %d", i, got, want)
		}
	}
}

// TestFsetstatActsOnTheHandle: FSETSTAT changes the open file, not
// whatever now has its name (review finding).
func TestFsetstatActsOnTheHandle(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := packet(fxpInit, uint32(3))
	in = append(in, packet(fxpOpen, uint32(1), "/a", uint32(fxfRead|fxfWrite), uint32(0))...)
	in = append(in, packet(fxpRename, uint32(2), "/a", "/b")...)
	in = append(in, packet(fxpOpen, uint32(3), "/a", uint32(fxfWrite|fxfCreat), uint32(0))...)
	in = append(in, packet(fxpFsetstat, uint32(4), "1", uint32(attrACModTime|attrPermissions), uint32(0o600), uint32(1000), uint32(1000))...)
	out, err := serveIn(t, dir, in)
	if err != nil {
		t.Fatal(err)
	}
	ps := replies(t, out)
	if got := statusOf(ps[4]); got != fxOK {
		t.Fatalf("fsetstat: status %d", got)
	}
	b, _ := os.Stat(filepath.Join(dir, "b"))
	a, _ := os.Stat(filepath.Join(dir, "a"))
	if b.ModTime().Unix() != 1000 || b.Mode().Perm() != 0o600 {
		t.Errorf("the handle's file: mtime %d mode %v", b.ModTime().Unix(), b.Mode())
	}
	if a.ModTime().Unix() == 1000 || a.Mode().Perm() == 0o600 {
		t.Errorf("the new file under the old name was changed: mtime %d mode %v", a.ModTime().Unix(), a.Mode())
	}
}

// TestPrivilegedServerGrantsNoOwnersOrSetID: confined and running as root,
// the server refuses setuid/setgid and any real owner change, through a
// handle too (review finding), and keeps sticky directories working.
func TestPrivilegedServerGrantsNoOwnersOrSetID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the policy only applies to a server running as root")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mine"), []byte("m"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := packet(fxpInit, uint32(3))
	in = append(in, packet(fxpOpen, uint32(1), "/mine", uint32(fxfRead), uint32(0))...)
	in = append(in, packet(fxpFsetstat, uint32(2), "1", uint32(attrUIDGID), uint32(4242), uint32(4242))...)
	in = append(in, packet(fxpSetstat, uint32(3), "/mine", uint32(attrUIDGID), uint32(4242), uint32(4242))...)
	in = append(in, packet(fxpSetstat, uint32(4), "/mine", uint32(attrPermissions), uint32(0o4755))...)
	in = append(in, packet(fxpSetstat, uint32(5), "/mine", uint32(attrUIDGID), uint32(0), uint32(0))...)
	in = append(in, packet(fxpMkdir, uint32(6), "/sticky", uint32(attrPermissions), uint32(0o1777))...)
	out, err := serveIn(t, dir, in)
	if err != nil {
		t.Fatal(err)
	}
	ps := replies(t, out)
	for i, want := range map[int]uint32{2: fxPermissionDenied, 3: fxPermissionDenied, 4: fxPermissionDenied, 5: fxOK, 6: fxOK} {
		if got := statusOf(ps[i]); got != want {
			t.Errorf("reply %d: status %d, want %d", i, got, want)
		}
	}
	st, _ := os.Stat(filepath.Join(dir, "mine"))
	if st.Mode()&os.ModeSetuid != 0 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("mine: mode %v uid %d", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
	}
	if st, err := os.Stat(filepath.Join(dir, "sticky")); err != nil || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("sticky dir: %v %v", st, err)
	}
}

// TestRepliesFlushedBeforeAProtocolError: replies made before a broken
// request still reach the client (review finding).
func TestRepliesFlushedBeforeAProtocolError(t *testing.T) {
	in := packet(fxpInit, uint32(3))
	in = append(in, packet(fxpOpen, uint32(1), "/f", uint32(fxfRead), uint32(0))...)
	in = append(in, 0, 0, 0, 2, fxpOpen, 0) // no id
	out, err := serveBytes(t, in)
	if err == nil {
		t.Fatal("Serve accepted a request without an id")
	}
	if ps := replies(t, out); len(ps) != 2 || ps[1][0] != fxpHandle {
		t.Fatalf("%d replies before the error, want VERSION and HANDLE", len(ps))
	}
}

// TestOpenSSHExtensions: users-groups-by-id, home-directory and copy-data,
// which OpenSSH's sftp uses for `ls -l` of one file, `cd ~` and `cp`.
func TestOpenSSHExtensions(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "src"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	ids := encoder{}.uint32(uint32(os.Getuid())).uint32(4000000000)
	gids := encoder{}.uint32(uint32(os.Getgid()))
	in := packet(fxpInit, uint32(3))
	in = append(in, packet(fxpExtended, uint32(1), "users-groups-by-id@openssh.com", string(ids), string(gids))...)
	in = append(in, packet(fxpExtended, uint32(2), "home-directory", "")...)
	in = append(in, packet(fxpExtended, uint32(3), "home-directory", "nosuchuser-xyz")...)
	in = append(in, packet(fxpOpen, uint32(4), "/src", uint32(fxfRead|fxfWrite), uint32(0))...)
	in = append(in, packet(fxpOpen, uint32(5), "/dst", uint32(fxfWrite|fxfCreat), uint32(0))...)
	// bytes 2..7 of src to dst at offset 1; then the rest of src from 8 on.
	in = append(in, packet(fxpExtended, uint32(6), "copy-data", "1", uint64(2), uint64(6), "2", uint64(1))...)
	in = append(in, packet(fxpExtended, uint32(7), "copy-data", "1", uint64(8), uint64(0), "2", uint64(7))...)
	// Overlapping ranges of one file are refused.
	in = append(in, packet(fxpExtended, uint32(8), "copy-data", "1", uint64(0), uint64(5), "1", uint64(3))...)
	out, err := serveIn(t, dir, in)
	if err != nil {
		t.Fatal(err)
	}
	ps := replies(t, out)
	if len(ps) != 9 {
		t.Fatalf("%d replies, want 9", len(ps))
	}
	d := &decoder{b: ps[1][5:]}
	users, groups := &decoder{b: d.bytes()}, &decoder{b: d.bytes()}
	if u1, u2, g1 := users.string(), users.string(), groups.string(); u1 == "" || u2 != "" || g1 == "" || users.err != nil || groups.err != nil {
		t.Errorf("users-groups-by-id: %q %q %q", u1, u2, g1)
	}
	if ps[2][0] != fxpName || statusOf(ps[3]) != fxNoSuchFile {
		t.Errorf("home-directory: reply types %d %d", ps[2][0], ps[3][0])
	}
	for i, want := range map[int]uint32{6: fxOK, 7: fxOK, 8: fxFailure} {
		if got := statusOf(ps[i]); got != want {
			t.Errorf("copy-data %d: status %d, want %d", i, got, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "dst")); string(b) != "\x00234567"+"89" {
		t.Errorf("dst = %q", b)
	}
}
