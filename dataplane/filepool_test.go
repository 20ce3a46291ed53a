package dataplane_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// poolSession is a dataplane.Session over a real sandbox that counts the
// processes started through it and keeps its AddConn hooks, which end()
// runs as a session's end does.
type poolSession struct {
	sb sandbox.Sandbox

	mu     sync.Mutex
	procs  []sandbox.Process
	hooks  []func()
	ended  bool
	starts int
}

func (s *poolSession) Sandbox() sandbox.Sandbox { return countingSandbox{s.sb, s} }

func (s *poolSession) RecordCommand(context.Context, gateway.CommandRecord) {}

func (s *poolSession) AddConn(closeFn func()) (func(), bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return func() {}, false
	}
	s.hooks = append(s.hooks, closeFn)
	return func() {}, true
}

func (s *poolSession) end() {
	s.mu.Lock()
	hooks := s.hooks
	s.hooks, s.ended = nil, true
	s.mu.Unlock()
	for _, h := range hooks {
		h()
	}
}

func (s *poolSession) started() (int, []sandbox.Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, append([]sandbox.Process(nil), s.procs...)
}

type countingSandbox struct {
	sandbox.Sandbox
	s *poolSession
}

func (c countingSandbox) Start(ctx context.Context, cmd sandbox.Cmd) (sandbox.Process, error) {
	p, err := c.Sandbox.Start(ctx, cmd)
	if err != nil {
		return nil, err
	}
	tp := &trackedProcess{Process: p, exited: make(chan struct{})}
	c.s.mu.Lock()
	c.s.starts++
	c.s.procs = append(c.s.procs, tp)
	c.s.mu.Unlock()
	return tp, nil
}

// trackedProcess closes exited when its Wait returns.
type trackedProcess struct {
	sandbox.Process
	exited chan struct{}
}

func (p *trackedProcess) Wait() (sandbox.Exit, error) {
	defer close(p.exited)
	return p.Process.Wait()
}

// TestFilesPool: a session's file operations share one SFTP server (before,
// each started its own: 400 link fetches used 251 of a session's pids);
// transfers past the bound are refused with KindBusy; a server that died
// is replaced; the session's end ends it (issue 34, item 2).
func TestFilesPool(t *testing.T) {
	fsb := newFilesSandbox(t, "workdir", filesBinary(t))
	s := &poolSession{sb: fsb.sb}
	p := &dataplane.Files{MaxStreamsPerSession: 2, Idle: time.Minute}
	ctx := context.Background()

	var wg sync.WaitGroup
	fss := make([]*dataplane.FS, 8)
	for i := range fss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := p.Open(ctx, "s1", "t1", s, false)
			if err != nil {
				t.Error(err)
				return
			}
			fss[i] = f
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, f := range fss {
		if _, err := f.Stat("."); err != nil {
			t.Error(err)
		}
		f.Close()
	}
	if n, _ := s.started(); n != 1 || p.Servers() != 1 {
		t.Errorf("8 operations started %d servers (%d kept), want 1", n, p.Servers())
	}

	// Transfers: two at once per session.
	a, err := p.Open(ctx, "s1", "t1", s, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Open(ctx, "s1", "t1", s, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Open(ctx, "s1", "t1", s, true); kindOf(err) != dataplane.KindBusy || !strings.Contains(err.Error(), "per session") {
		t.Errorf("a third transfer: %v, want KindBusy", err)
	}
	a.Close()
	a.Close() // twice is once
	c, err := p.Open(ctx, "s1", "t1", s, true)
	if err != nil {
		t.Fatalf("a transfer after one ended: %v", err)
	}
	b.Close()
	c.Close()

	// The server dies (the sandbox's user may kill it): the next
	// operation gets a new one.
	_, procs := s.started()
	// Not Kill: under workdir it also kills, later, every process tagged
	// with the sandbox's id, which the next test's sandbox shares.
	if err := procs[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := p.Open(ctx, "s1", "t1", s, false)
		if err == nil {
			_, serr := f.Stat(".")
			f.Close()
			if serr == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no working server after the first died: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	n, procs := s.started()
	if n != 2 {
		t.Errorf("%d servers started, want 2", n)
	}

	// The session's end ends its server, and no new one starts for it.
	s.end()
	select {
	case <-procs[len(procs)-1].(*trackedProcess).exited:
	case <-time.After(10 * time.Second):
		t.Error("the session ended and its SFTP server still runs")
	}
	if p.Servers() != 0 {
		t.Errorf("%d servers kept after the session's end", p.Servers())
	}
	if _, err := p.Open(ctx, "s1", "t1", s, false); kindOf(err) != dataplane.KindUnavailable {
		t.Errorf("open after the end: %v, want KindUnavailable", err)
	}
}

// TestFilesClose: the pool's Close (the gateway's shutdown, Plane.Close)
// ends a server kept idle, and one in use once its last FS closes
// (issue 36).
func TestFilesClose(t *testing.T) {
	fsb := newFilesSandbox(t, "workdir", filesBinary(t))
	s := &poolSession{sb: fsb.sb}
	t.Cleanup(s.end)
	p := &dataplane.Files{Idle: time.Hour}
	ctx := context.Background()
	exited := func(i int) <-chan struct{} {
		_, procs := s.started()
		return procs[i].(*trackedProcess).exited
	}
	f, err := p.Open(ctx, "s1", "t1", s, false)
	if err != nil {
		t.Fatal(err)
	}
	f.Close() // kept idle for an hour
	g, err := p.Open(ctx, "s2", "t1", s, false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Servers() != 2 {
		t.Fatalf("%d servers, want 2", p.Servers())
	}
	p.Close()
	if p.Servers() != 0 {
		t.Errorf("%d servers kept after Close", p.Servers())
	}
	select {
	case <-exited(0):
	case <-time.After(10 * time.Second):
		t.Error("the idle server still runs after Close")
	}
	if _, err := g.Stat("."); err != nil {
		t.Errorf("a server in use stopped serving at Close: %v", err)
	}
	g.Close()
	select {
	case <-exited(1):
	case <-time.After(10 * time.Second):
		t.Error("the server in use still runs after its last FS closed")
	}
}

// TestStreamFileWindows: a download read through its windows (one packet,
// then wider past 8 MiB), whole and from seeks, gives the file's bytes.
func TestStreamFileWindows(t *testing.T) {
	fsb := newFilesSandbox(t, "workdir", filesBinary(t))
	f := fsb.open(t)
	data := make([]byte, 21<<20+12345)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	if _, _, err := f.Write("big.bin", bytes.NewReader(data), dataplane.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, f, "big.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("whole read: %d bytes, equal %v, err %v", len(got), bytes.Equal(got, data), err)
	}
	rc, _, err := f.Open("big.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, off := range []int64{0, 1, 255<<10 - 1, 9 << 20, 20<<20 + 3, int64(len(data)) - 10, 5} {
		if _, err := rc.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 600<<10)
		n, err := io.ReadFull(rc, buf)
		if err != nil && err != io.ErrUnexpectedEOF {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(buf[:n], data[off:off+int64(n)]) || (n < len(buf) && off+int64(n) != int64(len(data))) {
			t.Errorf("read at %d: %d bytes, not the file's", off, n)
		}
	}
}
