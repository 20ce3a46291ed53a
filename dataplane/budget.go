package dataplane

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// CommandOverhead is what a command costs besides the output it keeps
// (its readers' buffers, its goroutines), as OutputBudget charges it.
const CommandOverhead = 64 << 10

// CommandCost is what a command that keeps up to maxOutputBytes of each
// stream is charged: both streams' kept bytes (none when its output is
// streamed, not kept) plus CommandOverhead.
func CommandCost(maxOutputBytes int64, streamed bool) int64 {
	if streamed {
		return CommandOverhead
	}
	return 2*max(maxOutputBytes, 0) + CommandOverhead
}

// Errors of OutputBudget.Acquire.
var (
	// ErrTenantBudget: the tenant's commands hold its whole budget.
	ErrTenantBudget error = &clientError{err: errors.New("the tenant's running commands hold its whole output budget"),
		api: gateway.Error{Kind: gateway.KindQuota, Code: "too_many_commands", RetryAfter: time.Second,
			Message: "the tenant's running commands hold all the output memory it may use; " +
				"retry when some end, or ask for a smaller maxOutputBytes"}}
	// ErrGatewayBudget: all commands hold the gateway's whole budget.
	ErrGatewayBudget error = &clientError{err: errors.New("running commands hold the gateway's whole output budget"),
		api: gateway.Error{Kind: gateway.KindUnavailable, Code: "commands_unavailable", RetryAfter: time.Second,
			Message: "running commands hold all the output memory of the gateway; retry when some end"}}
)

// OutputBudget bounds the memory that running commands may keep for their
// answers, gateway-wide and per tenant: a command is charged CommandCost
// from before it starts until its answer is written. A command that does
// not fit waits, up to Wait, for others to end, then is refused. Its zero
// value admits everything; set the fields before the first Acquire.
type OutputBudget struct {
	// Total bounds the charges of all commands (<= 0: no bound).
	Total int64
	// PerTenant bounds one tenant's (<= 0: no bound).
	PerTenant int64
	// Wait is how long a command waits for room.
	Wait time.Duration

	mu      sync.Mutex
	used    int64
	tenants map[string]int64
	freed   chan struct{} // closed and replaced when a charge is released
}

// Acquire charges n to tenant, waiting up to b.Wait for room; release
// gives it back (call it once). It fails with ErrTenantBudget or
// ErrGatewayBudget when there is no room in time, or ctx's error.
func (b *OutputBudget) Acquire(ctx context.Context, tenant string, n int64) (release func(), err error) {
	var timer *time.Timer
	for {
		b.mu.Lock()
		err := b.fits(tenant, n)
		if err == nil {
			b.used += n
			if b.tenants == nil {
				b.tenants = map[string]int64{}
			}
			b.tenants[tenant] += n
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			var once sync.Once
			return func() { once.Do(func() { b.release(tenant, n) }) }, nil
		}
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		if timer == nil {
			if b.Wait <= 0 {
				return nil, err
			}
			timer = time.NewTimer(b.Wait)
		}
		select {
		case <-freed:
		case <-timer.C:
			return nil, err
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
}

// fits reports why n does not fit for tenant now (nil: it fits). A
// charge larger than a bound fits when nothing else is charged there, so
// that one command never waits for room that cannot exist. b.mu is held.
func (b *OutputBudget) fits(tenant string, n int64) error {
	if t := b.tenants[tenant]; b.PerTenant > 0 && t > 0 && t+n > b.PerTenant {
		return ErrTenantBudget
	}
	if b.Total > 0 && b.used > 0 && b.used+n > b.Total {
		return ErrGatewayBudget
	}
	return nil
}

func (b *OutputBudget) release(tenant string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.tenants[tenant] -= n; b.tenants[tenant] <= 0 {
		delete(b.tenants, tenant)
	}
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
}

// Used returns what is charged in all and to tenant.
func (b *OutputBudget) Used(tenant string) (total, ofTenant int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.tenants[tenant]
}
