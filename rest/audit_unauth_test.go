package rest_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
)

// unauthCounts is a rest.Metrics that counts unauthenticated calls.
type unauthCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (*unauthCounts) RateLimited(string) {}

func (c *unauthCounts) UnauthenticatedCall(credential string, audited bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[fmt.Sprintf("%s/%v", credential, audited)]++
}

func (c *unauthCounts) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// auditLines reads every event of the audit log at path.
func auditLines(t *testing.T, path string) []audit.Event {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var out []audit.Event
	sc := bufio.NewScanner(fh)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e audit.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

// TestAuditUnauthenticatedFlood: calls without a credential (unknown
// routes, 401s) write no audit event, only a count; calls whose token
// fails are recorded at most 10 a minute per address; a tenant's calls
// are all recorded.
func TestAuditUnauthenticatedFlood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	af, err := audit.OpenFile(audit.FileConfig{Path: path, SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { af.Close() })
	met := &unauthCounts{n: map[string]int{}}
	g := newGateway(t, gwOptions{audit: af, metrics: met})
	before := len(auditLines(t, path))
	for i := range 300 {
		expect(t, g.do(t, http.MethodGet, fmt.Sprintf("/nope%d", i), "", nil), http.StatusNotFound, "unknown_endpoint")
	}
	for range 20 {
		expect(t, g.do(t, http.MethodGet, "/v1/sessions", "", nil), http.StatusUnauthorized, "unauthorized")
	}
	if n := len(auditLines(t, path)) - before; n != 0 {
		t.Fatalf("320 anonymous calls wrote %d audit events", n)
	}
	if n := met.get("none/false"); n != 320 {
		t.Errorf("counted %d anonymous calls, want 320", n)
	}
	for range 30 {
		expect(t, g.do(t, http.MethodGet, "/v1/sessions", "wrong-token", nil), http.StatusUnauthorized, "unauthorized")
	}
	var bad int
	for _, e := range auditLines(t, path)[before:] {
		if e.Tenant != "" || e.Status != http.StatusUnauthorized || e.Result != "unauthorized" {
			t.Errorf("unexpected event %+v", e)
		}
		bad++
	}
	if bad != 10 {
		t.Errorf("30 calls with a bad token wrote %d events, want 10 (the per-address sample)", bad)
	}
	if a, s := met.get("invalid/true"), met.get("invalid/false"); a != 10 || s != 20 {
		t.Errorf("bad-token calls counted %d audited, %d not; want 10 and 20", a, s)
	}
	// A tenant's calls are all recorded.
	n0 := len(auditLines(t, path))
	for range 15 {
		expect(t, g.do(t, http.MethodGet, "/v1/sessions", aliceKey, nil), http.StatusOK, "")
	}
	if n := len(auditLines(t, path)) - n0; n != 15 {
		t.Errorf("15 of alice's calls wrote %d events", n)
	}
}

// TestAuditPortLink: a call through a preview link is the session
// owner's: tenant, auth link and session in the event, and in the owner's
// GET /v1/audit.
func TestAuditPortLink(t *testing.T) {
	af, err := audit.OpenFile(audit.FileConfig{Path: filepath.Join(t.TempDir(), "audit.log"), SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { af.Close() })
	g := newGateway(t, gwOptions{audit: af})
	up := startUpstream(t)
	s := g.create(t, aliceKey, "")
	r := g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", aliceKey, []byte(fmt.Sprintf(`{"port": %d}`, up.port)))
	expect(t, r, http.StatusOK, "")
	var l linkOut
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(l.URL)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, g.do(t, http.MethodGet, l.URL+"echo", "", nil), http.StatusOK, "")
	// The preview's event is recorded once its proxied answer is done,
	// which the client may see end first: it is looked for a while.
	found := false
	deadline := time.Now().Add(5 * time.Second)
	for !found {
		r = g.do(t, http.MethodGet, "/v1/audit?session="+s.SessionID, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		for _, e := range r.auditPage(t).Events {
			if e.Route == "{preview origin}/*" {
				found = true
				if e.Tenant != "alice" || e.Auth != "link" || e.Session != s.SessionID || e.Status != http.StatusOK || e.Method != http.MethodGet {
					t.Errorf("preview event %+v", e)
				}
			}
			if strings.Contains(fmt.Sprint(e), u.Hostname()[len(u.Hostname())-30:]) {
				t.Errorf("an event names the preview's label: %+v", e)
			}
		}
		if !found && time.Now().After(deadline) {
			t.Fatalf("alice's audit has no port-link call: %s", r.body)
		}
		if !found {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestAuditAccessTokenIsACredential: a call that carries only E2B's
// sandbox access token (X-Access-Token, which rest/compat/e2b checks) and
// fails is a bad credential, sampled into the audit log, not an
// anonymous call.
func TestAuditAccessTokenIsACredential(t *testing.T) {
	met := &unauthCounts{n: map[string]int{}}
	g := newGateway(t, gwOptions{metrics: met})
	expect(t, g.do(t, http.MethodGet, "/v1/sessions", "", nil, "X-Access-Token", "e2bt_wrong"), http.StatusUnauthorized, "unauthorized")
	if n := met.get("invalid/true"); n != 1 {
		t.Errorf("counted %v, want one invalid credential", met.n)
	}
	// The same token as the code interpreter's calls carry it.
	expect(t, g.do(t, http.MethodGet, "/v1/sessions", "", nil, "E2B-Traffic-Access-Token", "e2bt_wrong"), http.StatusUnauthorized, "unauthorized")
	if n := met.get("invalid/true"); n != 2 {
		t.Errorf("counted %v, want two invalid credentials", met.n)
	}
}
