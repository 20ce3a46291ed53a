package gateway

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// The warm pool (Config.WarmPool) keeps sandboxes of the default root
// built and idle (warmimages.go: and of the images used lately), so that
// a create takes one instead of waiting for the driver. A warm sandbox
// is made for an id drawn like any session's (newID), which nobody has
// seen: the session that claims it takes that id, so its hostname,
// directories and cgroups are what a cold create would have made for it.
// Nothing runs in a warm sandbox before its claim. What differs per
// session is applied at claim: the limits (the driver's Rebinder, in
// place), and, by the create as for any sandbox, the workspace, the
// egress proxy and policy, secrets and environment (given to each
// command), labels and TTL (the gateway's own).
//
// Warm sandboxes are not sessions: they are in no list, count towards no
// quota, have no record in the store (a restart's Restore removes any
// left on disk), and Shutdown destroys them whatever --keep-sandboxes-on-exit says.

// warmRetry bounds how often a failing refill tries again.
const (
	warmRetryMin = time.Second
	warmRetryMax = 30 * time.Second
)

// Each build of a refill waits for the claims to pause (warmQuiet
// without one) while the pool holds more than a quarter of its size
// (lowWater): a sandbox being built competes for the CPU and the disk
// with the creates of a burst (their records' fsyncs, their first
// commands). Below that it builds at once, one after another, so that a
// steady stream of creates still finds the pool refilled (issue 41, row
// 11e: a burst of 60 creates back to back on a pool of 64 had its p99 at
// 14-17 ms with a refill begun 200 ms into the burst, 8-12 ms without).
const warmQuiet = 20 * time.Millisecond

// warm is one idle sandbox of the pool, made for the session id id. A
// warm sandbox of an image (warmimages.go) holds that image under its id
// (ImageSource.Hold), as the session that claims it will: held says so,
// and whoever destroys it unclaimed releases the hold.
type warm struct {
	id   string
	sb   sandbox.Sandbox
	held bool
}

// warmPool keeps up to size warm sandboxes. A refill round runs in the
// background, once claims pause (settle): a create never waits for it. It
// builds up to par sandboxes at once (the default root's pool: one CPU
// fewer than the host has, at least one, so that a burst that emptied the
// pool finds it full again sooner and a CPU is left for the creates; an
// image's pool: one, and one for all of them, fill). On 2 cores that is
// one: two builds at once beside back-to-back creates made the claims
// slower (issue 41, row 11e: best-of-3 p50 15.2 ms against 10.4 with one).
type warmPool struct {
	size   int
	par    int
	create func(ctx context.Context, id string) (sandbox.Sandbox, error)
	// discard destroys a warm sandbox found dead, in the background.
	discard func(warm)
	// release lets go of the image hold of a warm sandbox destroyed
	// (nil: the pool's sandboxes hold none).
	release func(id string)
	// admit, when set, is asked before each fill: false leaves the pool
	// short until its next kick (a claim, or the image pools' tend).
	admit func() bool
	// fill, when set, is a slot that each fill holds: one sandbox at a
	// time is built for all the image pools.
	fill chan struct{}
	// image names the pool's image in its log lines ("": the default root).
	image string
	log   *slog.Logger

	mu     sync.Mutex
	idle   []warm // oldest first
	closed bool
	// lastClaim is when a create last took a sandbox (settle).
	lastClaim time.Time
	kick      chan struct{} // a claim was made: refill
	done      chan struct{} // closed by close
	wg        sync.WaitGroup
}

func newWarmPool(size int, create func(context.Context, string) (sandbox.Sandbox, error), discard func(warm), log *slog.Logger) *warmPool {
	return &warmPool{size: size, par: min(size, max(runtime.NumCPU()-1, 1)), create: create, discard: discard, log: log, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// start runs the refill until ctx ends or the pool is closed.
func (p *warmPool) start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx)
	}()
}

func (p *warmPool) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // close cancels a refill under way
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := warmRetryMin
	for {
		p.prune()
		for p.short() && (p.admit == nil || p.admit()) {
			if !p.settle(ctx) {
				return
			}
			if err := p.fillSome(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Warn("warm_sandbox_failed", "err", err, "retry_in", backoff)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
					return
				}
				backoff = min(2*backoff, warmRetryMax)
				continue
			}
			backoff = warmRetryMin
		}
		select {
		case <-p.kick:
		case <-ctx.Done():
			return
		}
	}
}

// settle waits while a burst of claims is under way (one within
// warmQuiet) and the pool holds more than lowWater sandboxes; once the
// burst has taken it down to that, the creates would soon build their own
// sandboxes, which a refill competes with no more than they compete with
// each other. It reports false when ctx ended.
func (p *warmPool) settle(ctx context.Context) bool {
	var t *time.Timer
	for {
		p.mu.Lock()
		n, last := len(p.idle), p.lastClaim
		p.mu.Unlock()
		wait := warmQuiet - time.Since(last)
		if n <= p.lowWater() || wait <= 0 {
			return ctx.Err() == nil
		}
		if t == nil {
			t = time.NewTimer(wait)
			defer t.Stop()
		} else {
			t.Reset(wait)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
}

// lowWater is how few sandboxes the pool may hold before a refill builds
// in the middle of a burst of claims: a quarter of its size.
func (p *warmPool) lowWater() int { return p.size / 4 }

// short reports whether the pool holds fewer than size sandboxes.
func (p *warmPool) short() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && len(p.idle) < p.size
}

// fillSome makes as many warm sandboxes as the pool lacks, at most par
// (one for an image's pool, whose admit is asked for each) at once, and
// adds them to the pool. It returns the first error once all are done.
func (p *warmPool) fillSome(ctx context.Context) error {
	p.mu.Lock()
	n := min(p.size-len(p.idle), p.par)
	p.mu.Unlock()
	if p.admit != nil || p.fill != nil {
		n = 1
	}
	if n <= 1 {
		return p.fillOne(ctx)
	}
	errs := make(chan error, n)
	for range n {
		go func() { errs <- p.fillOne(ctx) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// fillOne makes one warm sandbox and adds it to the pool.
func (p *warmPool) fillOne(ctx context.Context) error {
	if p.fill != nil {
		select {
		case p.fill <- struct{}{}:
			defer func() { <-p.fill }()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	id := newID()
	sb, err := p.create(ctx, id)
	if err != nil {
		return err
	}
	w := warm{id, sb, p.release != nil}
	p.mu.Lock()
	if !p.closed {
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		if p.image != "" {
			p.log.Debug("warm_sandbox_ready", "sandbox", id, "image", p.image)
		} else {
			p.log.Debug("warm_sandbox_ready", "sandbox", id)
		}
		p.watch(sb)
		return nil
	}
	p.mu.Unlock()
	return errors.Join(context.Canceled, p.destroy(context.WithoutCancel(ctx), w))
}

// destroy destroys the warm sandbox w now, and lets go of its image.
func (p *warmPool) destroy(ctx context.Context, w warm) error {
	err := w.sb.Destroy(ctx)
	if err == nil && w.held && p.release != nil {
		p.release(w.id)
	}
	return err
}

// idleSandboxes are the pool's warm sandboxes now.
func (p *warmPool) idleSandboxes() []sandbox.Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]sandbox.Sandbox, len(p.idle))
	for i, w := range p.idle {
		out[i] = w.sb
	}
	return out
}

// kickNow asks for a refill round, if one is not asked for already.
func (p *warmPool) kickNow() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// watch kicks the refill when sb ends (sandbox.Ender): one that ends
// while idle is then replaced (prune) without waiting for a claim to find
// it dead. The watch ends with sb, claimed or not, or with the pool.
func (p *warmPool) watch(sb sandbox.Sandbox) {
	e, ok := sb.(sandbox.Ender)
	if !ok {
		return
	}
	go func() {
		select {
		case <-e.Done():
			select {
			case p.kick <- struct{}{}:
			default:
			}
		case <-p.done:
		}
	}()
}

// prune takes the warm sandboxes that ended while idle out of the pool,
// and destroys them.
func (p *warmPool) prune() {
	p.mu.Lock()
	var dead []warm
	p.idle = slices.DeleteFunc(p.idle, func(w warm) bool {
		if ended(w.sb) {
			dead = append(dead, w)
			return true
		}
		return false
	})
	p.mu.Unlock()
	for _, d := range dead {
		p.log.Warn("warm_sandbox_lost", "sandbox", d.id, "reason", "it ended while idle")
		p.discard(d)
	}
}

// take claims the oldest warm sandbox still running, if any, and asks for
// a refill.
func (p *warmPool) take() (warm, bool) {
	p.mu.Lock()
	var dead []warm
	var w warm
	found := false
	for len(p.idle) > 0 && !found {
		w, p.idle = p.idle[0], p.idle[1:]
		if ended(w.sb) {
			dead = append(dead, w)
			continue
		}
		found = true
	}
	p.lastClaim = time.Now()
	p.mu.Unlock()
	if !found {
		// Not the last dead one: its id is its teardown's, which runs
		// beside the cold create that follows.
		w = warm{}
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
	for _, d := range dead {
		p.log.Warn("warm_sandbox_lost", "sandbox", d.id, "reason", "it ended while idle")
		p.discard(d)
	}
	return w, found
}

// ended reports whether sb has ended on its own (sandbox.Ender).
func ended(sb sandbox.Sandbox) bool {
	e, ok := sb.(sandbox.Ender)
	if !ok {
		return false
	}
	select {
	case <-e.Done():
		return true
	default:
		return false
	}
}

// close stops the refill and destroys every warm sandbox.
func (p *warmPool) close(ctx context.Context) {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range idle {
		wg.Go(func() {
			if err := p.destroy(context.WithoutCancel(ctx), w); err != nil {
				p.log.Error("sandbox_destroy_failed", "sandbox", w.id, "err", err)
			}
		})
	}
	wg.Wait()
}

// takeWarm claims a warm sandbox for a create whose sandbox limits are l
// and whose image is img (nil: the default root), when a pool can serve
// it: the default workspace size (a filesystem's), and the default pool
// or img's (warmimages.go), which a create of img starts. A create of an
// image whose sandbox trusts an egress CA (withCA) neither claims nor
// starts img's pool: an image's trust store is written by its build, so
// no warm sandbox of an image can take one (linuxns.Rebind), and the
// claim would only destroy it in the create's time before a cold create.
func (m *Manager) takeWarm(img *sandbox.Image, l sandbox.Limits, withCA bool) (warm, bool) {
	if l.WorkspaceBytes != 0 {
		return warm{}, false
	}
	if img != nil {
		if withCA {
			return warm{}, false
		}
		return m.imagePools.take(img, m.cfg.Now())
	}
	if m.pool == nil {
		return warm{}, false
	}
	return m.pool.take()
}

// destroyWarm destroys a warm sandbox that no session took after all, in
// the background (Shutdown waits for it), or at once once Shutdown has
// begun.
func (m *Manager) destroyWarm(w warm) {
	destroy := func() {
		if err := w.sb.Destroy(context.Background()); err != nil {
			m.log.Error("sandbox_destroy_failed", "sandbox", w.id, "err", err)
			return
		}
		if w.held {
			m.cfg.ImageSource.Release(w.id)
		}
	}
	if !m.releaseLater() { // Shutdown has begun: now
		destroy()
		return
	}
	go func() {
		defer m.released.Done()
		destroy()
	}()
}

// sandboxFor is the sandbox of a create with spec: the warm one w, bound
// to spec (its limits, its egress CA), when warmed; else, or when spec
// cannot be applied live, a new one from the driver.
func (m *Manager) sandboxFor(ctx context.Context, spec sandbox.Spec, w warm, warmed bool) (sandbox.Sandbox, error) {
	if !warmed {
		return m.driver.Create(ctx, spec)
	}
	var err error = sandbox.ErrNotLive
	if rb, ok := w.sb.(sandbox.Rebinder); ok {
		err = rb.Rebind(ctx, spec)
	} else if spec.Limits == (sandbox.Limits{}) && spec.TrustPEM == nil {
		err = nil
	}
	if err == nil {
		sandbox.TraceOf(ctx).Mark("warm_claim")
		return w.sb, nil
	}
	if !errors.Is(err, sandbox.ErrNotLive) {
		return nil, err
	}
	// The same id for a new sandbox: the warm one must be gone first.
	if err := w.sb.Destroy(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	return m.driver.Create(ctx, spec)
}
