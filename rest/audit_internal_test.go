package rest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
)

// TestUnauthSamplerSummary: past the per-address and per-minute samples,
// unauthenticated calls are summed up in one event per kind of
// credential, and one log line, at the first call after the minute.
func TestUnauthSamplerSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	af, err := audit.OpenFile(audit.FileConfig{Path: path, SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer af.Close()
	var logs bytes.Buffer
	a := &api{cfg: Config{Audit: af, Log: slog.New(slog.NewTextHandler(&logs, nil))}}
	s := &a.unauth
	t0 := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	admitted := 0
	for i := range 500 {
		addr := "10.0.0." + string(rune('0'+i%20)) // 20 addresses
		if s.admit(t0.Add(time.Duration(i)*time.Millisecond), addr, credentialInvalid) {
			admitted++
		}
		if s.admit(t0, addr, credentialNone) {
			t.Fatal("a call without a credential was sampled")
		}
	}
	if admitted != unauthPerMin {
		t.Fatalf("%d sampled in a minute, want %d", admitted, unauthPerMin)
	}
	s.flush(a, t0.Add(59*time.Second))
	if len(auditEvents(t, path)) != 0 || logs.Len() != 0 {
		t.Fatal("summary before the minute ended")
	}
	s.flush(a, t0.Add(time.Minute))
	lines := auditEvents(t, path)
	if len(lines) != 2 {
		t.Fatalf("summary events %+v", lines)
	}
	got := map[string]int64{}
	for _, e := range lines {
		if e.Route != "(unauthenticated)" || e.Result != "not_recorded" {
			t.Errorf("summary event %+v", e)
		}
		got[strings.Fields(e.Reason)[1]] = e.Count
	}
	if got[credentialNone] != 500 || got[credentialInvalid] != 500-unauthPerMin {
		t.Errorf("summary counts %v", got)
	}
	if !strings.Contains(logs.String(), "unauthenticated_calls_not_audited") || !strings.Contains(logs.String(), "credential_none=500") {
		t.Errorf("log %q", logs.String())
	}
	// A new minute samples again.
	if !s.admit(t0.Add(time.Minute), "10.0.0.1", credentialInvalid) {
		t.Error("the next minute samples nothing")
	}
}

// auditEvents reads the events of the audit log at path, oldest first.
func auditEvents(t *testing.T, path string) []audit.Event {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var e audit.Event
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}
