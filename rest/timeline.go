package rest

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/audit"
)

// The timeline of a session (GET /v1/sessions/{id}/timeline) is what the
// session did, from the audit trail: its commands (every source, with
// exit status and duration), its egress decisions, its file operations
// (SFTP and REST, with byte counts) and its lifecycle (created, stopped,
// resumed, expired, failed, deleted, and a snapshot taken), newest first.
// The REST calls, tunnels and SSH authentications that make up most of a
// session's audit events (a console polling its stats among them) are
// left out, so a page of the timeline is a page of what happened.

// Timeline kinds: the audit kinds a timeline keeps, and the kind a
// snapshot's call becomes.
const (
	timelineCommand   = audit.KindCommand
	timelineEgress    = audit.KindEgress
	timelineFile      = audit.KindFile
	timelineLifecycle = audit.KindSession
)

var timelineKinds = []string{timelineCommand, timelineEgress, timelineFile, timelineLifecycle}

// fileLookups are the file operations a timeline leaves out.
var fileLookups = []string{"list", "stat", "realpath", "readlink"}

// maxTimelineScans bounds the audit pages (of the session's events, up
// to audit.MaxQueryLimit each) one timeline call reads to fill its page,
// for a session whose events are mostly REST calls. The audit query's
// scan budget (the log's QueryScanBytes) is one for the whole call, its
// pages together: each page is given what the ones before it left, and
// the call ends when it is spent, so a session whose events are far
// apart in a busy log answers a short page and a cursor.
const maxTimelineScans = 8

// timelineEntry maps an audit event to its timeline entry, or reports
// false when the timeline leaves it out.
func timelineEntry(e audit.Event) (audit.Event, bool) {
	switch e.Kind {
	case timelineFile:
		// Lookups (a directory listed, a file's attributes read, a path
		// resolved) say nothing of what the session did to its files, and
		// every file browser makes many of them.
		return e, !slices.Contains(fileLookups, e.Op)
	case timelineCommand, timelineEgress, timelineLifecycle:
		return e, true
	case audit.KindREST:
		// A snapshot is a REST call that the manager does not record as
		// a lifecycle event: its call, when it succeeded, is one.
		if e.Method == http.MethodPost && strings.HasSuffix(e.Route, "/sessions/{id}/snapshots") && e.Status/100 == 2 {
			return audit.Event{Seq: e.Seq, Time: e.Time, Kind: timelineLifecycle, Tenant: e.Tenant, Auth: e.Auth,
				Session: e.Session, RequestID: e.RequestID, Op: "snapshot", Result: e.Result}, true
		}
	}
	return audit.Event{}, false
}

// sessionTimeline serves GET /v1/sessions/{id}/timeline?kind=&after=&cursor=&limit=.
func (a *api) sessionTimeline(w http.ResponseWriter, r *http.Request) {
	if a.cfg.AuditLog == nil {
		WriteError(w, http.StatusNotFound, "audit_unavailable", "this gateway keeps no audit log, which the timeline is read from")
		return
	}
	q := r.URL.Query()
	kinds := timelineKinds
	if q.Has("kind") {
		kinds = nil
		for _, k := range strings.Split(q.Get("kind"), ",") {
			if !slices.Contains(timelineKinds, k) {
				WriteError(w, http.StatusBadRequest, "invalid_kind", "kind is a comma-separated list of "+strings.Join(timelineKinds, ", "))
				return
			}
			kinds = append(kinds, k)
		}
	}
	var after uint64
	if q.Has("after") {
		n, err := strconv.ParseUint(q.Get("after"), 10, 64)
		if err != nil {
			WriteError(w, http.StatusBadRequest, "invalid_after", "after must be an entry's seq, a non-negative integer")
			return
		}
		after = n
	}
	limit, err := queryInt(r, "limit", audit.DefaultQueryLimit, 1, audit.MaxQueryLimit)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_limit", err.Error())
		return
	}
	p := principal(r)
	s, err := a.cfg.Sessions.Get(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	// Nothing of the session is older than its creation (a second of
	// slack for the clock's steps).
	f := audit.Filter{Tenant: p.Tenant, Session: s.ID, Since: s.CreatedAt.Add(-time.Second), After: after,
		Cursor: q.Get("cursor"), Limit: audit.MaxQueryLimit}
	entries := []audit.Event{}
	next := ""
	for scans := 0; scans < maxTimelineScans; scans++ {
		page, err := a.cfg.AuditLog.Query(f)
		if err != nil {
			if errors.Is(err, audit.ErrBadCursor) {
				WriteError(w, http.StatusBadRequest, "invalid_cursor", "cursor must be the nextCursor of an earlier page")
				return
			}
			a.cfg.Log.ErrorContext(r.Context(), "timeline_query_failed", "err", err)
			WriteError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		full := false
		for _, e := range page.Events {
			te, ok := timelineEntry(e)
			if !ok || !slices.Contains(kinds, te.Kind) {
				continue
			}
			if len(entries) == limit {
				full = true
				break
			}
			entries = append(entries, te)
		}
		if full {
			// The next page starts below the last entry taken.
			next = strconv.FormatUint(entries[len(entries)-1].Seq, 10)
			break
		}
		next = page.Next
		if next == "" || len(page.Events) < f.Limit || page.ScanLeft <= 0 {
			// The end, or the page stopped at the audit query's scan
			// budget, or spent it: one budget per call, as GET
			// /v1/audit has.
			break
		}
		f.Cursor, f.ScanBytes = next, page.ScanLeft
	}
	out := map[string]any{"entries": entries}
	if next != "" {
		out["nextCursor"] = next
	}
	w.Header().Set("Cache-Control", "no-store")
	_ = WriteJSON(w, http.StatusOK, out)
}
