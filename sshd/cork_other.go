//go:build !linux

package sshd

import "errors"

// setCork is TCP_CORK, which only Linux has: elsewhere packets leave as
// they are written.
func setCork(uintptr, bool) error { return errors.ErrUnsupported }
