package gateway

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// Image pools: with a warm pool (Config.WarmPool) and WarmPoolImageTTL,
// an image that a create used within the TTL has a pool of its own, of
// min(WarmPool, imagePoolSize) sandboxes built from it, which creates of
// that image claim as the default root's claim the default pool's. The
// first create of an image starts its pool (and is itself cold); a
// create whose sandbox trusts an egress CA is cold and leaves the pools
// alone (takeWarm: an image's trust store is its build's); a pool
// no create used for the TTL drains (its sandboxes are destroyed and
// their image holds released), and so does the least recently used one
// when a create needs a pool for one more image than WarmPoolImages.
//
// A pool's sandboxes are built from the image as the create that started
// it resolved it (its digest): a create that resolves the name to
// another digest (the tag was pulled again) drains the pool and starts
// one for the new digest. Each warm sandbox holds its image under its id
// from its build on (ImageSource.Hold), as its session will, so the store
// never prunes the layers a warm sandbox runs on; the hold is a warm one
// (ImageSource.HoldWarm): an `image rm` does not wait for the pool, whose
// sandboxes a create of the name then no longer finds, and the claim
// makes it the session's hold.
//
// The image pools are bounded by memory: a pool builds one more sandbox
// only while the warm sandboxes of every pool, the default's included,
// use, as their cgroups count it (sandbox.Statser's MemoryBytes, page
// cache included), less than WarmPoolMemory with one more sandbox of
// their average (warmMemoryGuess when none could be measured). The
// default pool is the operator's --warm-pool and is not held back by it.
// One image sandbox is built at a time, in the background, once claims
// pause, or at once when the pool is empty (warmPool.settle): a create
// never waits for a pool.

// imagePoolSize bounds each image's pool (below WarmPool when that is
// smaller).
const imagePoolSize = 2

// DefaultWarmPoolImages is how many images have a pool at once when
// Config.WarmPoolImages is 0.
const DefaultWarmPoolImages = 4

// DefaultWarmPoolMemory is Config.WarmPoolMemory's default.
const DefaultWarmPoolMemory = 256 << 20

// warmMemoryGuess is what a warm sandbox whose memory cannot be read is
// taken to use (an idle init's resident memory, rounded up).
const warmMemoryGuess = 32 << 20

// imagePools are the pools of the images used lately.
type imagePools struct {
	m      *Manager
	size   int
	max    int // images with a pool at once
	ttl    time.Duration
	memory int64
	fill   chan struct{} // one image sandbox built at a time

	mu     sync.Mutex
	ctx    context.Context // Run's: the pools' refills end with it (nil: Run has not begun)
	closed bool
	pools  map[string]*imagePool // by image name
	drains sync.WaitGroup        // pools being drained
}

// imagePool is the pool of one image.
type imagePool struct {
	img  *sandbox.Image
	used time.Time // the last create of the image
	p    *warmPool
}

func newImagePools(m *Manager) *imagePools {
	cfg := m.cfg
	if cfg.WarmPool <= 0 || cfg.WarmPoolImageTTL <= 0 || cfg.ImageSource == nil {
		return nil
	}
	ip := &imagePools{m: m, size: min(cfg.WarmPool, imagePoolSize), max: cfg.WarmPoolImages, ttl: cfg.WarmPoolImageTTL,
		memory: cfg.WarmPoolMemory, fill: make(chan struct{}, 1), pools: map[string]*imagePool{}}
	if ip.max <= 0 {
		ip.max = DefaultWarmPoolImages
	}
	if ip.memory <= 0 {
		ip.memory = DefaultWarmPoolMemory
	}
	return ip
}

// start lets creates start pools, whose refills run until ctx ends.
func (ip *imagePools) start(ctx context.Context) {
	if ip == nil {
		return
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if !ip.closed {
		ip.ctx = ctx
	}
}

// take records that a create uses img now and claims a warm sandbox of
// img if its pool has one; the first create of img starts its pool.
func (ip *imagePools) take(img *sandbox.Image, now time.Time) (warm, bool) {
	if ip == nil {
		return warm{}, false
	}
	ip.mu.Lock()
	if ip.closed || ip.ctx == nil || ip.ctx.Err() != nil {
		ip.mu.Unlock()
		return warm{}, false
	}
	var drain []*warmPool
	e := ip.pools[img.Name]
	if e != nil && e.img.Digest != img.Digest { // pulled again: the new one's pool
		drain = append(drain, e.p)
		delete(ip.pools, img.Name)
		e = nil
	}
	if e == nil {
		for len(ip.pools) >= ip.max {
			lru := ""
			for name, o := range ip.pools {
				if lru == "" || o.used.Before(ip.pools[lru].used) {
					lru = name
				}
			}
			drain = append(drain, ip.pools[lru].p)
			delete(ip.pools, lru)
		}
		e = &imagePool{img: img, p: ip.newPool(img)}
		ip.pools[img.Name] = e
		e.p.start(ip.ctx)
		ip.m.log.Info("warm_pool_started", "image", img.Name, "digest", img.Digest, "size", ip.size)
	}
	e.used = now
	p := e.p
	ip.drainLocked(drain, "replaced")
	ip.mu.Unlock()
	return p.take()
}

// newPool is a pool of sandboxes of img, each holding img under its id.
func (ip *imagePools) newPool(img *sandbox.Image) *warmPool {
	m, src := ip.m, ip.m.cfg.ImageSource
	p := newWarmPool(ip.size, func(ctx context.Context, id string) (sandbox.Sandbox, error) {
		if err := src.HoldWarm(id, img); err != nil {
			return nil, err
		}
		sb, err := m.driver.Create(ctx, sandbox.Spec{ID: id, Image: img, Warm: true})
		if err != nil {
			src.Release(id)
			return nil, err
		}
		return sb, nil
	}, m.destroyWarm, m.log)
	p.release, p.admit, p.fill, p.image = src.Release, ip.admit, ip.fill, img.Name
	return p
}

// drainLocked closes pools in the background (ip.mu held).
func (ip *imagePools) drainLocked(pools []*warmPool, reason string) {
	for _, p := range pools {
		ip.m.log.Info("warm_pool_drained", "reason", reason)
		ip.drains.Go(func() { p.close(context.Background()) })
	}
}

// tend drains the pools of images no create used for the TTL, and asks
// the others to refill (one that the memory bound held back may fit now).
func (ip *imagePools) tend(now time.Time) {
	if ip == nil {
		return
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	for name, e := range ip.pools {
		if now.Sub(e.used) >= ip.ttl {
			delete(ip.pools, name)
			ip.m.log.Info("warm_pool_expired", "image", name, "unused_for", now.Sub(e.used).Round(time.Second).String())
			ip.drainLocked([]*warmPool{e.p}, "unused")
			continue
		}
		e.p.kickNow()
	}
}

// admit reports whether the warm sandboxes of every pool leave room in
// the memory bound for one more.
func (ip *imagePools) admit() bool {
	ip.mu.Lock()
	pools := make([]*warmPool, 0, len(ip.pools)+1)
	for _, e := range ip.pools {
		pools = append(pools, e.p)
	}
	ip.mu.Unlock()
	if ip.m.pool != nil {
		pools = append(pools, ip.m.pool)
	}
	var used, measured, unmeasured int64
	for _, p := range pools {
		for _, sb := range p.idleSandboxes() {
			if n, ok := memoryOf(sb); ok {
				used += n
				measured++
			} else {
				unmeasured++
			}
		}
	}
	per := int64(warmMemoryGuess)
	if measured > 0 {
		per = used / measured
	}
	if total := used + per*(unmeasured+1); total > ip.memory {
		ip.m.log.Debug("warm_pool_memory_full", "warm_sandboxes", measured+unmeasured, "bytes_with_one_more", total, "bound", ip.memory)
		return false
	}
	return true
}

// memoryOf is the memory sb's cgroups count now.
func memoryOf(sb sandbox.Sandbox) (int64, bool) {
	st, ok := sandbox.As[sandbox.Statser](sb)
	if !ok {
		return 0, false
	}
	s, err := st.Stats(context.Background())
	if err != nil || s.MemoryBytes == nil {
		return 0, false
	}
	return *s.MemoryBytes, true
}

// WarmSandboxes counts the warm sandboxes ready now, by image (the default
// root's under the first of Config.Images).
func (m *Manager) WarmSandboxes() map[string]int {
	out := map[string]int{}
	if m.pool != nil {
		out[m.cfg.Images[0]] = len(m.pool.idleSandboxes())
	}
	if ip := m.imagePools; ip != nil {
		ip.mu.Lock()
		pools := maps.Clone(ip.pools)
		ip.mu.Unlock()
		for _, name := range slices.Sorted(maps.Keys(pools)) {
			out[name] = len(pools[name].p.idleSandboxes())
		}
	}
	return out
}

// close drains every pool and waits until their sandboxes are destroyed.
func (ip *imagePools) close(ctx context.Context) {
	if ip == nil {
		return
	}
	ip.mu.Lock()
	ip.closed = true
	pools := ip.pools
	ip.pools = map[string]*imagePool{}
	ip.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range pools {
		wg.Go(func() { e.p.close(ctx) })
	}
	wg.Wait()
	ip.drains.Wait()
}
