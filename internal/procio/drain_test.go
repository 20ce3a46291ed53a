package procio_test

import (
	"bytes"
	"io"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/procio"
)

const grace = 50 * time.Millisecond

// pipeOutput is a pipe's read end as an Output, and its write end: the
// process's, or a background process's that keeps it open.
func pipeOutput(t *testing.T) (*procio.Output, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return procio.NewOutput(r), w
}

// read copies out into got, as a reader that runs late (the machine's
// load) and then slowly (a slow client), and closes done at its end.
func read(out io.Reader, late, pace time.Duration) (got *bytes.Buffer, done chan struct{}) {
	got, done = &bytes.Buffer{}, make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(late)
		buf := make([]byte, 4<<10)
		for {
			n, err := out.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				return
			}
			time.Sleep(pace)
		}
	}()
	return got, done
}

// TestDrainKeepsBufferedOutput: what a process wrote before it ended
// reaches its reader however late and slowly that reads (the soak saw
// `cat` answer exit 0 and no output on a loaded machine, and an SSH
// client that read slowly lost the end of its output: the pipe was
// closed a grace after the end with bytes still in it), also when a
// background process keeps the pipe open; a stream held open with
// nothing of the process's left in it is still closed after the grace,
// and so is one a background process keeps writing to.
func TestDrainKeepsBufferedOutput(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("buffered output is seen on linux")
	}
	burst := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB: a default pipe's capacity

	t.Run("ended, read late", func(t *testing.T) {
		out, w := pipeOutput(t)
		if _, err := w.Write(burst); err != nil {
			t.Fatal(err)
		}
		w.Close() // the process ended
		got, done := read(out, 4*grace, 0)
		procio.Drain(done, grace, out)
		if !bytes.Equal(got.Bytes(), burst) {
			t.Errorf("read %d bytes, want all %d", got.Len(), len(burst))
		}
	})

	t.Run("held open, read slowly", func(t *testing.T) {
		out, w := pipeOutput(t)
		if _, err := w.Write(burst); err != nil {
			t.Fatal(err)
		}
		// A background process keeps w open.
		// 16 reads of 4 KiB, 16 graces in all.
		got, done := read(out, 2*grace, grace)
		procio.Drain(done, grace, out)
		if !bytes.Equal(got.Bytes(), burst) {
			t.Errorf("read %d bytes, want all %d", got.Len(), len(burst))
		}
	})

	t.Run("held open, nothing left", func(t *testing.T) {
		out, _ := pipeOutput(t)
		_, done := read(out, 0, 0)
		start := time.Now()
		procio.Drain(done, grace, out)
		if d := time.Since(start); d > 20*grace {
			t.Errorf("a stream held open with nothing buffered was drained for %v", d)
		}
	})

	t.Run("held open, written on", func(t *testing.T) {
		out, w := pipeOutput(t)
		stop := make(chan struct{})
		defer close(stop)
		go func() { // `yes &`
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := w.Write(burst); err != nil {
					return
				}
			}
		}()
		_, done := read(out, 0, time.Millisecond)
		time.Sleep(grace) // the pipe fills
		start := time.Now()
		procio.Drain(done, grace, out)
		if d := time.Since(start); d > 100*grace {
			t.Errorf("a stream a background process writes on was drained for %v", d)
		}
	})
}
