package linuxns_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/gwtest"
)

func TestMain(m *testing.M) {
	// The test binary stands in for sandgate: re-executed as sandbox-init
	// or sftp-server, it runs that and exits here.
	gwtest.Dispatch()
	// The tests name their sandboxes (sbx-fork-src, ...), and a
	// sandbox's cgroups are named by its id on the host, not under a
	// data dir: two runs at once (two checkouts) would share them. One
	// run at a time, then; the next waits here.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "sandgate-linuxns-test.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			fmt.Fprintln(os.Stderr, "linuxns tests: another run holds", lock.Name(), "- waiting for it")
			err = unix.Flock(int(lock.Fd()), unix.LOCK_EX)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "linuxns tests: cannot take the run lock:", err)
		os.Exit(1)
	}
	// A Driver's spawn server (NewWithInit) runs, and is waited for, as
	// long as the Driver: there is no Close, and the tests' drivers are
	// collected only if a GC comes.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/sandgate/sandgate/sandbox/linuxns.startSpawnServer.func1"))
}
