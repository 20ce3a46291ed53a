package ctl

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"testing"

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
