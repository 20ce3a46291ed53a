package envd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/dataplane"
)

// TestWatchPacing: a watcher waits at least PollFactor times its last
// listing's duration, and the entries listed are budgeted per tenant and
// gateway-wide.
func TestWatchPacing(t *testing.T) {
	ws := newWatchers(WatchBounds{Interval: 100 * time.Millisecond, TenantEntriesPerSecond: 1000, EntriesPerSecond: 3000}.withDefaults())
	ws.tenantBudget["a"] = &entryBudget{rate: 1000}
	ws.tenantBudget["b"] = &entryBudget{rate: 1000}
	if d := ws.charge("a", 10, time.Millisecond); d != 100*time.Millisecond {
		t.Errorf("a cheap listing waits %s, want the interval", d)
	}
	if d := ws.charge("a", 10, time.Second); d < 10*time.Second {
		t.Errorf("a listing of 1 s waits %s, want 10 s at least", d)
	}
	// Tenant a lists 5000 entries a go at 1000 a second: 4 s over its
	// second of burst (and more as it goes on).
	if d := ws.charge("a", 5000, 0); d < 3*time.Second {
		t.Errorf("over the tenant's budget: waits %s", d)
	}
	// The gateway's budget is now spent too: tenant b waits for it.
	if d := ws.charge("b", 10, 0); d < 500*time.Millisecond {
		t.Errorf("over the gateway's budget: waits %s", d)
	}
}

// TestSessionNotRunningCode: a session that ended under a call is
// Unavailable saying it "was not found" running (E2B's SDKs raise their
// SandboxNotRunningException), not FailedPrecondition.
func TestSessionNotRunningCode(t *testing.T) {
	s := New(Deps{})
	ce := s.toRPC(context.Background(), fmt.Errorf("run: %w", dataplane.ErrSessionEnded), "run")
	if ce.Code() != connect.CodeUnavailable || ce.Meta().Get(codeMeta) != "session_not_running" || !strings.Contains(ce.Message(), "was not found") {
		t.Errorf("%v (code %v, %s)", ce, ce.Code(), ce.Meta().Get(codeMeta))
	}
}
