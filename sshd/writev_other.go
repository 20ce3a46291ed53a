//go:build !unix

package sshd

import (
	"errors"
	"syscall"
)

// haveWritev: without writev(2), copyIn copies (copyStream).
const haveWritev = false

func writeBuffers(syscall.RawConn, [][]byte) (int, error) { return 0, errors.ErrUnsupported }
