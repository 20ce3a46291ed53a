package procio

import (
	"io"
	"sync/atomic"
	"time"
)

// Output is a process's stdout or stderr, read through it so that Drain
// knows what its reader took after the process ended.
type Output struct {
	r io.ReadCloser
	// owed is how many bytes the stream held unread when Drain began
	// (mark): everything the process wrote before it ended and its
	// reader had not yet taken. counted is what the reads begun after
	// mark took: a pipe hands bytes out in order, so once counted
	// reaches owed every one of those bytes has been read.
	owed    int
	marked  atomic.Bool
	counted atomic.Int64
}

// NewOutput returns r read through an Output (nil for a nil r: the
// stderr of a process on a terminal).
func NewOutput(r io.ReadCloser) *Output {
	if r == nil {
		return nil
	}
	return &Output{r: r}
}

func (o *Output) Read(p []byte) (int, error) {
	counting := o.marked.Load() // before the read: it starts after mark
	n, err := o.r.Read(p)
	if counting {
		o.counted.Add(int64(n))
	}
	return n, err
}

// Close closes the stream; a read waiting on it returns.
func (o *Output) Close() error { return o.r.Close() }

// mark notes what the stream holds unread now. The count comes first:
// a read counted after it cannot have taken bytes before it (the
// conservative way round; a read under way at mark is not counted).
func (o *Output) mark() {
	o.owed = Buffered(o.r)
	o.marked.Store(true)
}

// delivered reports whether every byte the stream held at mark has been
// read: nothing is left unread in it, or reads since took as many.
func (o *Output) delivered() bool {
	return o.owed == 0 || o.counted.Load() >= int64(o.owed) || Buffered(o.r) == 0
}

// Drain ends the reading of a process's output streams once the process
// has ended, then closes them; done is closed when every reader of outs
// has come to the end of its stream. Output the process wrote before it
// ended is never dropped, however slowly its reader goes (the machine's
// load, a slow SSH client): as OpenSSH's sshd, which reads a command's
// pipes to EOF. Only a background process that keeps a stream open is
// not waited for: a grace after the process ended, once the bytes
// buffered then have been read, the streams are closed (what the
// background process writes after that is dropped) and Drain waits for
// the readers to stop. What is left is bounded by the pipes' capacity,
// taken at the reader's pace. A stream whose buffered bytes cannot be
// known (not linux, no descriptor) gets the grace only.
func Drain(done <-chan struct{}, grace time.Duration, outs ...*Output) {
	defer func() {
		for _, o := range outs {
			if o != nil {
				_ = o.Close()
			}
		}
	}()
	select {
	case <-done:
		return
	default:
	}
	for _, o := range outs {
		if o != nil {
			o.mark()
		}
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if allDelivered(outs) {
			// A background process holds the output open.
			for _, o := range outs {
				if o != nil {
					_ = o.Close()
				}
			}
			<-done
			return
		}
		t.Reset(grace)
	}
}

func allDelivered(outs []*Output) bool {
	for _, o := range outs {
		if o != nil && !o.delivered() {
			return false
		}
	}
	return true
}
