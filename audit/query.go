package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Query bounds.
const (
	DefaultQueryLimit = 100
	MaxQueryLimit     = 1000
)

// Filter selects events for Query. Tenant is required: a query never
// crosses tenants.
type Filter struct {
	Tenant  string
	Session string    // "" for all the tenant's sessions
	Since   time.Time // zero: from the oldest kept
	Cursor  string    // from an earlier page's Next: the events older than its last
	Limit   int       // 1..MaxQueryLimit; 0 means DefaultQueryLimit
}

// Page is one answer of Query: events newest first, and the cursor for
// the next page ("" when there is none).
type Page struct {
	Events []Event
	Next   string
}

// ErrBadCursor is returned for a cursor Query did not make.
var ErrBadCursor = errors.New("invalid cursor")

// Query returns the tenant's events, newest first, from the current file
// and the rotated ones. It reads the files backward and stops at Since,
// so a recent window costs little; an old one is a linear scan.
func (a *File) Query(f Filter) (Page, error) {
	if f.Tenant == "" {
		return Page{}, errors.New("audit query: no tenant")
	}
	if f.Limit <= 0 {
		f.Limit = DefaultQueryLimit
	}
	f.Limit = min(f.Limit, MaxQueryLimit)
	var before uint64
	if f.Cursor != "" {
		n, err := strconv.ParseUint(f.Cursor, 10, 64)
		if err != nil || n == 0 {
			return Page{}, ErrBadCursor
		}
		before = n
	}
	files, sizes := a.openAll()
	defer func() {
		for _, fh := range files {
			fh.Close()
		}
	}()
	tenantJSON, _ := json.Marshal(f.Tenant)
	needle := append([]byte(`"tenant":`), tenantJSON...)
	var out []Event
	more, done := false, false
	prev := uint64(0) // seq of the last event taken or passed: strictly decreasing
	for i, fh := range files {
		if done {
			break
		}
		err := scanBackward(fh, sizes[i], func(line []byte) bool {
			var e Event
			if !bytes.Contains(line, needle) {
				// Not the tenant's; its time still bounds the scan.
				if !f.Since.IsZero() && json.Unmarshal(line, &e) == nil && e.Time.Before(f.Since) {
					done = true
					return false
				}
				return true
			}
			if json.Unmarshal(line, &e) != nil || e.Seq == 0 {
				return true // a line spoilt by a crash
			}
			if prev != 0 && e.Seq >= prev {
				return true
			}
			prev = e.Seq
			if !f.Since.IsZero() && e.Time.Before(f.Since) {
				done = true
				return false
			}
			if e.Tenant != f.Tenant || (f.Session != "" && e.Session != f.Session) || (before != 0 && e.Seq >= before) {
				return true
			}
			if len(out) == f.Limit {
				more, done = true, true
				return false
			}
			out = append(out, e)
			return true
		})
		if err != nil {
			return Page{}, fmt.Errorf("audit query: %w", err)
		}
	}
	p := Page{Events: out}
	if more {
		p.Next = strconv.FormatUint(out[len(out)-1].Seq, 10)
	}
	return p, nil
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
