package gateway

import (
	"encoding/json"
	"slices"
	"testing"
)

// An ask-mode session's mode and deny list are kept in its record (the
// store, and a restart), and shown in its egress view.
func TestAskStateInRecord(t *testing.T) {
	s := &Session{ID: "sbx-a", Tenant: "t", egressAllow: []string{"pypi.org"}, egressMode: EgressModeAsk,
		egressDeny: []string{"evil.test:443"}, conns: map[*connEntry]struct{}{}}
	b, err := json.Marshal(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Egress == nil || r.Egress.Mode != "ask" || !slices.Equal(r.Egress.Deny, []string{"evil.test:443"}) {
		t.Fatalf("record's egress %+v", r.Egress)
	}
	mode, deny := sessionFromRecord(r).askState()
	if mode != EgressModeAsk || !slices.Equal(deny, []string{"evil.test:443"}) {
		t.Errorf("restored: %q %v", mode, deny)
	}
	// A deny session shows no mode.
	d := &Session{ID: "sbx-b", conns: map[*connEntry]struct{}{}}
	if b, _ := json.Marshal(d.Snapshot().Egress); string(b) != `{"allow":[],"bytesIn":0,"bytesOut":0}` {
		t.Errorf("a deny session's egress: %s", b)
	}
}

func TestCheckEgressMode(t *testing.T) {
	m := &Manager{}
	for _, c := range []struct{ in, want, code string }{
		{"", "", ""}, {"deny", "", ""}, {"ask", "", "egress_unavailable"}, {"Ask", "", "invalid_egress_mode"},
	} {
		got, err := m.checkEgressMode(c.in)
		code := ""
		if e, ok := AsError(err); ok {
			code = e.Code
		}
		if got != c.want || code != c.code {
			t.Errorf("%q: %q %q, want %q %q", c.in, got, code, c.want, c.code)
		}
	}
}
