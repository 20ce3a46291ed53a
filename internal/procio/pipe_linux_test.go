package procio

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestGrowPipe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("GrowPipe only acts as root")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	GrowPipe(r)
	rc, _ := w.SyscallConn()
	var size int
	_ = rc.Control(func(fd uintptr) { size, err = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) })
	if err != nil || size != bulkPipeSize {
		t.Fatalf("pipe size %d, %v; want %d", size, err, bulkPipeSize)
	}
}
