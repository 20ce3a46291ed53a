package linuxns_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/gwtest"
)

func TestMain(m *testing.M) {
	// The test binary stands in for sandgate: re-executed as sandbox-init
	// or sftp-server, it runs that and exits here.
	gwtest.Dispatch()
	// A Driver's spawn server (NewWithInit) runs, and is waited for, as
	// long as the Driver: there is no Close, and the tests' drivers are
	// collected only if a GC comes.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/sandgate/sandgate/sandbox/linuxns.startSpawnServer.func1"))
}
