package envd_test

import (
	"bytes"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
)

// TestStdinBlockedCode: input a process does not read fails with
// DeadlineExceeded and the code stdin_blocked (E2B's SDKs raise their
// TimeoutException), not internal.
func TestStdinBlockedCode(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	_, r := sb.start(t, c, bash("sleep 120", true))
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}
	_, err := sb.proc.SendInput(c, connect.NewRequest(&process.SendInputRequest{Process: sel,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: bytes.Repeat([]byte("x"), 2<<20)}}}))
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if ce := (*connect.Error)(nil); !errors.As(err, &ce) || ce.Meta().Get("Sandgate-Code") != "stdin_blocked" {
		t.Errorf("error %v: want code stdin_blocked", err)
	}
	_, _ = sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
}
