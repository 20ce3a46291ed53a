//go:build !unix

package procgov

import (
	"errors"
	"time"
)

// ProcessCPU is not measured here: the Governor stays off.
func ProcessCPU() (time.Duration, error) {
	return 0, errors.New("no process CPU clock on this platform")
}
