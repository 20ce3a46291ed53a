//go:build !linux

package dataplane

import "io"

// buffered is not known here: drain waits its grace only.
func buffered(io.Closer) bool { return false }
