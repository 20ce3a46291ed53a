package egress

import (
	"net/http"
	"testing"
)

// BenchmarkConnectRefused is one CONNECT past the session's bound,
// answered 503, unpaced: what a flood's refused connections cost (client
// and proxy together, in one process; the proxy's share is its accept,
// write, shutdown and close, mostly system calls).
func BenchmarkConnectRefused(b *testing.B) {
	hole := blackhole(b)
	p, _ := newTestProxy(b, Config{AllowCIDRs: loopback, Hosts: hostsFor("hole.test"), MaxConns: 1, RefusalsPerSecond: 1 << 30})
	_, u := startSession(b, p, "s", Policy{Allow: mustList(b, "hole.test:"+hole)}, nil)
	held, _, code, _, err := connectRaw(u.Host, "hole.test:"+hole)
	if err != nil || code != http.StatusOK {
		b.Fatalf("CONNECT: %v %d", err, code)
	}
	defer held.Close()
	b.ResetTimer()
	for b.Loop() {
		_, _, code, _, err := connectRaw(u.Host, "hole.test:"+hole)
		if err != nil || code != http.StatusServiceUnavailable {
			b.Fatalf("CONNECT past the bound: %v %d", err, code)
		}
	}
}
