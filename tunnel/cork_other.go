//go:build !linux

package tunnel

import "errors"

// setCork is TCP_CORK, which only Linux has: elsewhere segments leave as
// they are written.
func setCork(uintptr, bool) error { return errors.ErrUnsupported }
