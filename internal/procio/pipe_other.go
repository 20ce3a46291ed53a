//go:build !linux

package procio

import "os"

// GrowPipe is a no-op where pipes cannot be resized.
func GrowPipe(*os.File) {}

// GrowPipeFD is a no-op where pipes cannot be resized.
func GrowPipeFD(int) {}

// ShrinkPipeFD is a no-op where pipes cannot be resized.
func ShrinkPipeFD(int) {}
