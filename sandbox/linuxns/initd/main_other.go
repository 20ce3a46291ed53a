//go:build !linux

// Package initd is what runs as a linux sandbox's pid 1, which this
// platform does not have.
package initd

import (
	"fmt"
	"os"
)

// Main is `sandgate sandbox-init`, which needs Linux.
func Main(args []string) int {
	fmt.Fprintln(os.Stderr, "sandbox-init: the linux sandbox driver needs Linux")
	return 2
}

// SpawnMain is `sandgate-init sandbox-spawner`, which needs Linux.
func SpawnMain(args []string) int {
	fmt.Fprintln(os.Stderr, "sandbox-spawner: the linux sandbox driver needs Linux")
	return 2
}
