package cluster

import (
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/gateway"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSessionPath(t *testing.T) {
	for _, tc := range []struct {
		method, path, id string
		ok               bool
	}{
		{"GET", "/v1/sessions/sess_a", "sess_a", true},
		{"POST", "/v1/sessions/sess_a/commands", "sess_a", true},
		{"GET", "/v1/sessions/sess_a/processes/p1/output", "sess_a", true},
		{"CONNECT", "/v1/sessions/sess_a", "sess_a", true},
		{"CONNECT", "/sessions/sess_a", "sess_a", true},
		{"GET", "/sessions/sess_a", "", false}, // only CONNECT has the short form
		{"GET", "/v1/sessions", "", false},
		{"GET", "/v1/sessions/", "", false},
		{"GET", "/v1/images", "", false},
		{"GET", "/compat/e2b/sandboxes/x", "", false},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		id, ok := sessionPath(r)
		if id != tc.id || ok != tc.ok {
			t.Errorf("%s %s: %q %v, want %q %v", tc.method, tc.path, id, ok, tc.id, tc.ok)
		}
	}
}

func TestPlacement(t *testing.T) {
	n := &Node{nodes: map[string]Info{
		"a": {ID: "a", Sessions: 5, MaxSessions: 10, MemAvail: 4 << 30},
		"b": {ID: "b", Sessions: 2, MaxSessions: 10, MemAvail: 1 << 30},
		"c": {ID: "c", Sessions: 2, MaxSessions: 10, MemAvail: 2 << 30},
		"d": {ID: "d", Sessions: 0, MaxSessions: 10, MemAvail: 8 << 30, Draining: true},
		"e": {ID: "e", Sessions: 0, MaxSessions: 10, MemAvail: 100 << 20},
		"f": {ID: "f", Sessions: 1, MaxSessions: 1, MemAvail: 8 << 30},
	}}
	var ids []string
	for _, i := range n.candidates() {
		ids = append(ids, i.ID)
	}
	if strings.Join(ids, ",") != "c,b,a" {
		t.Fatalf("candidates %v, want c,b,a (fewest sessions, then most memory; draining, full and short of memory left out)", ids)
	}
	n.nodes = map[string]Info{"d": n.nodes["d"], "f": n.nodes["f"]}
	if got := n.candidates(); len(got) != 0 {
		t.Fatalf("candidates %v with no node having room", got)
	}
}

func TestBearer(t *testing.T) {
	for in, want := range map[string]string{
		"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "Bearer ": "", "": "",
	} {
		r := httptest.NewRequest("GET", "/v1/sessions", nil)
		if in != "" {
			r.Header.Set("Authorization", in)
		}
		if got := gateway.BearerToken(r); got != want {
			t.Errorf("BearerToken(Authorization: %q) = %q, want %q", in, got, want)
		}
	}
	// A CONNECT takes Proxy-Authorization first, and Authorization when
	// it has none there.
	c := httptest.NewRequest("CONNECT", "/sessions/x/ssh", nil)
	c.Header.Set("Authorization", "Bearer plain")
	if got := gateway.BearerToken(c); got != "plain" {
		t.Errorf("CONNECT with Authorization only: %q, want plain", got)
	}
	c.Header.Set("Proxy-Authorization", "Bearer proxy")
	if got := gateway.BearerToken(c); got != "proxy" {
		t.Errorf("CONNECT with both: %q, want proxy", got)
	}
}
