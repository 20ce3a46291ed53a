package images

import (
	"fmt"
	"os"
	"sync"
)

// spaceCheckEvery is how many bytes an unpack writes between two checks
// of the filesystem's free space.
const spaceCheckEvery = 32 << 20

// dirBlock is what a directory is charged: one block.
const dirBlock = 4096

// space is the store's quota and free-space reserve, and what the unpacks
// of this process have written and not yet committed as layers. The quota
// counts the allocated bytes that layer.json records for each layer; an
// unpack in another process (`sandgate image pull` beside the gateway)
// shows in it once committed, and in the free space at once.
type space struct {
	dir          string
	max, minFree int64 // 0: no bound

	mu       sync.Mutex
	used     int64 // allocated bytes of the stored layers, as last counted
	inflight int64 // bytes written by this process's unpacks in progress
}

// init resolves the defaults of StoreLimits against the filesystem that
// holds dir.
func (sp *space) init(dir string) {
	sp.dir = dir
	total, _, ok := fsSpace(dir)
	if !ok {
		return
	}
	if sp.max == 0 {
		sp.max = total / 2
	}
	if sp.minFree == 0 {
		sp.minFree = min(total/20, 1<<30)
	}
}

// StoreLimits is the store's quota and free-space reserve, defaults
// resolved (a zero field is no bound: the platform cannot tell).
func (s *Store) StoreLimits() StoreLimits {
	return StoreLimits{MaxBytes: s.space.max, MinFreeBytes: s.space.minFree}
}

// allocated is a layer's allocated bytes; layers unpacked before the
// store counted blocks give their files' sizes.
func (m layerMeta) allocated() int64 {
	if m.AllocBytes > 0 {
		return m.AllocBytes
	}
	return m.Size
}

// Usage is the allocated bytes of the stored layers, as their layer.json
// files record them.
func (s *Store) Usage() (int64, error) {
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if m, err := readLayerMeta(s.layerPath("sha256:" + e.Name())); err == nil {
			n += m.allocated()
		}
	}
	return n, nil
}

// begin checks, before an unpack that will write at least need bytes,
// that the store has room under its quota and the filesystem above its
// reserve, and returns the unpack's charge.
func (s *Store) beginUnpack(need int64) (*spaceCharge, error) {
	sp := &s.space
	used, err := s.Usage()
	if err != nil {
		return nil, err
	}
	sp.mu.Lock()
	sp.used = used
	total := used + sp.inflight
	sp.mu.Unlock()
	if sp.max > 0 && total+need > sp.max {
		return nil, fmt.Errorf("%w: the image store holds %s of its quota of %s", ErrStoreFull, fmtBytes(total), fmtBytes(sp.max))
	}
	if err := sp.checkFree(need); err != nil {
		return nil, err
	}
	return &spaceCharge{sp: sp}, nil
}

// checkFree refuses when the filesystem would keep less than the reserve
// free after need more bytes.
func (sp *space) checkFree(need int64) error {
	if sp.minFree <= 0 {
		return nil
	}
	_, free, ok := fsSpace(sp.dir)
	if ok && free-need < sp.minFree {
		return fmt.Errorf("%w: its filesystem has %s free, and the store leaves at least %s free", ErrStoreFull, fmtBytes(free), fmtBytes(sp.minFree))
	}
	return nil
}

// spaceCharge is one unpack's bytes written, against the store's quota.
type spaceCharge struct {
	sp         *space
	n          int64
	sinceCheck int64
}

// charge counts n more bytes about to be written; it fails once the
// store's quota or the filesystem's reserve would be crossed.
func (c *spaceCharge) charge(n int64) error {
	if c == nil {
		return nil
	}
	sp := c.sp
	c.n += n
	c.sinceCheck += n
	sp.mu.Lock()
	sp.inflight += n
	total := sp.used + sp.inflight
	sp.mu.Unlock()
	if sp.max > 0 && total > sp.max {
		return fmt.Errorf("%w: unpacking would take the image store past its quota of %s", ErrStoreFull, fmtBytes(sp.max))
	}
	if c.sinceCheck >= spaceCheckEvery {
		c.sinceCheck = 0
		return sp.checkFree(0)
	}
	return nil
}

// done ends the charge: committed is the allocated bytes of the layer it
// stored (0 when it failed).
func (c *spaceCharge) done(committed int64) {
	sp := c.sp
	sp.mu.Lock()
	sp.inflight -= c.n
	sp.used += committed
	sp.mu.Unlock()
	c.n = 0
}

// fmtBytes is n in binary units, for messages.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", f, []string{"B", "KiB", "MiB", "GiB", "TiB"}[i])
}
