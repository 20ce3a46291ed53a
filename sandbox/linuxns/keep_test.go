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
	sandbox.Ack(p2)
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
	// The gateway dies after Wait but before it stored the exit (no Ack):
	// the init still keeps it for the next one.
	linuxns.DropControl(q2)
	time.Sleep(300 * time.Millisecond)
	q3, err := k.Reattach(ctx, "short")
	if err != nil {
		t.Fatalf("a process whose exit was seen but not acknowledged is lost: %v", err)
	}
	if exit, err := q3.Wait(); err != nil || exit.Code != 7 {
		t.Errorf("the unacknowledged exit, again: %+v %v", exit, err)
	}
	sandbox.Ack(q3)
	// Its exit was taken and acked: the init forgets it.
	if !waitFor(5*time.Second, func() bool {
		p, err := k.Reattach(ctx, "short")
		if err == nil {
			linuxns.DropControl(p)
		}
		return errors.Is(err, sandbox.ErrNotKept)
	}) {
		t.Error("the init still keeps a process whose exit a gateway took")
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

// TestDetachKeepsOutputWhole: when the gateway stops and leaves a sandbox
// for the next one (Detach) while a kept process writes as fast as it
// can, every byte is either read by this gateway or left in the pipe for
// the next: the output, read across the adopt and reattach, is the count
// whole, nothing lost or read twice.
func TestDetachKeepsOutputWhole(t *testing.T) {
	requireLinux(t)
	d, err := openDriver("linux", sandbox.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-detach-output"})
	if err != nil {
		t.Fatal(err)
	}
	destroy := sb.Destroy
	t.Cleanup(func() { _ = destroy(ctx) })
	p, err := sb.Start(ctx, sandbox.Cmd{Keep: "fast", Command: `i=0; while :; do echo $i; i=$((i+1)); done`})
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		buf := make([]byte, 4096)
		for {
			n, err := p.Stdout().Read(buf)
			got.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if err := sb.(sandbox.Detacher).Detach(ctx); err != nil {
		t.Fatal(err)
	}
	<-pumped // Detach ended the reads: what was read is in got
	before := got.Len()

	sb2, err := d.(sandbox.Reattacher).Adopt(ctx, "sbx-detach-output")
	if err != nil {
		t.Fatal(err)
	}
	destroy = sb2.Destroy
	p2, err := sb2.(sandbox.Keeper).Reattach(ctx, "fast")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for got.Len() < before+100000 {
		n, err := p2.Stdout().Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
	}
	p2.Kill()
	_, _ = p2.Wait()
	sandbox.Ack(p2)
	lines := strings.Split(got.String(), "\n")
	lines = lines[:len(lines)-1] // the last may be cut
	for i, l := range lines {
		if l != strconv.Itoa(i) {
			t.Fatalf("line %d is %q (%d bytes read before the detach): output lost or read twice", i, l, before)
		}
	}
	t.Logf("%d lines, %d bytes of them read before the detach", len(lines), before)
}

// TestKeptPTYReattach: a kept process on a terminal (sandbox.PTYKeeper)
// outlives its gateway and a release (sandbox.Releaser): the init holds
// the terminal's master, and Reattach hands one back, on which the same
// shell reads its input, answers with its state, and is resized; its
// exit is kept for the gateway that takes it back.
func TestKeptPTYReattach(t *testing.T) {
	sb := killTestSandbox(t, "linux")
	k, ok := sandbox.As[sandbox.Keeper](sb)
	pk, pok := sandbox.As[sandbox.PTYKeeper](sb)
	if !ok || !pok || !pk.KeepsPTY() {
		t.Fatal("a linux sandbox does not keep processes on a terminal")
	}
	ctx := context.Background()
	p, err := sb.Start(ctx, sandbox.Cmd{Keep: "term", PTY: &sandbox.PTY{Term: "xterm", Window: sandbox.Window{Cols: 80, Rows: 24}},
		Command: `PS1='$ ' exec sh -i`})
	if err != nil {
		t.Fatal(err)
	}
	readUntil := func(t *testing.T, p sandbox.Process, want string) string {
		t.Helper()
		var got strings.Builder
		buf := make([]byte, 256)
		for !strings.Contains(got.String(), want) {
			n, err := p.Stdout().Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("terminal output %q (want %q): %v", got.String(), want, err)
			}
		}
		return got.String()
	}
	if _, err := p.Stdin().Write([]byte("cd /tmp; V=kept; echo one-$((40+2))\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, p, "one-42")

	// Released (a pause by checkpoint's way), then dropped (a gateway
	// that dies): each time the next attach gets the same terminal.
	p.(sandbox.Releaser).Release()
	p2, err := k.Reattach(ctx, "term")
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Resize(sandbox.Window{Cols: 101, Rows: 33}); err != nil {
		t.Fatalf("resize after the reattach: %v", err)
	}
	if _, err := p2.Stdin().Write([]byte("echo \"$V-$(pwd)\"; stty size\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, p2, "33 101")
	linuxns.DropControl(p2)
	time.Sleep(300 * time.Millisecond)
	p3, err := k.Reattach(ctx, "term")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p3.Stdin().Write([]byte("echo \"$V-$(pwd)\"; exit 5\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, p3, "kept-/tmp")
	go func() { _, _ = io.Copy(io.Discard, p3.Stdout()) }()
	exit, err := p3.Wait()
	sandbox.Ack(p3)
	if err != nil || exit.Code != 5 {
		t.Errorf("exit %+v %v, want 5", exit, err)
	}
	// The init forgets it once the ack reaches it.
	if !waitFor(5*time.Second, func() bool {
		p, err := k.Reattach(ctx, "term")
		if err == nil {
			linuxns.DropControl(p)
		}
		return errors.Is(err, sandbox.ErrNotKept)
	}) {
		t.Error("the init still keeps a process on a terminal whose exit a gateway took")
	}
}
