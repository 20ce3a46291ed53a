package images

import (
	"io"
	"sync"
)

// progressTracker counts the bytes a pull reads from its layers' blobs
// and reports them, about once per percent, one call at a time.
type progressTracker struct {
	fn   func(Progress)
	mu   sync.Mutex
	p    Progress
	last int64 // Complete at the last report
	step int64
}

// trackProgress makes srcs' blobs count their bytes into a tracker that
// reports to fn: now (nothing fetched yet), as they stream, and when the
// last byte is read.
func (s *Store) trackProgress(srcs []layerSource, fn func(Progress)) {
	t := &progressTracker{fn: fn}
	for i := range srcs {
		if _, err := readLayerMeta(s.layerPath(srcs[i].diffID)); err == nil || srcs[i].size < 0 {
			continue // stored already, or of unknown size (not a pull)
		}
		t.p.Total += srcs[i].size
		t.p.Layers++
		open := srcs[i].open
		srcs[i].open = func() (io.ReadCloser, error) {
			rc, err := open()
			if err != nil {
				return nil, err
			}
			return &progressReader{rc: rc, t: t}, nil
		}
	}
	t.step = max(t.p.Total/100, 64<<10)
	fn(t.p)
}

func (t *progressTracker) add(n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A blob read again (a retry) counts again, but never past Total.
	t.p.Complete = min(t.p.Complete+n, t.p.Total)
	if t.p.Complete-t.last >= t.step || (t.p.Complete == t.p.Total && t.last != t.p.Total) {
		t.last = t.p.Complete
		t.fn(t.p)
	}
}

type progressReader struct {
	rc io.ReadCloser
	t  *progressTracker
}

func (r *progressReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if n > 0 {
		r.t.add(int64(n))
	}
	return n, err
}

func (r *progressReader) Close() error { return r.rc.Close() }
