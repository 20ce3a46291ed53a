package cluster

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// testFront is a front whose node knows the given peers only.
func testFront(peers ...Info) *Front {
	n := &Node{nodes: map[string]Info{}, cfg: Config{NodeID: "self", Token: "t"}}
	for _, p := range peers {
		n.nodes[p.ID] = p
	}
	return NewFront(FrontConfig{Node: n, Log: slog.New(slog.DiscardHandler),
		WriteError: func(w http.ResponseWriter, err error) {
			var ge *gateway.Error
			if !errors.As(err, &ge) {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": ge.Code}})
		}})
}

// TestPlaceCreateOnlySkipsWhatWasNotSent: a create goes on to the next
// node only when the first could not be dialled or answered it was full;
// a peer that took the request and then broke may have created the
// session, so the answer is node_unavailable and no other node is asked.
func TestPlaceCreateOnlySkipsWhatWasNotSent(t *testing.T) {
	var created atomic.Int32
	spare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		created.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer spare.Close()
	var took atomic.Int32
	broke := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		took.Add(1)
		_, _ = io.ReadAll(r.Body)
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset: the relay's read fails (a *net.OpError)
			}
			c.Close() // read the request, answered nothing
		}
	}))
	defer broke.Close()
	full := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"code":"capacity"}}`)
	}))
	defer full.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close() // nothing listens: the dial fails

	for _, tc := range []struct {
		name        string
		first       string
		wantCreated int32
		wantStatus  int
	}{
		{"dial failed", closed, 1, http.StatusCreated},
		{"full", full.URL, 1, http.StatusCreated},
		{"broke after the request", broke.URL, 0, http.StatusServiceUnavailable},
	} {
		created.Store(0)
		f := testFront()
		cands := []Info{{ID: "first", URL: tc.first}, {ID: "spare", URL: spare.URL}}
		r := httptest.NewRequest(http.MethodPost, "/v1/sessions", strings.NewReader(`{}`))
		w := httptest.NewRecorder()
		placed := f.placeCreate(w, r, cands)
		f.Shutdown()
		if !placed || w.Code != tc.wantStatus || created.Load() != tc.wantCreated {
			t.Errorf("%s: placed %v, %d, %d created on the next node; want %d, %d",
				tc.name, placed, w.Code, created.Load(), tc.wantStatus, tc.wantCreated)
		}
	}
	if took.Load() == 0 {
		t.Error("the broken peer never got the request")
	}
}

func TestNotSent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, true},
		{&net.OpError{Op: "read", Err: errors.New("reset")}, false},
		{&net.OpError{Op: "write", Err: errors.New("broken pipe")}, false},
		{io.ErrUnexpectedEOF, false},
	} {
		if got := notSent(tc.err); got != tc.want {
			t.Errorf("notSent(%v) = %v", tc.err, got)
		}
	}
}

func TestLinkSession(t *testing.T) {
	tok := func(payload string) string {
		return base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".c2ln"
	}
	good := tok(`{"v":1,"s":"sess_abc","p":"/x","e":1}`)
	for _, tc := range []struct {
		path, id string
	}{
		{"/links/" + good, "sess_abc"},
		{"/links/ports/" + good, "sess_abc"},
		{"/links/ports/" + good + "/api/x?y", "sess_abc"},
		{"/links/" + good + "/more", ""},
		{"/links/" + tok(`{"s":"../owner/x"}`), ""},
		{"/links/" + tok(`{"s":""}`), ""},
		{"/links/" + tok(`not json`), ""},
		{"/links/nodot", ""},
		{"/links/!!!.sig", ""},
		{"/links/" + strings.Repeat("A", maxLinkToken) + ".sig", ""},
		{"/v1/links/" + good, ""},
	} {
		id, ok := linkSession(tc.path)
		if id != tc.id || ok != (tc.id != "") {
			t.Errorf("%.60s: %q %v, want %q", tc.path, id, ok, tc.id)
		}
	}
}

// TestMergeAudit: pages of three nodes merge newest first, and the
// cursor takes each node on from its last event shown.
func TestMergeAudit(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := func(seq uint64, sec int) auditEvent {
		return auditEvent{raw: json.RawMessage(strconv.Itoa(int(seq))), seq: seq, time: at.Add(time.Duration(sec) * time.Second)}
	}
	pages := []auditPage{
		{node: "a", events: []auditEvent{ev(9, 9), ev(8, 5), ev(7, 1)}, next: "7"},
		{node: "b", events: []auditEvent{ev(4, 8), ev(3, 6)}},
		{node: "c", events: []auditEvent{ev(2, 7)}, next: ""},
	}
	cur := auditCursor{V: 1, Nodes: map[string]string{"a": "", "b": "", "c": ""}}
	out, next := mergeAudit(pages, cur, 4)
	var got []string
	for _, r := range out {
		got = append(got, string(r))
	}
	if strings.Join(got, ",") != "9,4,2,3" {
		t.Errorf("merged %v, want 9,4,2,3", got)
	}
	// a: 9 shown, older than 9 next; b: all shown, no more; c: all shown.
	if len(next.Nodes) != 1 || next.Nodes["a"] != "9" {
		t.Errorf("next %v, want only a from 9", next.Nodes)
	}
	// A node whose page ran out while it has more stops the merge there.
	pages = []auditPage{
		{node: "a", events: []auditEvent{ev(9, 9)}, next: "9"},
		{node: "b", events: []auditEvent{ev(4, 8), ev(3, 1)}},
	}
	out, next = mergeAudit(pages, cur, 10)
	if len(out) != 1 || next.Nodes["a"] != "9" || next.Nodes["b"] != "" {
		t.Errorf("merged %d, next %v", len(out), next.Nodes)
	}
	if _, ok := next.Nodes["b"]; !ok {
		t.Error("b, with events left, dropped from the cursor")
	}
	// A node of the cursor that was down (no page) keeps its place, ""
	// (not started) or where it was; those all shown stay absent.
	cur = auditCursor{V: 1, Nodes: map[string]string{"a": "9.120", "b": "", "c": "5"}}
	pages = []auditPage{{node: "a", events: []auditEvent{ev(8, 5)}}}
	out, next = mergeAudit(pages, cur, 10)
	if len(out) != 1 || len(next.Nodes) != 2 || next.Nodes["b"] != "" || next.Nodes["c"] != "5" {
		t.Errorf("down nodes: merged %d, next %v, want b from the start and c from 5", len(out), next.Nodes)
	}
	if _, ok := next.Nodes["b"]; !ok {
		t.Error("b, down, dropped from the cursor")
	}
	if !onlyDown(next, pages) {
		t.Error("a cursor of down nodes only not seen as such")
	}
	if onlyDown(cur, pages) {
		t.Error("a cursor with a live node seen as down nodes only")
	}
	// Nothing asked at all: the cursor comes back as it was.
	if out, next = mergeAudit(nil, cur, 10); len(out) != 0 || next.encode() != cur.encode() {
		t.Errorf("no node up: merged %d, next %v", len(out), next.Nodes)
	}
	c, ok := decodeAuditCursor(next.encode())
	if !ok || c.Nodes["a"] != "9.120" {
		t.Errorf("cursor round trip: %v %v", c, ok)
	}
	for _, bad := range []string{"", "!!", base64.RawURLEncoding.EncodeToString([]byte(`{"v":2,"n":{"a":""}}`)),
		base64.RawURLEncoding.EncodeToString([]byte(`{"v":1,"n":{}}`))} {
		if _, ok := decodeAuditCursor(bad); ok {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}
