package rest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/audit"
)

type auditPage struct {
	Events     []audit.Event `json:"events"`
	NextCursor string        `json:"nextCursor"`
}

func (r result) auditPage(t testing.TB) auditPage {
	t.Helper()
	var p auditPage
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return p
}

// TestContractAudit checks GET /v1/audit against the spec: a tenant's own
// events, newest first, in pages; another tenant's are invisible; every
// documented error.
func TestContractAudit(t *testing.T) {
	cov := newCoverage()
	af, err := audit.OpenFile(audit.FileConfig{Path: filepath.Join(t.TempDir(), "audit.log"), SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { af.Close() })
	g := newGateway(t, gwOptions{cov: cov, audit: af})
	s := g.create(t, aliceKey, "")
	for _, cmd := range []string{"true", "exit 3"} {
		body, _ := json.Marshal(map[string]string{"command": cmd})
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands", aliceKey, body), http.StatusOK, "")
	}
	g.create(t, bobKey, "")

	t.Run("own-events-newest-first-in-pages", func(t *testing.T) {
		r := g.do(t, http.MethodGet, "/v1/audit?session="+s.SessionID, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		all := r.auditPage(t).Events
		// created, create call, 2 x (command, call)
		if len(all) != 6 {
			t.Fatalf("alice's session has %d events: %+v", len(all), all)
		}
		for i, e := range all {
			if e.Tenant != "alice" || e.Session != s.SessionID {
				t.Errorf("event %+v is not alice's session's", e)
			}
			if i > 0 && e.Seq >= all[i-1].Seq {
				t.Errorf("not newest first: %d after %d", e.Seq, all[i-1].Seq)
			}
		}
		if all[len(all)-1].Kind != audit.KindSession || all[len(all)-1].Op != "created" {
			t.Errorf("oldest event %+v, want the create", all[len(all)-1])
		}
		var paged []audit.Event
		q := "/v1/audit?limit=4&session=" + s.SessionID
		for pages := 0; ; pages++ {
			if pages > 3 {
				t.Fatal("pagination does not end")
			}
			r := g.do(t, http.MethodGet, q, aliceKey, nil)
			expect(t, r, http.StatusOK, "")
			p := r.auditPage(t)
			paged = append(paged, p.Events...)
			if p.NextCursor == "" {
				break
			}
			q = "/v1/audit?limit=4&session=" + s.SessionID + "&cursor=" + url.QueryEscape(p.NextCursor)
		}
		if len(paged) != len(all) {
			t.Fatalf("pages gave %d events, want %d", len(paged), len(all))
		}
		for i := range all {
			if paged[i].Seq != all[i].Seq {
				t.Errorf("page event %d is seq %d, want %d", i, paged[i].Seq, all[i].Seq)
			}
		}
		// since: nothing after the newest.
		since := all[0].Time.Add(1).Format("2006-01-02T15:04:05.999999999Z07:00")
		r = g.do(t, http.MethodGet, "/v1/audit?session="+s.SessionID+"&since="+url.QueryEscape(since), aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if n := len(r.auditPage(t).Events); n != 0 {
			t.Errorf("since after the newest: %d events", n)
		}
	})

	t.Run("other-tenants-invisible", func(t *testing.T) {
		for _, q := range []string{"/v1/audit", "/v1/audit?session=" + s.SessionID} {
			r := g.do(t, http.MethodGet, q, bobKey, nil)
			expect(t, r, http.StatusOK, "")
			for _, e := range r.auditPage(t).Events {
				if e.Tenant != "bob" || strings.Contains(string(r.body), s.SessionID) {
					t.Errorf("bob sees %+v", e)
				}
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		for q, code := range map[string]string{
			"since=yesterday":                     "invalid_since",
			"since=":                              "invalid_since",
			"limit=0":                             "invalid_limit",
			"limit=1001":                          "invalid_limit",
			"cursor=abc":                          "invalid_cursor",
			"session=" + strings.Repeat("x", 129): "invalid_session",
		} {
			expect(t, g.do(t, http.MethodGet, "/v1/audit?"+q, aliceKey, nil), http.StatusBadRequest, code)
		}
		expect(t, g.do(t, http.MethodGet, "/v1/audit", "", nil), http.StatusUnauthorized, "unauthorized")
		off := newGateway(t, gwOptions{cov: cov})
		expect(t, off.do(t, http.MethodGet, "/v1/audit", aliceKey, nil), http.StatusNotFound, "audit_unavailable")
	})

	requireSeen(t, cov, func(path string) bool { return path == "/v1/audit" }, map[string]string{
		"listAuditEvents 500": "a read error of the audit files; not reachable without breaking the disk under the test",
	})
}
