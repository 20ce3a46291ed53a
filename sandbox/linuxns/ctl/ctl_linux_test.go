package ctl

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestErrorReplyKeepsTheErrno(t *testing.T) {
	sent := ErrorReply(fmt.Errorf("start /bin/bash: %w", &os.PathError{Op: "fork/exec", Path: "/bin/bash", Err: syscall.ENOENT}))
	pair := socketpair(t)
	if err := WriteFrame(pair[0], sent); err != nil {
		t.Fatal(err)
	}
	var got Reply
	if _, err := ReadFrame(pair[1], &got); err != nil {
		t.Fatal(err)
	}
	err := got.Err()
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != sent.Error {
		t.Errorf("Err() = %v (is ErrNotExist: %v), want %q wrapping ENOENT", err, errors.Is(err, fs.ErrNotExist), sent.Error)
	}
	if plain := ErrorReply(errors.New("no")).Err(); errors.Is(plain, fs.ErrNotExist) || plain.Error() != "no" {
		t.Errorf("a reply without errno: %v", plain)
	}
}

func TestFramesCarryDescriptors(t *testing.T) {
	pair := socketpair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := WriteFrame(pair[0], Request{Op: "exec", Command: "true"}, int(r.Fd()), int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	var req Request
	fds, err := ReadFrame(pair[1], &req)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(fds)
	if req.Op != "exec" || req.Command != "true" || len(fds) != 2 {
		t.Fatalf("got %+v with %d fds", req, len(fds))
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func socketpair(t *testing.T) [2]*net.UnixConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = c.(*net.UnixConn)
		t.Cleanup(func() { c.Close() })
	}
	return out
}

// TestFDFrames: a blocking descriptor (FD, the init's spawner thread's
// end) and a *net.UnixConn exchange frames, with descriptors, both ways;
// the peer closing is io.EOF.
func TestFDFrames(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	raw := FD(fds[0])
	defer unix.Close(fds[0])
	f := os.NewFile(uintptr(fds[1]), "peer")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	peer := nc.(*net.UnixConn)
	defer peer.Close()
	// A failure must not hang the test: the writer below and the FD reads
	// end when peer does.
	stop := time.AfterFunc(30*time.Second, func() { peer.Close(); unix.Shutdown(fds[0], unix.SHUT_RDWR) })
	defer stop.Stop()

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// Larger than a socket buffer: the FD side reads it in parts.
	werr := make(chan error, 1)
	go func() {
		werr <- WriteFrame(peer, Request{Op: "exec", Command: "true", Env: []string{strings.Repeat("x", 1<<20)}}, int(r.Fd()))
	}()
	var req Request
	got, err := ReadFrame(raw, &req)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	defer closeAll(got)
	if req.Op != "exec" || req.Command != "true" || len(req.Env) != 1 || len(req.Env[0]) != 1<<20 || len(got) != 1 {
		t.Fatalf("FD read %q %q with %d fds", req.Op, req.Command, len(got))
	}
	if flags, err := unix.FcntlInt(uintptr(got[0]), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("a received descriptor is not close-on-exec: %#x, %v", flags, err)
	}

	if err := WriteFrame(raw, Reply{Op: "started", Pid: 7}, int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	var rep Reply
	got2, err := ReadFrame(peer, &rep)
	if err != nil {
		t.Fatal(err)
	}
	closeAll(got2)
	if rep.Op != "started" || rep.Pid != 7 || len(got2) != 1 {
		t.Fatalf("UnixConn read %+v with %d fds", rep, len(got2))
	}

	peer.Close()
	if _, err := ReadFrame(raw, &req); !errors.Is(err, io.EOF) {
		t.Fatalf("after the peer closed: %v, want io.EOF", err)
	}
	if _, _, err := raw.WriteMsgUnix([]byte("x"), nil, &net.UnixAddr{Name: "x", Net: "unix"}); err == nil {
		t.Error("WriteMsgUnix took an address on a connected socket")
	}
}
