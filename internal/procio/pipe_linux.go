package procio

import (
	"os"

	"golang.org/x/sys/unix"
)

// bulkPipeSize is the capacity given to a process's stdin and stdout pipes
// instead of the kernel's 64 KiB (two 32 KiB SFTP packets): the process
// and the gateway then wake each other far less often on bulk transfers
// (sftp-server CPU -13%, gateway+sftp-server CPU -15 to -25% per GiB in
// bench/). Pages are only allocated while data waits in the pipe.
const bulkPipeSize = 1 << 20

// GrowPipeFD is GrowPipe for a pipe's raw descriptor.
func GrowPipeFD(fd int) {
	if os.Geteuid() == 0 {
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, bulkPipeSize)
	}
}

// GrowPipe raises the capacity of the pipe f belongs to. Only a privileged
// gateway does it: an unprivileged user's pipes count against
// fs.pipe-user-pages-soft, past which new pipes shrink to two pages.
// Failure keeps the default.
func GrowPipe(f *os.File) {
	if os.Geteuid() != 0 {
		return
	}
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, bulkPipeSize)
		})
	}
}

// defaultPipeSize is the kernel's default pipe capacity (16 pages).
const defaultPipeSize = 64 << 10

// ShrinkPipeFD gives the pipe fd belongs to the kernel's default capacity
// back, when what waits in it fits (else it keeps its size: EBUSY). A
// pipe the gateway grew and hands to a sandbox for good (a kept command's
// output, let go of before a pause by checkpoint) is recreated at its
// size by the restore, as the sandbox's unprivileged user, whose pipes
// count against fs.pipe-user-pages-soft: 64 such pipes of 1 MiB reach it,
// and the restore fails.
func ShrinkPipeFD(fd int) {
	if size, err := unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0); err == nil && size > defaultPipeSize {
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, defaultPipeSize)
	}
}
