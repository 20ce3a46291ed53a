//go:build linux

package initd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp filter of every sandbox process: the gateway assembles its
// program once (package seccompprog says what it blocks and why) and sends
// it in every spec (ctl.Spec.Seccomp); the init loads it on its spawner
// thread, after no_new_privs and the capability drops, so every command,
// shell, SFTP server and kernel the init starts inherits it across fork
// and exec, and cannot remove it. The init's own other threads stay
// unfiltered: they run no sandbox code. The init neither builds nor checks
// the policy: the gateway that starts it is trusted with the sandbox
// anyway, and building it cost every start about a millisecond.

// maxFilterInstructions is the kernel's limit on a classic BPF program
// (BPF_MAXINSNS).
const maxFilterInstructions = 4096

// loadSeccomp installs the filter program prog (struct sock_filter
// entries in the host's byte order, ctl.Spec.Seccomp) on the calling
// thread, and so on every process it forks from now on. The thread must be
// locked to its goroutine, and have no_new_privs set.
func loadSeccomp(prog []byte) error {
	if len(prog) == 0 {
		return errors.New("seccomp filter: the spec carries no program")
	}
	if len(prog)%8 != 0 || len(prog)/8 > maxFilterInstructions {
		return fmt.Errorf("seccomp filter: a program of %d bytes is not 1 to %d instructions", len(prog), maxFilterInstructions)
	}
	insns := make([]unix.SockFilter, len(prog)/8)
	for i := range insns {
		b := prog[8*i:]
		insns[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])}
	}
	fprog := unix.SockFprog{Len: uint16(len(insns)), Filter: &insns[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(insns)
	if errno != 0 {
		return fmt.Errorf("seccomp filter: %w", errno)
	}
	return nil
}
