//go:build !linux

package tunnel

import (
	"errors"
	"syscall"
)

func peekWait(syscall.RawConn, []byte) (int, error) {
	return 0, errors.ErrUnsupported
}

// canPeek: no MSG_PEEK here; the handshake reads as it likes and the
// socket is never handed over (wsClientConn.Socket).
const canPeek = false
