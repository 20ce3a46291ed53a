package sandbox

import (
	"fmt"
	"os"
)

// InitMain is `sandgate sandbox-init`, the per-session init of drivers that
// need one. No driver needs it yet.
func InitMain(args []string) int {
	fmt.Fprintln(os.Stderr, "sandbox-init: no driver on this build uses an init process")
	return 2
}
