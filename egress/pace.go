package egress

import (
	"sync"
	"time"
)

// DefaultRefusalsPerTenant is Config.RefusalsPerSecond's default.
const DefaultRefusalsPerTenant = 256

// maxPaceBuckets is how many tenants' buckets are kept before full ones
// are forgotten.
const maxPaceBuckets = 1024

// pacer paces the connections each tenant's sessions have refused (503
// past a bound): each refusal takes a token of the tenant's bucket, which
// holds and refills rate a second, and a session whose refusal found none
// stops accepting until its token is due. The connections a sandbox
// opens meanwhile wait in its listener's backlog, where they cost the
// gateway nothing, and get their 503 in turn. So a sandbox that
// reconnects in a loop past its bound costs the gateway at most rate
// refusals a second per tenant, not as many as it can make.
type pacer struct {
	rate float64 // tokens a second, and the burst

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64 // below zero: reserved ahead
	last   time.Time
}

// reserve takes a token of tenant's bucket at now and returns how long to
// wait before it is due (0: at once).
func (pc *pacer) reserve(tenant string, now time.Time) time.Duration {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	b := pc.bucket(tenant, now)
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / pc.rate * float64(time.Second))
}

// take takes a token of tenant's bucket at now if one is there, without
// reserving ahead: false when none is.
func (pc *pacer) take(tenant string, now time.Time) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	b := pc.bucket(tenant, now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// bucket is tenant's bucket, refilled up to now (pc.mu held).
func (pc *pacer) bucket(tenant string, now time.Time) *bucket {
	if pc.buckets == nil {
		pc.buckets = map[string]*bucket{}
	}
	b := pc.buckets[tenant]
	if b == nil {
		if len(pc.buckets) >= maxPaceBuckets {
			pc.forgetFull(now)
		}
		b = &bucket{tokens: pc.rate, last: now}
		pc.buckets[tenant] = b
	}
	b.tokens = min(pc.rate, b.tokens+now.Sub(b.last).Seconds()*pc.rate)
	b.last = now
	return b
}

// forgetFull drops the buckets that have refilled: they are as a new one.
func (pc *pacer) forgetFull(now time.Time) {
	for t, b := range pc.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*pc.rate >= pc.rate {
			delete(pc.buckets, t)
		}
	}
}
