package dataplane

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
)

func TestMain(m *testing.M) {
	// The test binary stands in for sandgate: the linux driver re-executes
	// it as a sandbox's init.
	if len(os.Args) > 1 && os.Args[1] == "sandbox-init" {
		os.Exit(initd.Main(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}
