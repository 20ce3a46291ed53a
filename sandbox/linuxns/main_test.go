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
	goleak.VerifyTestMain(m)
}
