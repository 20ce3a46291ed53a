package gateway

import (
	"encoding/json"
	"fmt"
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

// The streams of pending connections are bounded per session, per tenant
// (429 too_many_followers) and on the gateway (503
// followers_gateway_limit); a released stream frees its place.
func TestFollowEgressBounds(t *testing.T) {
	m := &Manager{}
	sess := func(tenant string) *Session { return &Session{ID: "sbx-" + tenant, Tenant: tenant} }
	code := func(err error) string {
		if e, ok := AsError(err); ok {
			return e.Code
		}
		return ""
	}
	var releases []func()
	follow := func(s *Session) error {
		r, err := m.FollowEgress(s)
		if err == nil {
			releases = append(releases, r)
		}
		return err
	}
	// Per session.
	a := sess("t")
	for range MaxEgressFollowers {
		if err := follow(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := follow(a); code(err) != "too_many_followers" {
		t.Fatalf("past the session's bound: %v", err)
	}
	// Per tenant: the tenant's other sessions.
	for range MaxEgressFollowersPerTenant/MaxEgressFollowers - 1 {
		s := sess("t")
		for range MaxEgressFollowers {
			if err := follow(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := follow(sess("t")); code(err) != "too_many_followers" {
		t.Fatalf("past the tenant's bound: %v", err)
	}
	// On the gateway: other tenants.
	for i := 0; m.followers.total < MaxEgressFollowersTotal; i++ {
		if err := follow(sess(fmt.Sprint("u", i/MaxEgressFollowersPerTenant, "-", i/MaxEgressFollowers))); err != nil {
			t.Fatal(err)
		}
	}
	err := follow(sess("other"))
	if e, ok := AsError(err); !ok || e.Code != "followers_gateway_limit" || e.Kind != KindUnavailable {
		t.Fatalf("past the gateway's bound: %v", err)
	}
	for _, r := range releases {
		r()
		r() // twice is once
	}
	if m.followers.total != 0 || len(m.followers.byTenant) != 0 || a.followers != 0 {
		t.Errorf("after release: %d in all, %v per tenant, %d in the session", m.followers.total, m.followers.byTenant, a.followers)
	}
	if err := follow(sess("other")); err != nil {
		t.Errorf("after release: %v", err)
	}
}
