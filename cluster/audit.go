package cluster

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// GET /v1/audit in a cluster. Each node keeps the audit log of what it
// served itself; the front asks every live node for the caller's events
// (a relay: the caller's own token, which each node verifies, and the
// cluster token) and merges their pages newest first. Its cursor holds
// each node's place: base64url of {"v":1,"n":{node: that node's cursor}},
// a node absent once its events are all shown. A node that is down when a
// later page is asked is left out of that page, its place carried forward
// unchanged, so its events come on a later page once it is back (maybe
// out of time order with those shown meanwhile). A page that would show
// nothing and only hold the places of down nodes is refused (node_down):
// a client paging until nextCursor is empty would otherwise loop on it.

// Audit query bounds (the API's own: audit.DefaultQueryLimit and
// audit.MaxQueryLimit).
const (
	auditDefaultLimit = 100
	auditMaxLimit     = 1000
	maxAuditCursor    = 16 << 10
	maxAuditPage      = 64 << 20 // one node's answer
)

var errAuditNodesDown = &gateway.Error{Kind: gateway.KindUnavailable, Code: "node_unavailable", RetryAfter: 5 * time.Second,
	Message: "the nodes whose audit events are left cannot be reached now; retry later with the same cursor"}

var errAuditCursor = &gateway.Error{Kind: gateway.KindInvalid, Code: "invalid_cursor",
	Message: "cursor must be the nextCursor of an earlier page"}

type auditCursor struct {
	V     int               `json:"v"`
	Nodes map[string]string `json:"n"`
}

func decodeAuditCursor(s string) (auditCursor, bool) {
	var c auditCursor
	if len(s) > maxAuditCursor {
		return c, false
	}
	data, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(data, &c) != nil || c.V != 1 || len(c.Nodes) == 0 || len(c.Nodes) > 256 {
		return c, false
	}
	for id, cur := range c.Nodes {
		if id == "" || len(id) > 128 || len(cur) > 64 {
			return c, false
		}
	}
	return c, true
}

func (c auditCursor) encode() string {
	data, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(data)
}

// auditEvent is one event of a node's page: as the node wrote it, and
// what orders it.
type auditEvent struct {
	raw  json.RawMessage
	seq  uint64
	time time.Time
}

// auditPage is one node's answer.
type auditPage struct {
	node   string
	events []auditEvent
	next   string
	// status and body: a refusal, passed on as it came.
	status int
	body   []byte
	header http.Header
}

// audit serves GET /v1/audit across the cluster.
func (f *Front) audit(w http.ResponseWriter, r *http.Request) {
	if _, ok := f.principal(r, ""); !ok {
		f.cfg.Local.ServeHTTP(w, r) // 401, counted
		return
	}
	q := r.URL.Query()
	limit := auditDefaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > auditMaxLimit {
			f.cfg.Local.ServeHTTP(w, r) // invalid_limit
			return
		}
		limit = n
	}
	var cur auditCursor
	if v := q.Get("cursor"); v != "" {
		c, ok := decodeAuditCursor(v)
		if !ok {
			f.cfg.WriteError(w, errAuditCursor)
			return
		}
		cur = c
	} else {
		cur = auditCursor{V: 1, Nodes: map[string]string{}}
		f.cfg.Node.refresh()
		for _, i := range f.cfg.Node.peers() {
			cur.Nodes[i.ID] = ""
		}
		cur.Nodes[f.cfg.Node.ID()] = ""
	}
	pages, err := f.auditPages(r, cur, limit)
	if err != nil {
		f.cfg.Log.Warn("cluster_audit_failed", "err", err)
		f.cfg.WriteError(w, errAuditNodesDown)
		return
	}
	for _, p := range pages {
		if p.status != http.StatusOK { // the caller's mistake, or a node's refusal
			for k, v := range p.header {
				w.Header()[k] = v
			}
			w.WriteHeader(p.status)
			_, _ = w.Write(p.body)
			return
		}
	}
	events, next := mergeAudit(pages, cur, limit)
	if len(events) == 0 && len(next.Nodes) > 0 && onlyDown(next, pages) {
		f.cfg.Log.Warn("cluster_audit_nodes_down", "nodes", len(next.Nodes))
		f.cfg.WriteError(w, errAuditNodesDown)
		return
	}
	out := struct {
		Events     []json.RawMessage `json:"events"`
		NextCursor string            `json:"nextCursor,omitempty"`
	}{Events: events}
	if len(next.Nodes) > 0 {
		out.NextCursor = next.encode()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}

// auditPages asks each live node of cur for its next page, at once.
func (f *Front) auditPages(r *http.Request, cur auditCursor, limit int) ([]auditPage, error) {
	var targets []Info
	for id := range cur.Nodes {
		if i, live := f.cfg.Node.peer(id); live {
			targets = append(targets, i)
		} else if id == f.cfg.Node.ID() {
			targets = append(targets, f.cfg.Node.info())
		}
	}
	slices.SortFunc(targets, func(a, b Info) int { return cmp.Compare(a.ID, b.ID) })
	pages := make([]auditPage, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for k, t := range targets {
		wg.Go(func() { pages[k], errs[k] = f.auditPage(r, t, cur.Nodes[t.ID], limit) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return pages, nil
}

// auditPage asks node t for the caller's events older than its cursor.
func (f *Front) auditPage(r *http.Request, t Info, cursor string, limit int) (auditPage, error) {
	u, err := url.Parse(t.URL)
	if err != nil || u.Host == "" {
		return auditPage{}, fmt.Errorf("node %s: bad url %q", t.ID, t.URL)
	}
	q := url.Values{}
	for _, k := range []string{"session", "since"} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	q.Set("limit", strconv.Itoa(limit))
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	u.Path, u.RawQuery = "/v1/audit", q.Encode()
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return auditPage{}, err
	}
	for _, h := range []string{"Authorization", "X-Request-Id"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set(TokenHeader, f.cfg.Node.cfg.Token)
	resp, err := f.transport.RoundTrip(req)
	if err != nil {
		return auditPage{}, fmt.Errorf("node %s: %w", t.ID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAuditPage+1))
	if err != nil || len(body) > maxAuditPage {
		return auditPage{}, fmt.Errorf("node %s: reading its audit page: %v", t.ID, err)
	}
	p := auditPage{node: t.ID, status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		p.body, p.header = body, resp.Header
		return p, nil
	}
	var page struct {
		Events     []json.RawMessage `json:"events"`
		NextCursor string            `json:"nextCursor"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return auditPage{}, fmt.Errorf("node %s: its audit page: %w", t.ID, err)
	}
	p.next = page.NextCursor
	for _, raw := range page.Events {
		var e struct {
			Seq  uint64    `json:"seq"`
			Time time.Time `json:"time"`
		}
		if err := json.Unmarshal(raw, &e); err != nil || e.Seq == 0 {
			return auditPage{}, fmt.Errorf("node %s: an event without seq", t.ID)
		}
		p.events = append(p.events, auditEvent{raw: raw, seq: e.Seq, time: e.Time})
	}
	return p, nil
}

// mergeAudit takes up to limit events of pages, newest first, and the
// cursor of what is left. It stops early where a node's page ran out
// while the node has more (its next events are not known yet). A node's
// cursor is the seq of its last event shown ("the events older than it",
// a bare seq: its offset is not in the event) or its own next cursor
// (SEQ.OFFSET, found at once) once its page is all shown. A node of cur
// with no page (down) keeps its place.
func mergeAudit(pages []auditPage, cur auditCursor, limit int) ([]json.RawMessage, auditCursor) {
	idx := make([]int, len(pages))
	out := []json.RawMessage{}
	for len(out) < limit {
		best := -1
		for k, p := range pages {
			if idx[k] == len(p.events) {
				if p.next != "" {
					best = -2 // its next events may be newer than any left
					break
				}
				continue
			}
			if best < 0 || newer(p.events[idx[k]], p.node, pages[best].events[idx[best]], pages[best].node) {
				best = k
			}
		}
		if best < 0 {
			break
		}
		out = append(out, pages[best].events[idx[best]].raw)
		idx[best]++
	}
	next := auditCursor{V: 1, Nodes: map[string]string{}}
	for k, p := range pages {
		switch {
		case idx[k] < len(p.events) && idx[k] > 0:
			next.Nodes[p.node] = strconv.FormatUint(p.events[idx[k]-1].seq, 10)
		case idx[k] < len(p.events):
			next.Nodes[p.node] = cur.Nodes[p.node]
		case p.next != "":
			next.Nodes[p.node] = p.next
		}
	}
	// Nodes not asked (down): their places go on unchanged.
	for id, c := range cur.Nodes {
		if !slices.ContainsFunc(pages, func(p auditPage) bool { return p.node == id }) {
			next.Nodes[id] = c
		}
	}
	return out, next
}

// onlyDown reports whether every node of c went unasked (was down).
func onlyDown(c auditCursor, pages []auditPage) bool {
	for _, p := range pages {
		if _, ok := c.Nodes[p.node]; ok {
			return false
		}
	}
	return true
}

// newer orders events of two nodes: by time, then node, then seq.
func newer(a auditEvent, an string, b auditEvent, bn string) bool {
	if !a.time.Equal(b.time) {
		return a.time.After(b.time)
	}
	if an != bn {
		return an < bn
	}
	return a.seq > b.seq
}
