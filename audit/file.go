package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Defaults for FileConfig.
const (
	DefaultMaxSize  = 64 << 20
	DefaultMaxFiles = 8
	// DefaultSyncEvery is how often written events are fsynced.
	DefaultSyncEvery = time.Second
)

// Metrics counts the audit log's write errors (internal/metrics
// implements it); FileConfig.Metrics nil counts nothing.
type Metrics interface {
	// AuditWriteFailed: an event could not be written (it is lost).
	AuditWriteFailed()
}

// FileConfig configures File. Zero values get defaults.
type FileConfig struct {
	Path string
	// MaxSize is the size past which the file is rotated (bytes).
	MaxSize int64
	// MaxFiles is how many files are kept, the current one included:
	// PATH, PATH.1 (the newest rotated) ... PATH.<MaxFiles-1>.
	MaxFiles int
	// SyncEvery is how often written events are fsynced; negative: only
	// at rotation and Close.
	SyncEvery time.Duration
	// QueryScanBytes bounds the bytes of log one Query reads (default
	// DefaultQueryScanBytes); past it the page ends early, with a cursor.
	QueryScanBytes int64
	Log            *slog.Logger
	Metrics        Metrics
}

// File is an Auditor appending JSON lines to a file.
//
// Each event is one write(2) under a mutex, in the caller's goroutine: an
// event whose Record returned is in the kernel's page cache, so a crash
// of the gateway loses none, and nothing is dropped under load (a bounded
// channel would have to drop or block anyway). fsync is every SyncEvery
// (1 s) at most, by a background goroutine, and at rotation and Close:
// a power loss loses at most that second, and a command's latency never
// pays for a disk flush. No fsync runs under the mutex: the periodic one
// takes the *os.File under it and syncs outside it, and a rotation hands
// the old file to a goroutine that syncs and then closes it (Close waits
// for those). An *os.File may be synced and closed concurrently: its
// descriptor is released only once the Sync using it returned.
//
// A write that fails (a full disk) loses that event, is counted
// (Metrics.AuditWriteFailed), is logged once until a write works again,
// and never fails the request it describes.
type File struct {
	cfg FileConfig

	mu      sync.Mutex
	f       *os.File
	size    int64
	regular bool
	seq     uint64
	last    time.Time // the newest event's time: times never go back
	dirty   bool
	failing bool // a write failed and none has worked since
	closed  bool
	buf     bytes.Buffer

	stop chan struct{}
	done chan struct{}
	bg   sync.WaitGroup // rotated files being synced and closed

	// syncFile is (*os.File).Sync; tests replace it to hold a sync.
	syncFile func(*os.File) error
}

// OpenFile opens (creating it, mode 0600) the audit log at cfg.Path and
// carries on its sequence numbers.
func OpenFile(cfg FileConfig) (*File, error) {
	if cfg.Path == "" {
		return nil, errors.New("audit log: no path")
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = DefaultMaxSize
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = DefaultMaxFiles
	}
	if cfg.SyncEvery == 0 {
		cfg.SyncEvery = DefaultSyncEvery
	}
	if cfg.QueryScanBytes <= 0 {
		cfg.QueryScanBytes = DefaultQueryScanBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o700); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	a := &File{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{}), syncFile: (*os.File).Sync}
	if err := a.open(); err != nil {
		return nil, err
	}
	// The sequence goes on from the newest event kept.
	if e, ok := lastEvent(a.files()); ok {
		a.seq, a.last = e.Seq, e.Time
	}
	if cfg.SyncEvery > 0 {
		go a.syncLoop()
	} else {
		close(a.done)
	}
	return a, nil
}

func (a *File) open() error {
	f, err := os.OpenFile(a.cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	// A device (/dev/null) or a pipe is never rotated.
	a.f, a.size, a.regular = f, st.Size(), st.Mode().IsRegular()
	if a.regular && a.size > 0 && !endsInNewline(f, a.size) {
		// A crash tore the last line: the next event starts a line of
		// its own, so that only the torn one is lost.
		if n, err := f.Write([]byte{'\n'}); err == nil {
			a.size += int64(n)
		}
	}
	return nil
}

func endsInNewline(f *os.File, size int64) bool {
	r, err := os.Open(f.Name())
	if err != nil {
		return true
	}
	defer r.Close()
	var b [1]byte
	_, err = r.ReadAt(b[:], size-1)
	return err != nil || b[0] == '\n'
}

// Record implements Auditor.
func (a *File) Record(ctx context.Context, e Event) {
	fill(ctx, &e)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	if e.Time.Before(a.last) {
		e.Time = a.last // Query relies on times in file order
	}
	e.Seq = a.seq + 1
	a.buf.Reset()
	if err := json.NewEncoder(&a.buf).Encode(&e); err != nil {
		a.failed(fmt.Errorf("encode: %w", err))
		return
	}
	if a.regular && a.size > 0 && a.size+int64(a.buf.Len()) > a.cfg.MaxSize {
		if err := a.rotate(); err != nil {
			a.failed(err)
			if a.f == nil {
				return
			}
		}
	}
	if a.f == nil {
		if err := a.open(); err != nil {
			a.failed(err)
			return
		}
	}
	n, err := a.f.Write(a.buf.Bytes())
	if err != nil {
		// A partial line would spoil the next one: cut it off again.
		if n > 0 {
			_ = a.f.Truncate(a.size)
		}
		a.failed(err)
		return
	}
	if a.regular {
		a.size += int64(n)
	}
	a.seq, a.last, a.dirty = e.Seq, e.Time, true
	if a.failing {
		a.failing = false
		a.cfg.Log.Warn("audit_write_recovered", "path", a.cfg.Path)
	}
}

// failed counts a lost event and logs the first of a run of failures.
func (a *File) failed(err error) {
	if a.cfg.Metrics != nil {
		a.cfg.Metrics.AuditWriteFailed()
	}
	if !a.failing {
		a.failing = true
		a.cfg.Log.Error("audit_write_failed", "path", a.cfg.Path, "err", err,
			"note", "events are lost until a write works again; requests go on")
	}
}

// rotate moves PATH to PATH.1 (and each PATH.n to PATH.n+1, dropping the
// oldest) and opens a new PATH. The old file is synced and closed by a
// goroutine, outside the mutex.
func (a *File) rotate() error {
	old := a.f
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		_ = a.syncFile(old)
		_ = old.Close()
	}()
	a.f = nil
	a.dirty = false
	if a.cfg.MaxFiles <= 1 {
		if err := os.Remove(a.cfg.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotate: %w", err)
		}
	} else {
		_ = os.Remove(rotated(a.cfg.Path, a.cfg.MaxFiles-1))
		for n := a.cfg.MaxFiles - 2; n >= 1; n-- {
			if err := os.Rename(rotated(a.cfg.Path, n), rotated(a.cfg.Path, n+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("rotate: %w", err)
			}
		}
		if err := os.Rename(a.cfg.Path, rotated(a.cfg.Path, 1)); err != nil {
			return fmt.Errorf("rotate: %w", err)
		}
	}
	return a.open()
}

func rotated(path string, n int) string { return path + "." + strconv.Itoa(n) }

// files lists the log's files, newest first.
func (a *File) files() []string {
	out := []string{a.cfg.Path}
	for n := 1; n < a.cfg.MaxFiles; n++ {
		out = append(out, rotated(a.cfg.Path, n))
	}
	return out
}

func (a *File) syncLoop() {
	defer close(a.done)
	t := time.NewTicker(a.cfg.SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			a.sync()
		}
	}
}

// sync fsyncs the current file if events were written since the last
// sync, outside the mutex: Record goes on meanwhile. A rotation during
// the sync closes the file only after it (os.File's reference count), and
// syncs it again itself.
func (a *File) sync() {
	a.mu.Lock()
	f := a.f
	if !a.dirty || f == nil {
		a.mu.Unlock()
		return
	}
	a.dirty = false
	a.mu.Unlock()
	if err := a.syncFile(f); err != nil && !errors.Is(err, os.ErrClosed) {
		a.mu.Lock()
		if a.f == f {
			a.dirty = true // try again at the next tick
		}
		a.mu.Unlock()
	}
}

// Close syncs and closes the file; later events are dropped.
func (a *File) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.stop)
	f := a.f
	a.f = nil
	a.mu.Unlock()
	<-a.done
	a.bg.Wait()
	var err error
	if f != nil {
		_ = a.syncFile(f)
		err = f.Close()
	}
	return err
}

// lastEvent reads the newest event of the files at paths (newest first).
func lastEvent(paths []string) (Event, bool) {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		found := false
		var last Event
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			_ = scanBackward(f, st.Size(), func(line []byte, _ int64) bool {
				if json.Unmarshal(line, &last) == nil && last.Seq > 0 {
					found = true
					return false
				}
				return true
			})
		}
		f.Close()
		if found {
			return last, true
		}
	}
	return Event{}, false
}

// scanBackward calls fn for each line of f's first size bytes, last
// first, with the offset at which the line starts, until fn returns false.
func scanBackward(f *os.File, size int64, fn func(line []byte, off int64) bool) error {
	const chunk = 64 << 10
	end := size
	var rest []byte // the end part of a line whose beginning is further back
	buf := make([]byte, chunk)
	for end > 0 {
		n := min(int64(chunk), end)
		end -= n
		if _, err := f.ReadAt(buf[:n], end); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		data := append(append([]byte(nil), buf[:n]...), rest...)
		for {
			i := bytes.LastIndexByte(data, '\n')
			if i < 0 {
				break
			}
			line := data[i+1:]
			data = data[:i]
			if len(line) > 0 && !fn(line, end+int64(i)+1) {
				return nil
			}
		}
		rest = data
		if len(rest) > 1<<20 { // no event is this long: garbage
			rest = nil
		}
	}
	if len(rest) > 0 {
		fn(rest, 0)
	}
	return nil
}
