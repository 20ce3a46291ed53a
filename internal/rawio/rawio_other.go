//go:build !(linux && (amd64 || arm64))

package rawio

import "syscall"

// Supported: raw calls are made on 64-bit Linux only; elsewhere Ready
// must not be used, Wrap changes nothing, and Writev makes ordinary calls
// (where there is a writev(2): HaveWritev).
const Supported = false

// NonBlocking is false where raw calls are not supported.
func NonBlocking(syscall.RawConn) bool { return false }

// Ready is false where raw calls are not supported.
func Ready(syscall.RawConn) bool { return false }

func nonBlocking(uintptr) bool                         { return false }
func rawSafe(uintptr) bool                             { return false }
func rawRead(uintptr, []byte) (int, syscall.Errno)     { return 0, syscall.ENOSYS }
func read(uintptr, []byte) (int, syscall.Errno)        { return 0, syscall.ENOSYS }
func rawWritev(uintptr, [][]byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }

// Available is 0 where raw calls are not supported.
func Available(syscall.RawConn) int { return 0 }

// Peek is 0 where raw calls are not supported.
func Peek(syscall.RawConn, []byte) int { return 0 }
