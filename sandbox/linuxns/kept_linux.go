//go:build linux

package linuxns

import (
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/procio"
)

// keptReader is a kept process's stdout or stderr in the gateway. When
// the gateway stops and leaves the sandbox for the next one (Detach), it
// stops reading without losing a byte: a read waiting for data gives up
// without taking any (a deadline, through the runtime's poller), and a
// read that took data is waited for until its caller comes back for
// more, so that what it read has been stored. What the process writes
// after that waits in the pipe for the next gateway.
type keptReader struct {
	f *os.File

	mu       sync.Mutex
	changed  *sync.Cond
	reading  bool // a Read is in the system call
	busy     bool // a Read returned data its caller has not yet come back from
	stopping bool
}

func newKeptReader(f *os.File) *keptReader {
	r := &keptReader{f: f}
	r.changed = sync.NewCond(&r.mu)
	return r
}

func (r *keptReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	r.busy = false // the caller is done with the last read's data
	if r.stopping {
		r.changed.Broadcast()
		r.mu.Unlock()
		return 0, io.EOF
	}
	r.reading = true
	r.mu.Unlock()
	n, err := r.f.Read(p)
	r.mu.Lock()
	r.reading = false
	r.busy = n > 0
	if r.stopping && n == 0 {
		err = io.EOF // the deadline that stop set: the gateway lets go
	}
	r.changed.Broadcast()
	r.mu.Unlock()
	return n, err
}

func (r *keptReader) Close() error { return r.f.Close() }

// SyscallConn is the pipe's (syscall.Conn): the reader of a command's
// output asks it how much is still buffered.
func (r *keptReader) SyscallConn() (syscall.RawConn, error) { return r.f.SyscallConn() }

// stop ends reading as described above, waiting at most until deadline
// for the caller to store what it read.
func (r *keptReader) stop(deadline time.Time) {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	_ = r.f.SetReadDeadline(time.Now()) // a waiting read returns, taking nothing
	timer := time.AfterFunc(time.Until(deadline), func() {
		r.mu.Lock()
		r.changed.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for (r.reading || r.busy) && time.Now().Before(deadline) {
		r.changed.Wait()
	}
}

// shrinkPipes gives the command's pipes the kernel's default capacity
// back before the gateway lets go of them for good (Release, KeepAs):
// the gateway grew its input and output pipes (procio.GrowPipeFD) as a
// privileged user, but a restore recreates them at their size as the
// sandbox's unprivileged user, whose pipes count against
// fs.pipe-user-pages-soft (16,384 pages: 64 pipes of 1 MiB). 30-odd kept
// commands' output pipes made every resume fail; the input pipes of 64
// background processes (their most, open for input) made every fork's
// restore fail. A pipe holding more than the default keeps its size.
func (p *initProcess) shrinkPipes() {
	for _, r := range []any{p.stdin, p.stdout, p.stderr} {
		sc, ok := r.(syscall.Conn)
		if !ok {
			continue
		}
		if rc, err := sc.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { procio.ShrinkPipeFD(int(fd)) })
		}
	}
}

// keptGrace bounds how long Detach waits for kept processes' output in
// flight to be stored.
const keptGrace = 2 * time.Second

// trackKept registers p, a kept process, so that Detach stops its output
// cleanly; the returned function unregisters it.
func (s *linuxSandbox) trackKept(p *initProcess) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kept == nil {
		s.kept = map[*initProcess]struct{}{}
	}
	s.kept[p] = struct{}{}
	p.untrack = func() {
		s.mu.Lock()
		delete(s.kept, p)
		s.mu.Unlock()
	}
}

// stopKept stops reading every kept process's output (Detach).
func (s *linuxSandbox) stopKept() {
	s.mu.Lock()
	var readers []*keptReader
	for p := range s.kept {
		p.detached.Store(true)
		for _, r := range []io.ReadCloser{p.stdout, p.stderr} {
			if kr, ok := r.(*keptReader); ok {
				readers = append(readers, kr)
			}
		}
	}
	s.mu.Unlock()
	deadline := time.Now().Add(keptGrace)
	var wg sync.WaitGroup
	for _, r := range readers {
		wg.Go(func() { r.stop(deadline) })
	}
	wg.Wait()
}
