package audit

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestFileSyncOutsideLock: while an fsync is held, Records go on (the
// sync runs outside the mutex), and the held sync still completes.
func TestFileSyncOutsideLock(t *testing.T) {
	f, err := OpenFile(FileConfig{Path: filepath.Join(t.TempDir(), "audit.log"), SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	f.syncFile = func(fh *os.File) error {
		entered <- struct{}{}
		<-release
		return fh.Sync()
	}
	f.Record(context.Background(), Event{Kind: KindSession, Tenant: "t"})
	synced := make(chan struct{})
	go func() { f.sync(); close(synced) }()
	<-entered // the sync is in progress, held
	recorded := make(chan struct{})
	go func() {
		for range 10 {
			f.Record(context.Background(), Event{Kind: KindSession, Tenant: "t"})
		}
		p, _ := f.Query(Filter{Tenant: "t"})
		if len(p.Events) != 11 {
			t.Errorf("%d events, want 11", len(p.Events))
		}
		close(recorded)
	}()
	select {
	case <-recorded:
	case <-synced:
		t.Fatal("the sync ended before it was released")
	}
	close(release)
	<-synced
	f.syncFile = (*os.File).Sync
}

// TestFileConcurrentRecordSyncRotate: Records from many goroutines,
// fsyncs every tick and rotations all the time (run it with -race): no
// event is lost, seq has no gap across the files, no goroutine is left.
func TestFileConcurrentRecordSyncRotate(t *testing.T) {
	defer goleak.VerifyNone(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	f, err := OpenFile(FileConfig{Path: path, MaxSize: 4 << 10, MaxFiles: 200, SyncEvery: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				f.Record(context.Background(), Event{Kind: KindCommand, Tenant: "t", Command: strconv.Itoa(g) + "/" + strconv.Itoa(i)})
				if i%10 == 0 {
					f.sync()
				}
			}
		}()
	}
	wg.Wait()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".10"); err != nil {
		t.Fatalf("few rotations: %v", err)
	}
	f2, err := OpenFile(FileConfig{Path: path, MaxSize: 4 << 10, MaxFiles: 200, SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	p, err := f2.Query(Filter{Tenant: "t", Limit: MaxQueryLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != 800 {
		t.Fatalf("%d events, want 800", len(p.Events))
	}
	for i, e := range p.Events {
		if e.Seq != uint64(800-i) {
			t.Fatalf("event %d has seq %d, want %d", i, e.Seq, 800-i)
		}
	}
}

// TestQueryScanBudget: an old since over a log of another tenant's events
// reads at most the budget per call, answers the cursor to go on, and the
// pages together give the tenant's events once each, across a rotation
// between two pages.
func TestQueryScanBudget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	const budget = 8 << 10
	f, err := OpenFile(FileConfig{Path: path, MaxSize: 64 << 10, MaxFiles: 8, SyncEvery: -1, QueryScanBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	start := time.Now().Add(-time.Hour)
	want := 0
	for i := range 1000 {
		tenant := "bob"
		if i%200 == 0 {
			tenant, want = "alice", want+1
		}
		f.Record(ctx, Event{Kind: KindCommand, Tenant: tenant, Time: start.Add(time.Duration(i) * time.Second), Command: "echo " + strconv.Itoa(i)})
	}
	var got []Event
	cursor, pages := "", 0
	for {
		p, err := f.Query(Filter{Tenant: "alice", Since: start, Cursor: cursor, Limit: MaxQueryLimit})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Events...)
		pages++
		if p.Next == "" {
			break
		}
		if pages > 1000 {
			t.Fatal("pages do not end")
		}
		if pages == 3 { // rotations move the cursor's line to another file
			for range 600 {
				f.Record(ctx, Event{Kind: KindCommand, Tenant: "bob", Command: "later"})
			}
		}
		cursor = p.Next
	}
	if len(got) != want {
		t.Fatalf("alice got %d events, want %d: %+v", len(got), want, got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq >= got[i-1].Seq {
			t.Fatalf("not newest first or twice: %d after %d", got[i].Seq, got[i-1].Seq)
		}
	}
	// The log is over 100 KiB: one page cannot have read it all.
	if min := 100 << 10 / (budget + 1<<10); pages < min {
		t.Errorf("%d pages, want at least %d under an %d-byte budget", pages, min, budget)
	}
	// A bare seq (an older cursor form) goes on from the same event.
	p, err := f.Query(Filter{Tenant: "alice", Cursor: strconv.FormatUint(got[0].Seq, 10), Limit: MaxQueryLimit})
	if err != nil {
		t.Fatal(err)
	}
	for p.Next != "" && len(p.Events) == 0 {
		p, err = f.Query(Filter{Tenant: "alice", Cursor: p.Next, Limit: MaxQueryLimit})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(p.Events) == 0 || p.Events[0].Seq != got[1].Seq {
		t.Fatalf("after a bare seq cursor: %+v, want seq %d first", p.Events, got[1].Seq)
	}
}

// TestQueryTenantExact: the pre-filter matches the tenant field exactly:
// not a tenant whose name extends it, nor the text of another tenant's
// command that spells the field.
func TestQueryTenantExact(t *testing.T) {
	f := openTest(t, filepath.Join(t.TempDir(), "audit.log"), 1<<20, 2)
	ctx := context.Background()
	f.Record(ctx, Event{Kind: KindCommand, Tenant: "alice2", Command: "x"})
	f.Record(ctx, Event{Kind: KindCommand, Tenant: "bob", Command: `echo '"tenant":"alice"'`})
	f.Record(ctx, Event{Kind: KindCommand, Tenant: "bob", Session: `","tenant":"alice`})
	f.Record(ctx, Event{Kind: KindCommand, Tenant: `a"b<c>`, Command: "odd"})
	f.Record(ctx, Event{Kind: KindCommand, Tenant: "alice", Command: "mine"})
	p, err := f.Query(Filter{Tenant: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != 1 || p.Events[0].Command != "mine" {
		t.Fatalf("alice sees %+v", p.Events)
	}
	p, _ = f.Query(Filter{Tenant: `a"b<c>`})
	if len(p.Events) != 1 || p.Events[0].Command != "odd" {
		t.Fatalf(`a"b<c> sees %+v`, p.Events)
	}
}

// TestQueryBareCursorPassesFilesWithoutOlderLine: a bare seq cursor (one
// whose offset is not known) finds its boundary in the first file whose
// first valid line is older than it: an empty current file (a failed
// write after a rotation) or one that starts with a torn line is passed
// over, not taken for the boundary, so nothing newer than the cursor
// comes back.
func TestQueryBareCursorPassesFilesWithoutOlderLine(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.log")
	f := openTest(t, src, 1<<20, 2)
	for range 12 {
		f.Record(context.Background(), Event{Kind: KindSession, Tenant: "t"})
	}
	f.Close()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n") // lines[i] has seq i+1
	path := filepath.Join(dir, "audit.log")
	for name, current := range map[string]string{
		"empty":      "",
		"torn":       `{"se` + "\n" + lines[10] + lines[11],
		"garbage":    "garbage\n" + lines[10] + lines[11],
		"newer-only": lines[10] + lines[11],
	} {
		t.Run(name, func(t *testing.T) {
			write := func(p, s string) {
				if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write(rotated(path, 2), strings.Join(lines[0:5], ""))  // 1..5
			write(rotated(path, 1), strings.Join(lines[5:10], "")) // 6..10
			write(path, current)
			q, err := OpenFile(FileConfig{Path: path, MaxSize: 1 << 20, MaxFiles: 3, SyncEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			for cur, want := range map[string]string{"4": "3,2,1", "8": "7,6,5,4,3", "6": "5,4,3,2,1"} {
				p, err := q.Query(Filter{Tenant: "t", Cursor: cur, Limit: 5})
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, e := range p.Events {
					got = append(got, strconv.FormatUint(e.Seq, 10))
				}
				if strings.Join(got, ",") != want {
					t.Errorf("cursor %s: events %v, want %s", cur, got, want)
				}
			}
		})
	}
}

// TestQueryAfter: After answers only the events newer than the one it
// names, and stops the scan there: the rest of the log (other tenants'
// events in between included) is not read, so no cursor follows.
func TestQueryAfter(t *testing.T) {
	f := openTest(t, filepath.Join(t.TempDir(), "audit.log"), 1<<20, 2)
	ctx := context.Background()
	for i := range 10 {
		tenant := "alice"
		if i%2 == 1 {
			tenant = "bob"
		}
		f.Record(ctx, Event{Kind: KindCommand, Tenant: tenant, Command: strconv.Itoa(i)})
	}
	all, err := f.Query(Filter{Tenant: "alice"})
	if err != nil || len(all.Events) != 5 {
		t.Fatalf("alice's events: %v %+v", err, all)
	}
	after := all.Events[2].Seq // "4"
	p, err := f.Query(Filter{Tenant: "alice", After: after, Limit: 1})
	if err != nil || len(p.Events) != 1 || p.Events[0].Command != "8" || p.Next == "" {
		t.Fatalf("after %d, limit 1: %v %+v", after, err, p)
	}
	p, err = f.Query(Filter{Tenant: "alice", After: after})
	if err != nil || len(p.Events) != 2 || p.Events[0].Command != "8" || p.Events[1].Command != "6" || p.Next != "" {
		t.Fatalf("after %d: %v %+v, want 8 and 6, no cursor", after, err, p)
	}
	p, err = f.Query(Filter{Tenant: "alice", After: all.Events[0].Seq})
	if err != nil || len(p.Events) != 0 || p.Next != "" {
		t.Fatalf("after the newest: %v %+v", err, p)
	}
}

// TestQueryScanBytes: a filter's ScanBytes lowers the query's budget (not
// above the log's), and ScanLeft says what the query left of it.
func TestQueryScanBytes(t *testing.T) {
	const budget = 64 << 10
	f, err := OpenFile(FileConfig{Path: filepath.Join(t.TempDir(), "audit.log"), SyncEvery: -1, QueryScanBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 2000 {
		f.Record(context.Background(), Event{Kind: KindCommand, Tenant: "bob", Command: "echo " + strconv.Itoa(i)})
	}
	full, err := f.Query(Filter{Tenant: "alice", Limit: MaxQueryLimit})
	if err != nil || full.Next == "" || full.ScanLeft != 0 {
		t.Fatalf("the log's budget: next %q, left %d, %v", full.Next, full.ScanLeft, err)
	}
	small, err := f.Query(Filter{Tenant: "alice", Limit: MaxQueryLimit, ScanBytes: 4 << 10})
	if err != nil || small.Next == "" || small.ScanLeft != 0 {
		t.Fatalf("a 4 KiB budget: next %q, left %d, %v", small.Next, small.ScanLeft, err)
	}
	fs, _ := strconv.ParseUint(strings.SplitN(full.Next, ".", 2)[0], 10, 64)
	ss, _ := strconv.ParseUint(strings.SplitN(small.Next, ".", 2)[0], 10, 64)
	if ss <= fs || ss < 1900 {
		t.Errorf("a 4 KiB budget stopped at seq %d, the log's %d-byte one at %d: want it far nearer the end", ss, budget, fs)
	}
	big, err := f.Query(Filter{Tenant: "alice", Limit: MaxQueryLimit, ScanBytes: budget * 4})
	if err != nil || big.Next != full.Next {
		t.Errorf("a ScanBytes over the log's budget raised it: next %q, want %q (%v)", big.Next, full.Next, err)
	}
	one, err := f.Query(Filter{Tenant: "bob", Limit: 1})
	if err != nil || len(one.Events) != 1 || one.ScanLeft <= 0 || one.ScanLeft >= budget {
		t.Errorf("one event read: left %d of %d (%v)", one.ScanLeft, budget, err)
	}
}
