//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
)

// A create whose caller goes away while the sandbox is built is a client
// disconnect, logged at info: not an ERROR "sandbox init: ... i/o
// timeout". The driver's error says the context ended.
func TestLinuxCreateAbandonedIsNoError(t *testing.T) {
	dataDir := t.TempDir()
	logs := &gwtest.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Log: log})
	m := gateway.NewManager(gateway.Config{}, d, log)
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	abandoned := 0
	// The cancellation must land while the init builds the sandbox: try
	// a few delays, from too early to too late.
	for i := range 40 {
		ctx, cancel := context.WithCancel(context.Background())
		delay := time.Duration(i%20) * 3 * time.Millisecond
		timer := time.AfterFunc(delay, cancel)
		s, _, err := m.Create(ctx, gateway.Principal{Tenant: "t"}, gateway.CreateParams{})
		timer.Stop()
		cancel()
		if err == nil {
			if err := m.Delete(context.Background(), gateway.Principal{Tenant: "t"}, s.ID); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("create cancelled after %v: %v, want the context's error", delay, err)
		}
		abandoned++
	}
	out := logs.String()
	for line := range strings.SplitSeq(out, "\n") {
		if strings.Contains(line, "level=ERROR") && (strings.Contains(line, "create_failed") ||
			strings.Contains(line, "i/o timeout") || strings.Contains(line, "context canceled")) {
			t.Errorf("an abandoned create logged an error: %s", line)
		}
	}
	if abandoned > 0 && !strings.Contains(out, "sandbox_create_abandoned") {
		t.Errorf("no sandbox_create_abandoned line:\n%s", out)
	}
	t.Logf("%d of 40 creates were abandoned mid-way", abandoned)
	checkNoLeaks(t, dataDir)
}
