//go:build !linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
)

func openLinux(Config) (Driver, error) {
	return nil, errors.New("the linux driver needs Linux")
}

// InitMain is `sandgate sandbox-init`, the per-session init of the linux
// driver, which this platform does not have.
func InitMain(args []string) int {
	fmt.Fprintln(os.Stderr, "sandbox-init: the linux sandbox driver needs Linux")
	return 2
}
