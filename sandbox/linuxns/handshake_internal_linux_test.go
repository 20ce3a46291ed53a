//go:build linux

package linuxns

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// An init that fails before it needs its workspace (building the default
// root, say) answers with why and exits; the gateway, sending the
// workspace late (ctl.Attach), then finds the socket closed. The create's
// error is the init's answer, not the broken pipe.
func TestHandshakeReportsInitErrorBeforeAttach(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "gateway"), os.NewFile(uintptr(pair[1]), "init")
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()
	// The init's side: its answer, then gone.
	if err := ctl.WriteFrame(ctl.FD(int(theirs.Fd())), ctl.Ready{Error: "new root: no /usr on this host"}); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	ws, err := unix.Open("/", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ws)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hs := &initHandshake{ctx: ctx, conn: conn, stop: func() {}}
	err = hs.finish(ctl.Attach{FDs: []string{"workspace"}}, []int{ws}, "", time.Time{})
	if err == nil || !strings.Contains(err.Error(), "no /usr on this host") {
		t.Errorf("finish: %v, want the init's error", err)
	}
}
