package dataplane

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// readBytes reads o from off to its end, as one stream of bytes.
func readBytes(t *testing.T, o *OutputLog, off int64) []byte {
	t.Helper()
	r := o.NewReader(off)
	var b []byte
	for {
		c, err := r.Next(context.Background(), false)
		if errors.Is(err, io.EOF) {
			return b
		}
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, c.Data...)
	}
}

// TestOutputLogReopen: an output kept in files is found again by the next
// gateway (OpenOutputLog) with its offsets, what it kept, and a frame cut
// short by a crash dropped; writes then go on at the offset it had.
func TestOutputLogReopen(t *testing.T) {
	dir := t.TempDir()
	o, err := NewOutputLog(dir, 4096) // segments of 256 bytes: some dropped
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for i := range 300 {
		line := []byte(strings.Repeat("x", i%40) + "\n")
		stream := Stdout
		if i%3 == 0 {
			stream = Stderr
		}
		if err := o.Write(stream, line); err != nil {
			t.Fatal(err)
		}
		all.Write(line)
	}
	start, end := o.Start(), o.End()
	if start == 0 {
		t.Fatal("nothing was dropped: the test needs a longer output")
	}
	// A crash in the middle of a frame: its header and part of its data.
	segs, _ := filepath.Glob(filepath.Join(dir, "seg-*"))
	last := segs[len(segs)-1]
	f, err := os.OpenFile(last, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write([]byte{1, 0, 0, 0, 9, 'c', 'u'})
	f.Close()

	r, err := OpenOutputLog(dir, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if r.Start() != start || r.End() != end {
		t.Fatalf("reopened at [%d, %d), want [%d, %d)", r.Start(), r.End(), start, end)
	}
	if got := readBytes(t, r, start); !bytes.Equal(got, all.Bytes()[start:]) {
		t.Fatalf("reopened output differs from what was written")
	}
	if err := r.Write(Stdout, []byte("more\n")); err != nil {
		t.Fatal(err)
	}
	if got := readBytes(t, r, end); string(got) != "more\n" {
		t.Errorf("after the reopen, offset %d reads %q", end, got)
	}
	if err := r.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed output's directory: %v", err)
	}
}

// TestProcessesTenantOutputBound: a tenant's processes count against one
// bound over all its sessions (a running one its cap, a finished one what
// it keeps); a start past it forgets the tenant's oldest finished
// processes, in any session, then fails with ErrOutputLimit; other
// tenants have their own.
func TestProcessesTenantOutputBound(t *testing.T) {
	mgr, s1 := newManagedSession(t, "workdir")
	ctx := context.Background()
	s2, _, err := mgr.Create(ctx, gateway.Principal{Tenant: "t"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := mgr.Create(ctx, gateway.Principal{Tenant: "u"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	ps := &Processes{}
	cfg := ProcessConfig{StateDir: t.TempDir(), OutputCap: 1 << 20, TenantOutputBytes: 2<<20 + 100}
	start := func(s *gateway.Session, cmd string) (*Process, error) {
		t.Helper()
		info, err := ps.Start(ctx, s, cfg, StartRequest{Command: cmd})
		if err != nil {
			return nil, err
		}
		p, _ := ps.Get(s.ID, info.ProcessID)
		return p, nil
	}
	done, err := start(s1, "echo hi")
	if err != nil {
		t.Fatal(err)
	}
	<-done.Done()
	if got := ps.Charged("t"); got != done.Output().Stored() || got == 0 {
		t.Errorf("a finished process counts %d, want what it keeps (%d)", got, done.Output().Stored())
	}
	if _, err := start(s1, "sleep 60"); err != nil {
		t.Fatal(err)
	}
	if _, err := start(s2, "sleep 60"); err != nil {
		t.Fatal(err) // 2 MiB and a few bytes: within the bound
	}
	if _, err := start(s2, "sleep 60"); !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("a third running process: %v, want ErrOutputLimit", err)
	}
	if _, ok := ps.Get(s1.ID, done.Info().ProcessID); ok {
		t.Error("the tenant's finished process, in another session, was not forgotten to make room")
	}
	if got := ps.Charged("t"); got != 2<<20 {
		t.Errorf("the tenant counts %d, want its two running processes' caps", got)
	}
	if _, err := start(other, "sleep 60"); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	for _, s := range []*gateway.Session{s1, s2} {
		if err := mgr.Delete(ctx, gateway.Principal{Tenant: "t"}, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for ps.Charged("t") != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ps.Charged("t"); got != 0 {
		t.Errorf("after its sessions ended the tenant counts %d", got)
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(entries)
}

// TestShellDeleteLeavesNoDescriptor: deleting a shell closes what its
// clean-up command held (its output pipes leaked, two per shell).
func TestShellDeleteLeavesNoDescriptor(t *testing.T) {
	_, s := newManagedSession(t, "workdir")
	sh := &Shells{}
	req := Request{Command: "true", Timeout: 30 * time.Second, MaxOutputBytes: 1 << 10}
	run := func(name string) {
		if _, err := sh.Run(context.Background(), s.ID, s, name, req); err != nil {
			t.Fatal(err)
		}
		if err := sh.Delete(s.ID, name); err != nil {
			t.Fatal(err)
		}
	}
	run("warm") // what the first start opens for good
	before := openFDs(t)
	for i := range 5 {
		run("s" + strconv.Itoa(i))
	}
	// Delete closes them itself (a garbage collection would, later).
	if after := openFDs(t); after > before {
		t.Errorf("5 shells made and deleted left %d descriptors open", after-before)
	}
}

// TestProcessesEndedFreesRoomFirst: once a process is seen ended (its
// Info), its charge is already what it keeps, not its cap: a client that
// polls for the end and starts another at once, as the tenant's bound
// asks, is not refused for room the ended one no longer holds.
func TestProcessesEndedFreesRoomFirst(t *testing.T) {
	_, s := newManagedSession(t, "workdir")
	ctx := context.Background()
	ps := &Processes{}
	cfg := ProcessConfig{StateDir: t.TempDir(), OutputCap: 1 << 20}
	for i := range 20 {
		info, err := ps.Start(ctx, s, cfg, StartRequest{Command: "echo hi"})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := ps.Get(s.ID, info.ProcessID)
		for p.Info().Status == StatusRunning {
			runtime.Gosched()
		}
		if got := ps.Charged(s.Tenant); got >= 1<<20 {
			t.Fatalf("run %d: a process seen ended still counts %d (its cap), not what it keeps", i, got)
		}
		<-p.Done()
	}
}
