package rest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
)

type timelinePage struct {
	Entries    []audit.Event `json:"entries"`
	NextCursor string        `json:"nextCursor"`
}

func (r result) timeline(t testing.TB) timelinePage {
	t.Helper()
	var p timelinePage
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return p
}

// TestContractTimeline checks GET /v1/sessions/{id}/timeline against the
// spec: the session's commands and lifecycle from the audit trail, newest
// first, without the REST calls that surround them; kinds, pages, the
// after= follow, another tenant's session, every documented error.
func TestContractTimeline(t *testing.T) {
	cov := newCoverage()
	af, err := audit.OpenFile(audit.FileConfig{Path: filepath.Join(t.TempDir(), "audit.log"), SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { af.Close() })
	g := newGateway(t, gwOptions{cov: cov, audit: af})
	s := g.create(t, aliceKey, "")
	other := g.create(t, aliceKey, "") // its events are not s's
	for _, cmd := range []string{"true", "exit 3"} {
		body, _ := json.Marshal(map[string]string{"command": cmd})
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands", aliceKey, body), http.StatusOK, "")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+other.SessionID+"/commands", aliceKey, body), http.StatusOK, "")
	}
	for range 3 { // REST calls the timeline leaves out
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil), http.StatusOK, "")
	}
	base := "/v1/sessions/" + s.SessionID + "/timeline"

	r := g.do(t, http.MethodGet, base, aliceKey, nil)
	expect(t, r, http.StatusOK, "")
	all := r.timeline(t).Entries
	if len(all) != 3 {
		t.Fatalf("timeline has %d entries, want 2 commands and the create: %+v", len(all), all)
	}
	if all[0].Kind != audit.KindCommand || all[0].Command != "exit 3" || all[0].ExitCode == nil || *all[0].ExitCode != 3 ||
		all[1].Kind != audit.KindCommand || all[1].Command != "true" || all[1].ExitCode == nil || *all[1].ExitCode != 0 ||
		all[2].Kind != audit.KindSession || all[2].Op != "created" {
		t.Errorf("timeline %+v, want exit 3, true, created (newest first)", all)
	}
	for i, e := range all {
		if e.Session != s.SessionID || e.Tenant != "alice" || (i > 0 && e.Seq >= all[i-1].Seq) {
			t.Errorf("entry %d %+v: not s's, or not newest first", i, e)
		}
	}

	t.Run("kind", func(t *testing.T) {
		r := g.do(t, http.MethodGet, base+"?kind=session,egress", aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if es := r.timeline(t).Entries; len(es) != 1 || es[0].Op != "created" {
			t.Errorf("kind=session,egress: %+v", es)
		}
	})

	t.Run("pages", func(t *testing.T) {
		var paged []audit.Event
		q := base + "?limit=1"
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatal("pagination does not end")
			}
			r := g.do(t, http.MethodGet, q, aliceKey, nil)
			expect(t, r, http.StatusOK, "")
			p := r.timeline(t)
			paged = append(paged, p.Entries...)
			if p.NextCursor == "" {
				break
			}
			q = base + "?limit=1&cursor=" + url.QueryEscape(p.NextCursor)
		}
		if len(paged) != len(all) {
			t.Fatalf("pages gave %d entries, want %d: %+v", len(paged), len(all), paged)
		}
		for i := range all {
			if paged[i].Seq != all[i].Seq {
				t.Errorf("page entry %d is seq %d, want %d", i, paged[i].Seq, all[i].Seq)
			}
		}
	})

	t.Run("after", func(t *testing.T) {
		r := g.do(t, http.MethodGet, base+"?after="+strconv.FormatUint(all[0].Seq, 10), aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if p := r.timeline(t); len(p.Entries) != 0 || p.NextCursor != "" {
			t.Errorf("after the newest: %+v", p)
		}
		r = g.do(t, http.MethodGet, base+"?after="+strconv.FormatUint(all[2].Seq, 10), aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if es := r.timeline(t).Entries; len(es) != 2 || es[0].Seq != all[0].Seq || es[1].Seq != all[1].Seq {
			t.Errorf("after the create: %+v, want the two commands", es)
		}
		// A follower's partial answer: after= with a limit below what is
		// new answers a nextCursor, and the same after= with it pages on
		// down to after, through all three.
		from := strconv.FormatUint(all[2].Seq-1, 10)
		var paged []audit.Event
		q := base + "?limit=1&after=" + from
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatal("the follow's pages do not end")
			}
			r := g.do(t, http.MethodGet, q, aliceKey, nil)
			expect(t, r, http.StatusOK, "")
			p := r.timeline(t)
			if len(p.Entries) != 1 && p.NextCursor != "" {
				t.Errorf("page %d: %+v, want 1 entry", pages, p)
			}
			paged = append(paged, p.Entries...)
			if p.NextCursor == "" {
				break
			}
			q = base + "?limit=1&after=" + from + "&cursor=" + url.QueryEscape(p.NextCursor)
		}
		if len(paged) != 3 || paged[0].Seq != all[0].Seq || paged[1].Seq != all[1].Seq || paged[2].Seq != all[2].Seq {
			t.Errorf("after + limit=1 paged %+v, want all three entries newest first", paged)
		}
	})

	t.Run("other-tenant", func(t *testing.T) {
		expect(t, g.do(t, http.MethodGet, base, bobKey, nil), http.StatusNotFound, "not_found")
	})

	t.Run("errors", func(t *testing.T) {
		for q, code := range map[string]string{
			"kind=rest":          "invalid_kind",
			"kind=":              "invalid_kind",
			"kind=command,,file": "invalid_kind",
			"after=-1":           "invalid_after",
			"after=x":            "invalid_after",
			"limit=0":            "invalid_limit",
			"limit=1001":         "invalid_limit",
			"cursor=abc":         "invalid_cursor",
		} {
			expect(t, g.do(t, http.MethodGet, base+"?"+q, aliceKey, nil), http.StatusBadRequest, code)
		}
		expect(t, g.do(t, http.MethodGet, base, "", nil), http.StatusUnauthorized, "unauthorized")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+other.SessionID, aliceKey, nil), http.StatusOK, "")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+other.SessionID, aliceKey, nil), http.StatusNoContent, "")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+other.SessionID+"/timeline", aliceKey, nil), http.StatusGone, "session_gone")
		off := newGateway(t, gwOptions{cov: cov})
		os := off.create(t, aliceKey, "")
		expect(t, off.do(t, http.MethodGet, "/v1/sessions/"+os.SessionID+"/timeline", aliceKey, nil), http.StatusNotFound, "audit_unavailable")
	})

	requireSeen(t, cov, func(path string) bool { return path == "/v1/sessions/{id}/timeline" }, map[string]string{
		"getSessionTimeline 500": "a read error of the audit files; not reachable without breaking the disk under the test",
	})
}

// TestTimelineScanBudget: one timeline call reads at most the audit log's
// QueryScanBytes, its audit pages together. The session's command and
// create lie behind more than that of its own REST calls (which the
// timeline leaves out), each audit page of them under the budget: the
// first call answers no entry and a cursor, and the cursors lead on to
// both.
func TestTimelineScanBudget(t *testing.T) {
	const budget = 256 << 10
	path := filepath.Join(t.TempDir(), "audit.log")
	af, err := audit.OpenFile(audit.FileConfig{Path: path, SyncEvery: -1, QueryScanBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { af.Close() })
	g := newGateway(t, gwOptions{audit: af})
	s := g.create(t, aliceKey, "")
	body, _ := json.Marshal(map[string]string{"command": "true"})
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands", aliceKey, body), http.StatusOK, "")
	size := func() int64 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	before := size()
	const filler = 3 * audit.MaxQueryLimit
	for range filler {
		af.Record(context.Background(), audit.Event{Kind: audit.KindREST, Tenant: "alice", Session: s.SessionID, Auth: "api_key",
			Method: http.MethodGet, Route: "/v1/sessions/{id}", Status: http.StatusOK, DurationMs: 1})
	}
	fill := size() - before
	if page := fill * audit.MaxQueryLimit / filler; fill <= budget || page >= budget {
		t.Fatalf("the filler is %d bytes, an audit page of it %d: want more than the budget (%d) in all, less in a page", fill, page, budget)
	}
	base := "/v1/sessions/" + s.SessionID + "/timeline"
	r := g.do(t, http.MethodGet, base, aliceKey, nil)
	expect(t, r, http.StatusOK, "")
	first := r.timeline(t)
	if len(first.Entries) != 0 || first.NextCursor == "" {
		t.Fatalf("the first call answered %d entries and cursor %q: it read past its scan budget of %d bytes to reach them",
			len(first.Entries), first.NextCursor, budget)
	}
	var got []audit.Event
	for q, calls := base+"?cursor="+url.QueryEscape(first.NextCursor), 1; ; calls++ {
		if calls > 6 {
			t.Fatal("the cursors do not end")
		}
		r := g.do(t, http.MethodGet, q, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		p := r.timeline(t)
		got = append(got, p.Entries...)
		if p.NextCursor == "" {
			break
		}
		q = base + "?cursor=" + url.QueryEscape(p.NextCursor)
	}
	if len(got) != 2 || got[0].Kind != audit.KindCommand || got[1].Op != "created" {
		t.Errorf("the cursors led to %+v, want the command and the create", got)
	}
}

// TestTimelineProcessID: a background process's command entry carries
// its processId (what the console matches a process's output by), and a
// command run otherwise carries none.
func TestTimelineProcessID(t *testing.T) {
	af, err := audit.OpenFile(audit.FileConfig{Path: filepath.Join(t.TempDir(), "audit.log"), SyncEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { af.Close() })
	g := newGateway(t, gwOptions{audit: af})
	s := g.create(t, aliceKey, "")
	base := "/v1/sessions/" + s.SessionID
	r := g.do(t, http.MethodPost, base+"/processes", aliceKey, []byte(`{"command": "echo same"}`))
	expect(t, r, http.StatusCreated, "")
	var pr struct{ ProcessID string }
	if err := json.Unmarshal(r.body, &pr); err != nil || pr.ProcessID == "" {
		t.Fatalf("start: %s %v", r.body, err)
	}
	expect(t, g.do(t, http.MethodPost, base+"/commands", aliceKey, []byte(`{"command": "echo same"}`)), http.StatusOK, "")
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := g.do(t, http.MethodGet, base+"/timeline?kind=command", aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		var bg, fg []audit.Event
		for _, e := range r.timeline(t).Entries {
			if e.ProcessID != "" {
				bg = append(bg, e)
			} else {
				fg = append(fg, e)
			}
		}
		if len(bg)+len(fg) == 2 {
			if len(bg) != 1 || bg[0].ProcessID != pr.ProcessID || bg[0].Command != "echo same" || len(fg) != 1 {
				t.Errorf("command entries: with a processId %+v, without %+v; want the process's (%s) and the command's", bg, fg, pr.ProcessID)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process's and the command's entries: %s", r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
