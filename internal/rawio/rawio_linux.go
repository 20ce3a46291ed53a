//go:build linux && (amd64 || arm64)

package rawio

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Supported: raw calls are made here (64-bit Linux: amd64, arm64, where
// fstat(2) fills unix.Stat_t); elsewhere the
// package's functions must not be used, and Wrap changes nothing.
const Supported = true

// NonBlocking reports whether rc's descriptor is in non-blocking mode,
// as Wrap requires of a socket before it takes it.
func NonBlocking(rc syscall.RawConn) bool {
	nb := false
	_ = rc.Control(func(fd uintptr) { nb = nonBlocking(fd) })
	return nb
}

// rawSafe reports whether raw calls may be made on fd: a socket in
// non-blocking mode (see the package's doc for why not a pipe).
func rawSafe(fd uintptr) bool {
	if !nonBlocking(fd) {
		return false
	}
	var st unix.Stat_t
	_, _, e := unix.RawSyscall(unix.SYS_FSTAT, fd, uintptr(unsafe.Pointer(&st)), 0)
	return e == 0 && st.Mode&unix.S_IFMT == unix.S_IFSOCK
}

// nonBlocking is NonBlocking of a descriptor: a raw fcntl(2), so that
// the check costs no trip through the scheduler.
func nonBlocking(fd uintptr) bool {
	fl, _, e := unix.RawSyscall(unix.SYS_FCNTL, fd, unix.F_GETFL, 0)
	return e == 0 && fl&unix.O_NONBLOCK != 0
}

func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// read is an ordinary read(2), for a descriptor raw calls are not safe on.
func read(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := unix.Read(int(fd), p)
	if err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return 0, e
		}
		return 0, syscall.EIO
	}
	return n, 0
}

// rawWritev is writev(2) of bufs (at most IovMax, none of them needed
// non-empty).
func rawWritev(fd uintptr, bufs [][]byte) (int, syscall.Errno) {
	var small [8]unix.Iovec // a Write, or a short batch: no allocation
	iovs := small[:0]
	if len(bufs) > len(small) {
		iovs = make([]unix.Iovec, 0, len(bufs))
	}
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iovs = append(iovs, v)
	}
	if len(iovs) == 0 {
		return 0, 0
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iovs[0])), uintptr(len(iovs)))
	return int(n), e
}

// Ready reports whether a read of rc's socket would return at once (data,
// its end or an error): a raw, non-blocking MSG_PEEK of one byte.
func Ready(rc syscall.RawConn) bool {
	ready := false
	err := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		ready = e != unix.EAGAIN && e != unix.EINTR
		return true // never wait
	})
	return ready || err != nil
}

// Available returns how many bytes a read of rc's socket returns at once
// (SIOCINQ: the bytes queued to read), 0 when it cannot tell.
func Available(rc syscall.RawConn) int {
	n := 0
	_ = rc.Control(func(fd uintptr) {
		v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err == nil && v > 0 {
			n = v
		}
	})
	return n
}

// Peek copies into p the bytes at the head of rc's socket without taking
// them (a non-blocking MSG_PEEK), and returns how many; 0 when none.
func Peek(rc syscall.RawConn, p []byte) int {
	n := 0
	_ = rc.Read(func(fd uintptr) bool {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		if e == 0 {
			n = int(r)
		}
		return true // never wait
	})
	return n
}
