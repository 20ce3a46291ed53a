package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Query bounds.
const (
	DefaultQueryLimit = 100
	MaxQueryLimit     = 1000
	// DefaultQueryScanBytes bounds the log one Query reads, whatever the
	// filter: an old since over a log of other tenants' events answers a
	// page (maybe empty) and a cursor to go on, not a 512 MiB scan.
	DefaultQueryScanBytes = 16 << 20
)

// Filter selects events for Query. Tenant is required: a query never
// crosses tenants.
type Filter struct {
	Tenant  string
	Session string    // "" for all the tenant's sessions
	Since   time.Time // zero: from the oldest kept
	Cursor  string    // from an earlier page's Next: the events older than its last
	Limit   int       // 1..MaxQueryLimit; 0 means DefaultQueryLimit
	// After, when not 0, stops the scan at the event with this seq or an
	// older one: only newer events are returned (a follower's next poll
	// reads what was written since, not the whole log).
	After uint64
	// ScanBytes, when > 0, lowers this query's scan budget below the
	// log's QueryScanBytes: a caller that makes several queries for one
	// answer passes on what the earlier ones left (Page.ScanLeft).
	ScanBytes int64
}

// Page is one answer of Query: events newest first, and the cursor for
// the next page ("" when there is none). A page that read its scan budget
// holds fewer than Limit events (maybe none) and a Next.
type Page struct {
	Events []Event
	Next   string
	// ScanLeft is what this query left of its scan budget (0: it used
	// it up).
	ScanLeft int64
}

// ErrBadCursor is returned for a cursor Query did not make.
var ErrBadCursor = errors.New("invalid cursor")

// cursor is where a page ended: the line with seq Seq, which starts at
// Off in one of the files (the file moves to the next name at a rotation,
// the offset does not). Off < 0: only the seq is known.
type cursor struct {
	Seq uint64
	Off int64
}

func (c cursor) String() string {
	return strconv.FormatUint(c.Seq, 10) + "." + strconv.FormatInt(c.Off, 10)
}

// parseCursor reads "SEQ.OFF" (or a bare "SEQ").
func parseCursor(s string) (cursor, error) {
	seqS, offS, hasOff := strings.Cut(s, ".")
	seq, err := strconv.ParseUint(seqS, 10, 64)
	if err != nil || seq == 0 {
		return cursor{}, ErrBadCursor
	}
	c := cursor{Seq: seq, Off: -1}
	if hasOff {
		off, err := strconv.ParseInt(offS, 10, 64)
		if err != nil || off < 0 {
			return cursor{}, ErrBadCursor
		}
		c.Off = off
	}
	return c, nil
}

// Query returns the tenant's events, newest first, from the current file
// and the rotated ones. It reads the files backward and stops at Since,
// at Limit, or after QueryScanBytes of log, answering a cursor to go on
// from there. A cursor it made starts the scan at the line it names (found
// by its offset, checked by its seq), so a page costs what it reads.
// Lines of other tenants are passed over by an exact substring test and
// the seq and time at the line's start, without decoding them.
func (a *File) Query(f Filter) (Page, error) {
	if f.Tenant == "" {
		return Page{}, errors.New("audit query: no tenant")
	}
	if f.Limit <= 0 {
		f.Limit = DefaultQueryLimit
	}
	f.Limit = min(f.Limit, MaxQueryLimit)
	var from cursor
	if f.Cursor != "" {
		c, err := parseCursor(f.Cursor)
		if err != nil {
			return Page{}, err
		}
		from = c
	}
	files, sizes := a.openAll()
	defer func() {
		for _, fh := range files {
			fh.Close()
		}
	}()
	// Where the scan starts: file first, its bytes [0, end).
	first, end := 0, int64(-1)
	if from.Seq != 0 {
		first, end = len(files), 0 // all newer than the cursor: nothing
		found := false
		if from.Off >= 0 {
			for i, fh := range files {
				if from.Off < sizes[i] && seqAt(fh, from.Off) == from.Seq {
					first, end, found = i, from.Off, true
					break
				}
			}
		}
		// Not where it was (a bare seq, or its file rotated away): the
		// first file whose first valid line is older than it holds the
		// boundary. A file with no such line (empty after a failed
		// write, only torn lines, or all newer) is passed over: taken
		// for the boundary, it would let the scan go on into the files
		// after it from their ends, newer than the cursor.
		for i, fh := range files {
			if found {
				break
			}
			s, err := firstSeq(fh, sizes[i])
			if err != nil {
				return Page{}, fmt.Errorf("audit query: %w", err)
			}
			if s == 0 || s >= from.Seq {
				continue
			}
			off, err := findSeq(fh, sizes[i], from.Seq)
			if err != nil {
				return Page{}, fmt.Errorf("audit query: %w", err)
			}
			first, end, found = i, off, true
		}
	}
	tenantJSON, _ := json.Marshal(f.Tenant)
	needle := append([]byte(`"tenant":`), tenantJSON...)
	budget := a.cfg.QueryScanBytes
	if f.ScanBytes > 0 {
		budget = min(budget, f.ScanBytes)
	}
	var scanned int64
	var out []Event
	var last cursor // the last line passed or taken, for Next
	more, done := false, false
	prev := uint64(0) // seq of the last line passed: strictly decreasing
	for i := first; i < len(files) && !done; i++ {
		size := sizes[i]
		if i == first && end >= 0 {
			size = end
		}
		err := scanBackward(files[i], size, func(line []byte, off int64) bool {
			if scanned >= budget {
				more, done = last.Seq != 0, true
				return false
			}
			scanned += int64(len(line)) + 1
			seq, ok := lineSeq(line)
			if !ok || (prev != 0 && seq >= prev) {
				return true // a line spoilt by a crash
			}
			prev = seq
			if f.After != 0 && seq <= f.After {
				done = true
				return false
			}
			if !f.Since.IsZero() {
				if t, ok := lineTime(line); ok && t.Before(f.Since) {
					done = true
					return false
				}
			}
			if !bytes.Contains(line, needle) {
				last = cursor{Seq: seq, Off: off}
				return true
			}
			var e Event
			if json.Unmarshal(line, &e) != nil || e.Seq != seq {
				return true
			}
			if e.Tenant != f.Tenant || (f.Session != "" && e.Session != f.Session) {
				last = cursor{Seq: seq, Off: off}
				return true
			}
			if len(out) == f.Limit {
				more, done = true, true
				return false
			}
			out = append(out, e)
			last = cursor{Seq: seq, Off: off}
			return true
		})
		if err != nil {
			return Page{}, fmt.Errorf("audit query: %w", err)
		}
	}
	p := Page{Events: out, ScanLeft: max(0, budget-scanned)}
	if more {
		p.Next = last.String()
	}
	return p, nil
}

// lineSeq reads the seq an event line starts with ({"seq":N,...}: Record
// writes it first).
func lineSeq(line []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(`{"seq":`))
	if !ok {
		return 0, false
	}
	i := bytes.IndexByte(rest, ',')
	if i <= 0 || i > 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(rest[:i]), 10, 64)
	return n, err == nil && n > 0
}

// lineTime reads the time that follows the seq at an event line's start.
func lineTime(line []byte) (time.Time, bool) {
	i := bytes.Index(line[:min(len(line), 40)], []byte(`,"time":"`))
	if i < 0 {
		return time.Time{}, false
	}
	rest := line[i+len(`,"time":"`):]
	j := bytes.IndexByte(rest[:min(len(rest), 48)], '"')
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:j]))
	return t, err == nil
}

// findSeq returns the offset of f's first line whose seq is seq or more
// (size if none): a binary search on line starts, then a forward scan
// over the last stretch.
func findSeq(f *os.File, size int64, seq uint64) (int64, error) {
	lo, hi := int64(0), size // lo: a line start older than seq (or 0)
	buf := make([]byte, 64<<10)
	for hi-lo > int64(len(buf)) {
		mid := lo + (hi-lo)/2
		n, err := f.ReadAt(buf, mid-1)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		i := bytes.IndexByte(buf[:n], '\n')
		if i < 0 {
			hi = mid
			continue
		}
		start := mid + int64(i)
		if s := seqAt(f, start); s != 0 && s < seq {
			lo = start
		} else {
			hi = mid
		}
	}
	r := bufio.NewReaderSize(io.NewSectionReader(f, lo, size-lo), 64<<10)
	off := lo
	for {
		line, err := r.ReadSlice('\n')
		if s, ok := lineSeq(line); ok && s >= seq {
			return off, nil
		}
		off += int64(len(line))
		if errors.Is(err, bufio.ErrBufferFull) {
			// a line longer than any event: read on to its end
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = r.ReadSlice('\n')
				off += int64(len(line))
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return size, nil
			}
			return 0, err
		}
	}
}

// firstSeq returns the seq of f's first valid line (0: none), reading
// past lines spoilt by a crash.
func firstSeq(f *os.File, size int64) (uint64, error) {
	if s := seqAt(f, 0); s != 0 {
		return s, nil
	}
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if s, ok := lineSeq(line); ok {
			return s, nil
		}
		for errors.Is(err, bufio.ErrBufferFull) { // a line longer than any event
			_, err = r.ReadSlice('\n')
		}
		if errors.Is(err, io.EOF) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// seqAt returns the seq of the line starting at off in f (0: none).
func seqAt(f *os.File, off int64) uint64 {
	var b [40]byte
	start := off
	if off > 0 {
		start = off - 1 // the newline that ends the line before
	}
	n, _ := f.ReadAt(b[:], start)
	p := b[:n]
	if off > 0 {
		if len(p) == 0 || p[0] != '\n' {
			return 0
		}
		p = p[1:]
	}
	if i := bytes.IndexByte(p, ','); i >= 0 {
		p = p[:i+1]
	}
	seq, _ := lineSeq(p)
	return seq
}

// openAll opens the log's files, newest first, with their sizes now:
// under the lock, so a rotation cannot move a file between two opens,
// and what is written later is not read.
func (a *File) openAll() ([]*os.File, []int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var files []*os.File
	var sizes []int64
	for _, p := range a.files() {
		fh, err := os.Open(p)
		if err != nil {
			continue
		}
		st, err := fh.Stat()
		if err != nil || !st.Mode().IsRegular() {
			fh.Close()
			continue
		}
		files, sizes = append(files, fh), append(sizes, st.Size())
	}
	return files, sizes
}
