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

// TestKeptProcessOutlivesItsGateway: a command started with Cmd.Keep runs
// on when its gateway goes away (its control connection and pipes
// closed), its output waits in its pipe, and Reattach hands it back where
// it was: the output goes on with nothing lost, input and EOF reach it,
// and an exit while no gateway held it is there at once. A command
// started without Keep still ends with its connection.
func TestKeptProcessOutlivesItsGateway(t *testing.T) {
	sb := killTestSandbox(t, "linux")
	k, ok := sandbox.As[sandbox.Keeper](sb)
	if !ok || !k.Keeps() {
		t.Fatal("a linux sandbox does not keep processes")
	}
	ctx := context.Background()
	p, err := sb.Start(ctx, sandbox.Cmd{Keep: "counter",
		Command: `i=0; while [ $i -lt 300 ]; do echo $i; i=$((i+1)); sleep 0.005; done; read x; echo "in:$x"; exit 3`})
	if err != nil {
		t.Fatal(err)
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
	linuxns.DropControl(p) // the gateway dies
	time.Sleep(300 * time.Millisecond)

	if _, err := k.Reattach(ctx, "no-such"); !errors.Is(err, sandbox.ErrNotKept) {
		t.Errorf("reattach of an unknown key: %v", err)
	}
	p2, err := k.Reattach(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if pid, ok := p2.(sandbox.PIDer); !ok || pid.PID() <= 1 {
		t.Errorf("reattached without its pid")
	}
	if _, err := p2.Stdin().Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	_ = p2.Stdin().Close()
	rest, err := io.ReadAll(p2.Stdout())
	if err != nil {
		t.Fatal(err)
	}
	got.Write(rest)
	exit, err := p2.Wait()
	if err != nil || exit.Code != 3 {
		t.Errorf("exit %+v %v, want 3", exit, err)
	}
	var want strings.Builder
	for i := range 300 {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	want.WriteString("in:hello\n")
	if got.String() != want.String() {
		t.Errorf("the output across the reattach is not the count, whole and once:\n%q", got.String())
	}

	// Ends while no gateway holds it: the exit waits for the next one.
	q, err := sb.Start(ctx, sandbox.Cmd{Keep: "short", Command: "echo bye; exit 7"})
	if err != nil {
		t.Fatal(err)
	}
	linuxns.DropControl(q)
	time.Sleep(300 * time.Millisecond)
	q2, err := k.Reattach(ctx, "short")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(q2.Stdout())
	if exit, err := q2.Wait(); err != nil || exit.Code != 7 || string(out) != "bye\n" {
		t.Errorf("a process that ended meanwhile: exit %+v %v, output %q", exit, err, out)
	}
	if _, err := k.Reattach(ctx, "short"); !errors.Is(err, sandbox.ErrNotKept) {
		t.Errorf("reattach after its exit was taken: %v", err)
	}

	// Without Keep, the command ends with its connection, as before.
	r, err := sb.Start(ctx, sandbox.Cmd{Command: "sleep 42420"})
	if err != nil {
		t.Fatal(err)
	}
	linuxns.DropControl(r)
	if !waitFor(10*time.Second, func() bool { return len(sleepers("42420")) == 0 }) {
		t.Error("a command that was not kept outlived its connection")
	}
}
