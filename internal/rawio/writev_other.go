//go:build !(linux || darwin || openbsd)

package rawio

import "syscall"

// HaveWritev: there is no writev(2) here; Writev must not be used.
const HaveWritev = false

func writev(uintptr, [][]byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
