// Package procio holds the descriptor plumbing that both drivers use to
// connect a sandbox process to the gateway: pipes, terminals and fd lists.
package procio

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// SetWinsize resizes the terminal f to w (80x24 when w has a zero side).
// It goes through SyscallConn so that a concurrent Close of f is safe.
func SetWinsize(f *os.File, w sandbox.Window) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	w = w.OrDefault()
	var ioctlErr error
	err = rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: w.Rows, Col: w.Cols})
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	return nil
}

// NopWriteCloser is a writer whose Close does nothing: a terminal's input
// side, which closing must not close the terminal.
type NopWriteCloser struct{ io.Writer }

// Close implements io.Closer.
func (NopWriteCloser) Close() error { return nil }

// CloseFDs closes every descriptor of fds that is not negative.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
