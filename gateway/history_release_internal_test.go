package gateway

import (
	"context"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

// endedProc is a kept process that has ended: Wait answers its exit at
// once; Release is a sandbox.Releaser's (the pause lets go of it).
type endedProc struct{}

func (endedProc) Stdin() io.WriteCloser       { return nopWriteCloser{} }
func (endedProc) Stdout() io.ReadCloser       { return io.NopCloser(strings.NewReader("")) }
func (endedProc) Stderr() io.ReadCloser       { return nil }
func (endedProc) Resize(sandbox.Window) error { return nil }
func (endedProc) Signal(syscall.Signal) error { return nil }
func (endedProc) Wait() (sandbox.Exit, error) { return sandbox.Exit{Code: 3}, nil }
func (endedProc) Kill()                       {}
func (endedProc) Report() map[string]any      { return nil }
func (endedProc) Release()                    {}

type nopWriteCloser struct{}

func (nopWriteCloser) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriteCloser) Close() error                { return nil }

// TestReattachedAfterItsEndRecordsOnce: a process whose Wait has seen its
// end (recorded in the history) and which a pause lets go of before its
// reader records that end (dataplane takes it back after the resume, and
// its exit again) is in the history once.
func TestReattachedAfterItsEndRecordsOnce(t *testing.T) {
	s := &Session{ID: "sbx-test", Tenant: "t"}
	old := s.record(context.Background(), "exit 3", StartOptions{Record: true, Source: "rest", ProcessID: "p1"}, endedProc{})
	if _, err := old.Wait(); err != nil {
		t.Fatal(err)
	}
	old.(sandbox.Releaser).Release() // the pause lands then
	p := Reattached(old, endedProc{})
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if h := s.History(); len(h) != 1 || h[0].ExitCode == nil || *h[0].ExitCode != 3 {
		t.Fatalf("history %+v, want the exit once", h)
	}
	if held := s.heldCommands(); held != "" {
		t.Errorf("commands under way: %q", held)
	}
}
