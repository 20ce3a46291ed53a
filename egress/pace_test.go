package egress

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A sandbox that reconnects in a loop past its bound gets its 503s at the
// tenant's pace (RefusalsPerSecond, after a burst of as many), not as fast
// as it can make them: the gateway's work on refusals is bounded. Every
// connection still gets its 503, none is reset, and another tenant's
// refusals are not slowed.
func TestRefusalsPaced(t *testing.T) {
	const rate = 50
	hole := blackhole(t)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("hole.test"), MaxConns: 1, RefusalsPerSecond: rate})
	pol := Policy{Allow: mustList(t, "hole.test:"+hole)}
	_, flood := startTenantSession(t, p, "flood", "a", pol, nil)
	_, other := startTenantSession(t, p, "other", "b", pol, nil)
	for _, proxy := range []string{flood.Host, other.Host} {
		held, _, code, _, err := connectRaw(proxy, "hole.test:"+hole)
		if err != nil || code != http.StatusOK {
			t.Fatalf("CONNECT: %v %d", err, code)
		}
		t.Cleanup(func() { held.Close() })
	}
	// hammer refuses CONNECTs through proxy from n loops for d, and
	// counts the 503s answered within d, and the other answers.
	hammer := func(proxy string, n int, d time.Duration) (inTime int64, bad []string) {
		var wg sync.WaitGroup
		var count atomic.Int64
		var mu sync.Mutex
		end := time.Now().Add(d)
		for range n {
			wg.Go(func() {
				for time.Now().Before(end) {
					_, _, code, body, err := connectRaw(proxy, "hole.test:"+hole)
					switch {
					case err != nil || code != http.StatusServiceUnavailable:
						mu.Lock()
						bad = append(bad, http.StatusText(code)+" "+body+" "+errString(err))
						mu.Unlock()
					case time.Now().Before(end):
						count.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return count.Load(), bad
	}
	var otherCount int64
	var otherBad []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(500 * time.Millisecond) // the flood's burst is spent
		otherCount, otherBad = hammer(other.Host, 1, time.Second)
	}()
	const window = 2 * time.Second
	n, bad := hammer(flood.Host, 8, window)
	<-done
	t.Logf("in %v: the flooding tenant got %d refusals (pace %d/s), the other %d in 1s", window, n, rate, otherCount)
	if len(bad) > 0 || len(otherBad) > 0 {
		t.Errorf("answers other than 503: %q %q", bad, otherBad)
	}
	if max := int64(rate + rate*window/time.Second + rate/2); n > max {
		t.Errorf("the flooding tenant got %d refusals in %v; want at most %d (a burst of %d, then %d a second)", n, window, max, rate, rate)
	}
	if otherCount < rate/2 {
		t.Errorf("the other tenant got %d refusals in a second; its pace is its own (a burst of %d)", otherCount, rate)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
