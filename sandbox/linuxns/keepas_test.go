//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// TestKeepAsKeepsARunningCommand: a command started without Cmd.Keep (an
// SSH exec) is kept as it runs (sandbox.KeepLater, what a pause by
// checkpoint does to hand it to the process API): its Wait answers
// ErrHandedOff, its stdin is closed (EOF), and Reattach by the key hands
// it back with its output going on where the gateway stopped reading,
// nothing lost or twice, and its exit. A command that ended first is not
// kept (ErrExited), and its exit stays its Wait's.
func TestKeepAsKeepsARunningCommand(t *testing.T) {
	sb := killTestSandbox(t, "linux")
	k, ok := sandbox.As[sandbox.Keeper](sb)
	if !ok || !k.Keeps() {
		t.Fatal("a linux sandbox does not keep processes")
	}
	ctx := context.Background()
	p, err := sb.Start(ctx, sandbox.Cmd{
		Command: `i=0; while [ $i -lt 300 ]; do echo $i; i=$((i+1)); sleep 0.005; done; read x; echo "in:[$x]"; exit 3`})
	if err != nil {
		t.Fatal(err)
	}
	kl, ok := p.(sandbox.KeepLater)
	if !ok {
		t.Fatal("a linux sandbox's process cannot be kept later")
	}
	var got strings.Builder
	buf := make([]byte, 64)
	for got.Len() < 40 {
		n, err := p.Stdout().Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
	}
	type waited struct {
		exit sandbox.Exit
		err  error
	}
	wc := make(chan waited, 1)
	go func() { e, err := p.Wait(); wc <- waited{e, err} }()
	// KeepAs needs the Wait under way: until it is, it refuses.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = kl.KeepAs(ctx, "handed")
		if err == nil || !strings.Contains(err.Error(), "not yet waited") || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("KeepAs: %v", err)
	}
	select {
	case w := <-wc:
		if !errors.Is(w.err, sandbox.ErrHandedOff) {
			t.Fatalf("Wait of the handed-over command: %+v %v", w.exit, w.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once the command was handed over")
	}
	if err := kl.KeepAs(ctx, "again"); err == nil {
		t.Error("a second KeepAs succeeded")
	}
	p2, err := k.Reattach(ctx, "handed")
	if err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(p2.Stdout())
	if err != nil {
		t.Fatal(err)
	}
	got.Write(rest)
	exit, err := p2.Wait()
	sandbox.Ack(p2)
	if err != nil || exit.Code != 3 {
		t.Errorf("exit %+v %v, want 3", exit, err)
	}
	var want strings.Builder
	for i := range 300 {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	want.WriteString("in:[]\n")
	if got.String() != want.String() {
		t.Errorf("the output across the hand-over is not the count, whole and once, then EOF on stdin:\n%q", got.String())
	}
	// The ack reaches the init on its own time: it then forgets the
	// command.
	for deadline := time.Now().Add(10 * time.Second); ; {
		p3, err := k.Reattach(ctx, "handed")
		if errors.Is(err, sandbox.ErrNotKept) {
			break
		}
		if err == nil {
			linuxns.DropControl(p3)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the init still keeps the command after its ack: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// One that ended first.
	q, err := sb.Start(ctx, sandbox.Cmd{Command: "exit 5"})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, q.Stdout())
	exit, err = q.Wait()
	if err != nil || exit.Code != 5 {
		t.Fatalf("exit %+v %v, want 5", exit, err)
	}
	if err := q.(sandbox.KeepLater).KeepAs(ctx, "late"); !errors.Is(err, sandbox.ErrExited) {
		t.Errorf("KeepAs of a command that ended: %v, want ErrExited", err)
	}
	if _, err := k.Reattach(ctx, "late"); !errors.Is(err, sandbox.ErrNotKept) {
		t.Errorf("a command that ended first is kept: %v", err)
	}
}
