package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTest(t *testing.T, path string, maxSize int64, maxFiles int) *File {
	t.Helper()
	f, err := OpenFile(FileConfig{Path: path, MaxSize: maxSize, MaxFiles: maxFiles, SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestFileRotatesAndQueries: events spread over rotated files come back
// newest first, in pages, per tenant and session, across a reopen.
func TestFileRotatesAndQueries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	f := openTest(t, path, 2048, 4)
	ctx := WithRequest(context.Background(), Request{ID: "r1", Tenant: "alice", Auth: "api_key"})
	for i := range 100 {
		tenant := "alice"
		if i%3 == 0 {
			tenant = "bob"
		}
		f.Record(ctx, Event{Kind: KindCommand, Tenant: tenant, Session: "s" + strconv.Itoa(i%2), Command: "echo " + strconv.Itoa(i)})
	}
	for n := 1; n < 4; n++ {
		if _, err := os.Stat(path + "." + strconv.Itoa(n)); err != nil {
			t.Fatalf("rotated file %d: %v", n, err)
		}
	}
	if _, err := os.Stat(path + ".4"); err == nil {
		t.Fatal("more than 4 files kept")
	}
	all, err := f.Query(Filter{Tenant: "alice", Limit: MaxQueryLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Events) == 0 || all.Next != "" {
		t.Fatalf("alice: %d events, next %q", len(all.Events), all.Next)
	}
	for i, e := range all.Events {
		if e.Tenant != "alice" || e.RequestID != "r1" || e.Auth != "api_key" {
			t.Fatalf("event %+v", e)
		}
		if i > 0 && e.Seq != all.Events[i-1].Seq-1 && e.Seq >= all.Events[i-1].Seq {
			t.Fatalf("order: %d after %d", e.Seq, all.Events[i-1].Seq)
		}
	}
	if all.Events[0].Seq != 99 { // 100 is bob's
		t.Errorf("newest seq %d, want 99", all.Events[0].Seq)
	}
	// Pages of 7 of session s1 give the same events as one query.
	one, _ := f.Query(Filter{Tenant: "alice", Session: "s1", Limit: MaxQueryLimit})
	var paged []Event
	cursor := ""
	for {
		p, err := f.Query(Filter{Tenant: "alice", Session: "s1", Limit: 7, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, p.Events...)
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	if len(paged) != len(one.Events) {
		t.Fatalf("paged %d, one query %d", len(paged), len(one.Events))
	}
	for i := range paged {
		if paged[i].Seq != one.Events[i].Seq || paged[i].Session != "s1" {
			t.Fatalf("page event %d: %+v vs %+v", i, paged[i], one.Events[i])
		}
	}
	if _, err := f.Query(Filter{Tenant: "alice", Cursor: "x"}); !errors.Is(err, ErrBadCursor) {
		t.Errorf("bad cursor: %v", err)
	}
	// since stops the scan at the first older event.
	mid := all.Events[len(all.Events)/2]
	p, _ := f.Query(Filter{Tenant: "alice", Since: mid.Time, Limit: MaxQueryLimit})
	for _, e := range p.Events {
		if e.Time.Before(mid.Time) {
			t.Errorf("event %+v before since", e)
		}
	}
	// A reopen goes on with the sequence.
	f.Close()
	f2 := openTest(t, path, 2048, 4)
	f2.Record(context.Background(), Event{Kind: KindSession, Tenant: "alice"})
	p, _ = f2.Query(Filter{Tenant: "alice", Limit: 1})
	if p.Events[0].Seq != 101 {
		t.Errorf("seq after reopen %d, want 101", p.Events[0].Seq)
	}
}

// TestFileConcurrentRecords: concurrent Records lose nothing and keep
// seq and time in file order.
func TestFileConcurrentRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	f := openTest(t, path, 1<<30, 2)
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.Record(context.Background(), Event{Kind: KindCommand, Tenant: "t", Command: strings.Repeat("x", 100)})
		}()
	}
	wg.Wait()
	p, _ := f.Query(Filter{Tenant: "t", Limit: MaxQueryLimit})
	if len(p.Events) != 100 {
		t.Fatalf("%d events, want 100", len(p.Events))
	}
	for i := 1; i < len(p.Events); i++ {
		if p.Events[i].Seq != p.Events[i-1].Seq-1 || p.Events[i].Time.After(p.Events[i-1].Time) {
			t.Fatalf("event %d out of order", i)
		}
	}
}

// TestFileSkipsSpoiltLines: a torn line (a crash mid-write) is skipped by
// queries and by the reopen.
func TestFileSkipsSpoiltLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	f := openTest(t, path, 1<<20, 2)
	f.Record(context.Background(), Event{Kind: KindSession, Tenant: "t", Time: time.Now()})
	f.Close()
	fh, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	fh.WriteString(`{"seq":2,"time":"20`)
	fh.Close()
	f2 := openTest(t, path, 1<<20, 2)
	f2.Record(context.Background(), Event{Kind: KindSession, Tenant: "t"})
	p, _ := f2.Query(Filter{Tenant: "t"})
	if len(p.Events) != 2 || p.Events[0].Seq != 2 || p.Events[1].Seq != 1 {
		t.Fatalf("events %+v", p.Events)
	}
}
