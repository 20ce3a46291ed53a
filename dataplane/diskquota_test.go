package dataplane

import (
	"context"
	"errors"
	"io"
	"testing"
)

// byteQuota is a Quota of limit bytes.
type byteQuota struct{ limit, charged int64 }

func (q *byteQuota) Take(n int64) bool {
	if q.charged+n > q.limit {
		return false
	}
	q.charged += n
	return true
}
func (q *byteQuota) Give(n int64)  { q.charged -= n }
func (q *byteQuota) Force(n int64) { q.charged += n }

// TestOutputLogQuota: an output charged to a quota stores no more than it
// allows (ErrNoRoom, the bytes before kept); a log at its cap makes room
// by dropping its own oldest segment, as the cap does; Truncate keeps what
// was kept, counts later bytes as discarded, and tells a reader once;
// DropKept and Remove give everything back.
func TestOutputLogQuota(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		name := "memory"
		if dir != "" {
			name = "files"
		}
		t.Run(name, func(t *testing.T) {
			o, err := NewOutputLog(dir, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Write(Stdout, make([]byte, 100)); err != nil {
				t.Fatal(err)
			}
			q := &byteQuota{limit: 80 << 10}
			o.SetQuota(q)
			if q.charged != o.Stored() || q.charged != 100+frameHeader {
				t.Fatalf("SetQuota charged %d, the log stores %d", q.charged, o.Stored())
			}
			n, err := o.write(Stdout, make([]byte, 200<<10)) // frames of 64 KiB
			if !errors.Is(err, ErrNoRoom) || n != maxFrame {
				t.Fatalf("a write past the quota: %d bytes, %v; want some kept, then ErrNoRoom", n, err)
			}
			if q.charged != o.Stored() || q.charged > q.limit {
				t.Fatalf("charged %d, stored %d, limit %d", q.charged, o.Stored(), q.limit)
			}

			// At its cap, a log drops its own oldest bytes for new ones.
			small, err := NewOutputLog("", 2<<10)
			if err != nil {
				t.Fatal(err)
			}
			sq := &byteQuota{limit: 3 << 10}
			small.SetQuota(sq)
			for i := range 40 {
				if err := small.Write(Stdout, make([]byte, 100)); err != nil {
					t.Fatalf("write %d to a log at its cap: %v", i, err)
				}
			}
			if small.End() != 4000 || sq.charged != small.Stored() || sq.charged > sq.limit {
				t.Fatalf("at its cap: end %d, charged %d, stored %d", small.End(), sq.charged, small.Stored())
			}

			end := o.End()
			o.Truncate(TruncatedDiskFull)
			if n, err := o.write(Stderr, make([]byte, 300)); n != 300 || err != nil {
				t.Fatalf("a write after Truncate: %d %v, want it read and discarded", n, err)
			}
			if reason, discarded := o.Truncated(); reason != TruncatedDiskFull || discarded != 300 || o.End() != end {
				t.Fatalf("truncated %q, discarded %d, end %d (was %d)", reason, discarded, o.End(), end)
			}
			o.Close()
			r := o.NewReader(0)
			var told int
			var got int64
			for {
				c, err := r.Next(context.Background(), false)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if c.Truncated != "" {
					told++
					if c.Truncated != TruncatedDiskFull || c.Offset != end {
						t.Errorf("truncated chunk %+v, want at %d", c, end)
					}
				}
				got += int64(len(c.Data))
			}
			if told != 1 || got != end {
				t.Errorf("a reader read %d bytes and was told of the truncation %d times; want %d and once", got, told, end)
			}
			if freed := o.DropKept(); freed == 0 || q.charged != 0 || o.End() != end || o.Start() != end {
				t.Errorf("DropKept freed %d; charged %d; offsets %d-%d, want %d", freed, q.charged, o.Start(), o.End(), end)
			}
			if c, err := o.NewReader(0).Next(context.Background(), false); err != nil || c.Dropped != end {
				t.Errorf("after DropKept a reader gets %+v %v, want %d dropped", c, err, end)
			}
			if err := o.Remove(); err != nil || q.charged != 0 {
				t.Errorf("Remove: %v, charged %d", err, q.charged)
			}
			if err := small.Remove(); err != nil || sq.charged != 0 {
				t.Errorf("Remove: %v, charged %d", err, sq.charged)
			}
		})
	}
}

// A finished output whose bytes were all dropped (DropKept) keeps its
// offsets across a gateway restart: its record's end is restored.
func TestOutputLogDropKeptReopen(t *testing.T) {
	dir := t.TempDir()
	o, err := NewOutputLog(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Write(Stdout, make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	o.Close()
	if o.DropKept() == 0 || o.Stored() != 0 {
		t.Fatalf("DropKept left %d bytes stored", o.Stored())
	}
	r, err := OpenOutputLog(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	r.restoreEnd(o.End())
	if r.End() != 5000 || r.Start() != 5000 {
		t.Errorf("reopened: offsets %d-%d, want 5000-5000", r.Start(), r.End())
	}
}
