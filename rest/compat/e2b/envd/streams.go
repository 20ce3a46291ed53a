package envd

import (
	"fmt"
	"sync"

	"connectrpc.com/connect"
)

// StreamBounds bound the streaming calls open at once (Process/Start,
// Connect and StreamInput, Filesystem/WatchDir): each holds a goroutine
// and a connection for as long as its client keeps it. Zero values get
// the defaults.
type StreamBounds struct {
	PerSession, PerTenant, Total int
}

// Defaults of StreamBounds: a session's 64 running processes, each
// with a stream and as many connected besides.
const (
	DefaultStreamsPerSession = 128
	DefaultStreamsPerTenant  = 512
	DefaultStreams           = 8192
)

func (b StreamBounds) withDefaults() StreamBounds {
	if b.PerSession <= 0 {
		b.PerSession = DefaultStreamsPerSession
	}
	if b.PerTenant <= 0 {
		b.PerTenant = DefaultStreamsPerTenant
	}
	if b.Total <= 0 {
		b.Total = DefaultStreams
	}
	return b
}

// streams counts the open streams.
type streams struct {
	b         StreamBounds
	mu        sync.Mutex
	bySession map[string]int
	byTenant  map[string]int
	total     int
}

func newStreams(b StreamBounds) *streams {
	return &streams{b: b.withDefaults(), bySession: map[string]int{}, byTenant: map[string]int{}}
}

// open counts a stream of c, or refuses it past a bound
// (resource_exhausted, which the SDKs raise as RateLimitException); the
// caller calls done when the stream ends.
func (st *streams) open(c call) (done func(), err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.bySession[c.sess.ID] >= st.b.PerSession:
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_streams",
			fmt.Sprintf("this sandbox has %d streaming calls open, the most it may; close one", st.b.PerSession))
	case st.byTenant[c.sess.Tenant] >= st.b.PerTenant:
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_streams",
			fmt.Sprintf("your sandboxes have %d streaming calls open, the most they may; close one", st.b.PerTenant))
	case st.total >= st.b.Total:
		return nil, rpcError(connect.CodeResourceExhausted, "too_many_streams", "the gateway has as many streaming calls open as it may; try again later")
	}
	st.bySession[c.sess.ID]++
	st.byTenant[c.sess.Tenant]++
	st.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.bySession[c.sess.ID]--; st.bySession[c.sess.ID] <= 0 {
				delete(st.bySession, c.sess.ID)
			}
			if st.byTenant[c.sess.Tenant]--; st.byTenant[c.sess.Tenant] <= 0 {
				delete(st.byTenant, c.sess.Tenant)
			}
			st.total--
		})
	}, nil
}
