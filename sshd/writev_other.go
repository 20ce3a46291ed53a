//go:build !(linux || darwin || openbsd)

package sshd

import (
	"errors"
	"syscall"
)

// haveWritev: where x/sys has no writev(2), copyIn copies (copyStream).
const haveWritev = false

func writeBuffers(syscall.RawConn, [][]byte) (int, error) { return 0, errors.ErrUnsupported }
