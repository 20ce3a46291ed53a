//go:build linux

package initexe

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// The memfd is sealed, read-only, close-on-exec, and above the
// descriptors a child of the driver rearranges before it execs it (its
// stdio and extra files, from 0 up), even when low descriptors are free
// (here 0, as in a gateway started with stdin closed): one of those would
// be replaced by the child's dup2 before it execs /proc/self/fd/<fd>.
func TestOpenBytesSealedHigh(t *testing.T) {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	saved, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(0)
	f, err := OpenBytes(self)
	if err := unix.Dup3(saved, 0, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(saved)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Fd() < minFD {
		t.Errorf("the memfd is descriptor %d, want at least %d", f.Fd(), minFD)
	}
	if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Errorf("the memfd is not close-on-exec: %#x %v", fl, err)
	}
	if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err != nil || fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("the memfd is open %#x (%v), want read-only", fl, err)
	}
	want := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&want != want {
		t.Errorf("seals %#x (%v), want %#x", seals, err, want)
	}
	if b, _ := OpenBytes(nil); b != nil {
		t.Errorf("no init bytes gave %v, want nil", b)
	}
}
