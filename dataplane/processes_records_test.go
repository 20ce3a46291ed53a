package dataplane

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// flakyKeeper is a sandbox whose init cannot be reached for its first
// fails calls to Reattach, and then keeps nothing.
type flakyKeeper struct {
	fails atomic.Int32
	calls atomic.Int32
}

func (k *flakyKeeper) Keeps() bool { return true }

func (k *flakyKeeper) Reattach(context.Context, string) (sandbox.Process, error) {
	k.calls.Add(1)
	if k.fails.Add(-1) >= 0 {
		return nil, errors.New("dial the init: resource temporarily unavailable")
	}
	return nil, sandbox.ErrNotKept
}

// writeRecord makes a process directory holding an empty output and rec.
func writeRecord(t *testing.T, dir, rec string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	out, err := NewOutputLog(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	out.Close()
	if err := os.WriteFile(filepath.Join(dir, recordFile), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRestoreRecordsNotTrusted (review of issue 35 item 3): a record that
// says it ended with no exit is refused as corrupt (it panicked every
// start), a record whose key is not its own process's is refused, and a
// kept process the sandbox could not be asked about (an error other than
// ErrNotKept) is not declared killed while it may run on: its record
// stays, and it is taken back later.
func TestRestoreRecordsNotTrusted(t *testing.T) {
	root := t.TempDir()
	sp := &sessionProcs{ps: &Processes{}, id: "s", cfg: ProcessConfig{OutputCap: 1 << 20, MaxFinished: 10}.withDefaults(),
		procs: map[string]*Process{}, dir: root}

	_, err := sp.restoreOne(writeRecord(t, filepath.Join(root, "p1"), `{"info":{"processId":"p1","command":"x"},"ended":true}`), nil)
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("ended with no exit: %v", err)
	}
	_, err = sp.restoreOne(writeRecord(t, filepath.Join(root, "p2"), `{"info":{"processId":"p2","command":"x"},"keep":"shell/abc"}`), nil)
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("another's key: %v", err)
	}

	k := &flakyKeeper{}
	k.fails.Store(2)
	dir := writeRecord(t, filepath.Join(root, "p3"), `{"info":{"processId":"p3","command":"x"},"keep":"process/p3"}`)
	before, _ := os.ReadFile(filepath.Join(dir, recordFile))
	if _, err := sp.restoreOne(dir, k); !errors.Is(err, errReattachLater) {
		t.Fatalf("an init that could not be reached: %v, want errReattachLater", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, recordFile)); string(after) != string(before) {
		t.Errorf("the record of a process that may run on was changed: %s", after)
	}
	// Later tries: once more unreachable, then the sandbox says it is gone.
	sp.reattachLater(dir, k, time.Millisecond)
	if k.calls.Load() != 3 {
		t.Errorf("%d calls to Reattach, want 3", k.calls.Load())
	}
	sp.mu.Lock()
	pr := sp.procs["p3"]
	sp.mu.Unlock()
	if pr == nil {
		t.Fatal("the process was not taken back once the sandbox answered")
	}
	if info := pr.Info(); info.Status == StatusRunning || info.ExitSignal != "KILL" {
		t.Errorf("a process the sandbox no longer keeps: %+v", info)
	}
}

// TestKillKeptOrphan: a kept start whose reply was lost leaves a process
// the init keeps with no record; killKept ends it by its key, and the init
// forgets it once its exit is taken.
func TestKillKeptOrphan(t *testing.T) {
	_, s := newManagedSession(t, "linux")
	sb := s.Sandbox()
	k, ok := sandbox.As[sandbox.Keeper](sb)
	if !ok || !k.Keeps() {
		t.Fatal("a linux sandbox does not keep processes")
	}
	ctx := context.Background()
	p, err := sb.Start(ctx, sandbox.Cmd{Keep: "process/p42", Command: "sleep 42431"})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _, _ = p.Wait(); sandbox.Ack(p); close(waited) }()
	killKept(k, "process/p42", slog.New(slog.DiscardHandler))
	// The init forgets the process when it reads the ack, which killKept
	// sends without waiting for it to be read: ask until it is.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		q, err := k.Reattach(ctx, "process/p42")
		if errors.Is(err, sandbox.ErrNotKept) {
			break
		}
		if err == nil {
			// Still kept, its exit not yet forgotten: take it and let go.
			if _, werr := q.Wait(); werr != nil {
				t.Logf("reattached handle: %v", werr)
			}
			sandbox.Ack(q)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after killKept the init still keeps the process: %v", err)
		}
	}
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Error("the first handle's Wait did not return")
	}
	_ = p.Stdin().Close()
	_ = p.Stdout().Close()
	if e := p.Stderr(); e != nil {
		_ = e.Close()
	}
}
