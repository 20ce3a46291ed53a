package rest

import (
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/audit"
)

// TestTimelineEntry: the kinds a timeline keeps pass as they are, a
// snapshot's successful call becomes a lifecycle entry, and every other
// REST call, tunnel and SSH authentication is left out.
func TestTimelineEntry(t *testing.T) {
	for _, tc := range []struct {
		e    audit.Event
		keep bool
		kind string
		op   string
	}{
		{audit.Event{Kind: audit.KindCommand, Command: "ls"}, true, audit.KindCommand, ""},
		{audit.Event{Kind: audit.KindEgress, Result: "denied", Reason: "not allowed"}, true, audit.KindEgress, ""},
		{audit.Event{Kind: audit.KindFile, Op: "write", Bytes: 5}, true, audit.KindFile, "write"},
		{audit.Event{Kind: audit.KindFile, Op: "remove", Source: "sftp"}, true, audit.KindFile, "remove"},
		{audit.Event{Kind: audit.KindFile, Op: "list"}, false, "", ""},
		{audit.Event{Kind: audit.KindFile, Op: "stat", Source: "sftp"}, false, "", ""},
		{audit.Event{Kind: audit.KindSession, Op: "stopped"}, true, audit.KindSession, "stopped"},
		{audit.Event{Kind: audit.KindREST, Method: http.MethodPost, Route: "/v1/sessions/{id}/snapshots", Status: 201, Result: "ok"}, true, audit.KindSession, "snapshot"},
		{audit.Event{Kind: audit.KindREST, Method: http.MethodPost, Route: "/v1/sessions/{id}/snapshots", Status: 409, Result: "conflict"}, false, "", ""},
		{audit.Event{Kind: audit.KindREST, Method: http.MethodGet, Route: "/v1/sessions/{id}/stats", Status: 200}, false, "", ""},
		{audit.Event{Kind: audit.KindTunnelOpen}, false, "", ""},
		{audit.Event{Kind: audit.KindSSHAuth}, false, "", ""},
	} {
		got, ok := timelineEntry(tc.e)
		if ok != tc.keep || (ok && (got.Kind != tc.kind || got.Op != tc.op)) {
			t.Errorf("%+v: %v %+v, want %v kind %q op %q", tc.e, ok, got, tc.keep, tc.kind, tc.op)
		}
	}
}
