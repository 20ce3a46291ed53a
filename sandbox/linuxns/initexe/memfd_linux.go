//go:build linux

package initexe

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Open returns the embedded small init as a sealed, read-only memfd, or
// nil when this binary was built without it (go install): the caller then
// runs its own binary as the init. The gateway execs it through
// /proc/self/fd/<fd>; every sandbox maps the same pages, and nobody can
// change them (F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL).
func Open() (*os.File, error) { return OpenBytes(Bytes()) }

// OpenBytes is Open for the init binary b (nil: none).
func OpenBytes(b []byte) (*os.File, error) {
	if b == nil {
		return nil, nil
	}
	// MFD_EXEC (Linux 6.3) keeps the memfd executable where the
	// vm.memfd_noexec sysctl would make it noexec; older kernels refuse
	// the flag and always make it executable.
	fd, err := unix.MemfdCreate("sandgate-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("sandgate-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd for the sandbox init: %w", err)
	}
	f := os.NewFile(uintptr(fd), "sandgate-init")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("write the sandbox init: %w", err)
	}
	const seals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal the sandbox init: %w", err)
	}
	// exec refuses a file open for writing (ETXTBSY): keep a read-only
	// descriptor only.
	rofd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("reopen the sandbox init: %w", err)
	}
	// The init is exec'd as /proc/self/fd/<fd> by a child that first
	// moves its stdio and extra files to descriptors 0 and up: a memfd
	// there (a gateway started with a closed stdin) would be replaced
	// before the exec. Keep it above them.
	high, err := unix.FcntlInt(uintptr(rofd), unix.F_DUPFD_CLOEXEC, minFD)
	unix.Close(rofd)
	if err != nil {
		return nil, fmt.Errorf("reopen the sandbox init: %w", err)
	}
	return os.NewFile(uintptr(high), "sandgate-init"), nil
}

// minFD is the lowest descriptor the memfd may have: above those a child
// of the driver gets (stdio, and its extra files from 3).
const minFD = 16
