package dataplane

import (
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestDrainKeepsBufferedOutput: what a command wrote before it ended is
// answered even when the reader of its output runs late (the soak saw
// `cat` answer exit 0 and no output on a loaded machine: its output was
// still in the pipe when the grace ran out and the pipe was closed); a
// stream held open by a background process, with nothing buffered, is
// still closed after the grace.
func TestDrainKeepsBufferedOutput(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("buffered output is seen on linux")
	}
	const grace = 50 * time.Millisecond
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("soak\n"); err != nil {
		t.Fatal(err)
	}
	w.Close() // the command ended
	var readers sync.WaitGroup
	var got []byte
	readers.Add(1)
	go func() {
		defer readers.Done()
		time.Sleep(4 * grace) // held back by the load
		got, _ = io.ReadAll(r)
	}()
	drain(&readers, grace, r)
	if string(got) != "soak\n" {
		t.Errorf("output read late: %q, want %q", got, "soak\n")
	}

	r, w, err = os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // a background process keeps it open
	readers.Add(1)
	go func() {
		defer readers.Done()
		_, _ = io.Copy(io.Discard, r)
	}()
	start := time.Now()
	drain(&readers, grace, r)
	if d := time.Since(start); d > drainRounds*grace {
		t.Errorf("a stream held open with nothing buffered was drained for %v", d)
	}
}
