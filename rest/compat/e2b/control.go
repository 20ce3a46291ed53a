package e2b

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
	"github.com/sandgate/sandgate/sandbox"
)

// E2B's control API (its OpenAPI, as the e2b package's generated client
// in e2b/api/client calls it), mapped onto the session manager:
//
//	POST   /sandboxes, /v2/sandboxes         create a session
//	GET    /sandboxes, /v2/sandboxes         list the tenant's sessions
//	GET    /sandboxes/{id}                   one session
//	DELETE /sandboxes/{id}                   delete it
//	POST   /sandboxes/{id}/timeout           its TTL, from now
//	POST   /sandboxes/{id}/refreshes         its TTL, from now, if longer
//	POST   /sandboxes/{id}/pause             pause it in place (memory kept; else stop it, files kept)
//	POST   /sandboxes/{id}/resume            start it again
//	POST   /sandboxes/{id}/connect, /v2/...  start it again if stopped
//	PUT    /sandboxes/{id}/network           its egress allow-list
//	GET    /sandboxes/{id}/metrics           its resource use now
//
// Everything else E2B's API has (templates, snapshots, forks, volumes,
// secrets, metrics, logs, network updates) is refused with 501
// (refused below), as docs/compat.md lists.

// E2B's defaults.
const (
	// defaultTimeout is a create's timeout when it gives none (E2B's
	// v2 default, the SDKs' too).
	defaultTimeout = 300
	// defaultListLimit and maxListLimit bound a list page.
	defaultListLimit = 100
	maxListLimit     = 100
	// clientID is what sandboxes say their client is.
	clientID = "sandgate"
)

// envNameRE is what an environment variable's name may be.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// controlRouter routes E2B's control API.
func (a *api) controlRouter() http.Handler {
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "unknown_endpoint", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method "+r.Method+" not allowed here")
	})
	r.Get("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Post("/sandboxes", a.create)
	r.Post("/v2/sandboxes", a.create)
	r.Get("/sandboxes", a.listV1)
	r.Get("/v2/sandboxes", a.listV2)
	r.Get("/sandboxes/{id}", a.get)
	r.Delete("/sandboxes/{id}", a.kill)
	r.Post("/sandboxes/{id}/timeout", a.setTimeout)
	r.Post("/sandboxes/{id}/refreshes", a.refresh)
	r.Post("/sandboxes/{id}/pause", a.pause)
	r.Post("/sandboxes/{id}/resume", a.resume)
	r.Post("/sandboxes/{id}/connect", a.connect)
	r.Post("/v2/sandboxes/{id}/connect", a.connect)
	r.Put("/sandboxes/{id}/network", a.updateNetwork)
	r.Get("/sandboxes/{id}/metrics", a.metrics)
	for _, p := range refusedPaths {
		r.HandleFunc(p.path, refused(p.what))
	}
	return r
}

// refusedPaths are E2B's calls sandgate has no mapping for.
var refusedPaths = []struct{ path, what string }{
	{"/sandboxes/{id}/fork", "forking a sandbox"},
	{"/sandboxes/{id}/snapshots", "snapshots of a sandbox (use sandgate's /v1 snapshots)"},
	{"/snapshots", "snapshots (use sandgate's /v1 snapshots)"},
	{"/sandboxes/metrics", "the metrics of many sandboxes at once (GET /sandboxes/{id}/metrics has one's)"},
	{"/sandboxes/{id}/logs", "sandbox logs (use sandgate's /v1/sessions/{id}/logs)"},
	{"/v2/sandboxes/{id}/logs", "sandbox logs (use sandgate's /v1/sessions/{id}/logs)"},
	{"/templates", "templates (sandgate runs images: sandgate image, --image-alias)"},
	{"/templates/*", "templates (sandgate runs images: sandgate image, --image-alias)"},
	{"/v2/templates", "templates (sandgate runs images: sandgate image, --image-alias)"},
	{"/v2/templates/*", "templates (sandgate runs images: sandgate image, --image-alias)"},
	{"/v3/templates", "templates (sandgate runs images: sandgate image, --image-alias)"},
	{"/secrets", "E2B secrets (sandgate binds the operator's secrets: --secrets-file)"},
	{"/secrets/*", "E2B secrets (sandgate binds the operator's secrets: --secrets-file)"},
	{"/volumes", "volumes (use sandgate's named workspaces)"},
	{"/volumes/*", "volumes (use sandgate's named workspaces)"},
}

// refused answers a call sandgate does not map: 501.
func refused(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, "unsupported",
			"sandgate's E2B API does not support "+what+" (docs/compat.md)")
	}
}

// newSandbox is a create's body (NewSandbox, NewSandboxV2).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResume       `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allowInternetAccess"`
	Network             *networkConfig    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 any               `json:"mcp"`
	IAM                 *struct {
		Tokens map[string]any `json:"tokens"`
	} `json:"iam"`
	VolumeMounts []any `json:"volumeMounts"`
}

type autoResume struct {
	Enabled bool `json:"enabled"`
}

// networkConfig is SandboxNetworkConfig.
type networkConfig struct {
	AllowPublicTraffic *bool          `json:"allowPublicTraffic"`
	AllowOut           []string       `json:"allowOut"`
	DenyOut            []string       `json:"denyOut"`
	DNSServers         []string       `json:"dnsServers"`
	EgressProxy        any            `json:"egressProxy"`
	MaskRequestHost    string         `json:"maskRequestHost"`
	HTTPSPorts         []int          `json:"httpsPorts"`
	Rules              map[string]any `json:"rules"`
}

// sandboxAnswer is Sandbox: a create's and a connect's answer.
type sandboxAnswer struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	Alias              string  `json:"alias,omitempty"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is ListedSandbox; sandboxDetail adds SandboxDetail's fields.
type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
}

type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string         `json:"envdAccessToken"`
	Domain              *string        `json:"domain"`
	AllowInternetAccess *bool          `json:"allowInternetAccess"`
	Network             map[string]any `json:"network"`
	Lifecycle           lifecycle      `json:"lifecycle"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// create serves POST /sandboxes and /v2/sandboxes.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	var req newSandbox
	if !decodeBody(w, r, &req) {
		return
	}
	cp, rec, ok := a.createParams(w, req)
	if !ok {
		return
	}
	cp.IdempotencyKey = r.Header.Get("Idempotency-Key")
	md, err := a.sealer.Metadata(rec, req.Metadata)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_metadata", err.Error())
		return
	}
	cp.Metadata = md
	timeout := defaultTimeout
	if req.Timeout != nil {
		timeout = min(*req.Timeout, gateway.MaxTTL)
	}
	if rec.AutoPause {
		cp.TTL = gateway.MaxTTL // it pauses at its timeout, and ends at the longest TTL
	}
	p := principal(r)
	s, _, err := a.d.Sessions.Create(r.Context(), p, cp)
	if err != nil {
		writeGatewayError(w, err)
		return
	}
	if rec.AutoPause {
		a.schedulePause(s, time.Duration(timeout)*time.Second)
	}
	a.d.Log.InfoContext(r.Context(), "e2b_sandbox_created", "session", s.ID, "tenant", p.Tenant, "template", rec.TemplateID)
	_ = writeJSON(w, http.StatusCreated, a.sandboxAnswer(s))
}

// createParams maps a create's body onto a session's, or answers 400.
func (a *api) createParams(w http.ResponseWriter, req newSandbox) (gateway.CreateParams, e2bmeta.Record, bool) {
	var cp gateway.CreateParams
	bad := func(code, msg string) (gateway.CreateParams, e2bmeta.Record, bool) {
		writeError(w, http.StatusBadRequest, code, msg)
		return cp, e2bmeta.Record{}, false
	}
	if req.TemplateID == "" {
		return bad("invalid_template", "templateID is required")
	}
	if a.aliases[req.TemplateID] {
		cp.Image = req.TemplateID // the operator's --image-alias names it
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		return bad("invalid_timeout", fmt.Sprintf("timeout must be a positive number of seconds, got %d", timeout))
	}
	cp.TTL = clampTTL(timeout)
	if req.MCP != nil {
		return bad("unsupported", "mcp is not supported by sandgate's E2B API")
	}
	if len(req.VolumeMounts) > 0 {
		return bad("unsupported", "volumeMounts are not supported by sandgate's E2B API (use named workspaces)")
	}
	if req.IAM != nil && len(req.IAM.Tokens) > 0 {
		return bad("unsupported", "iam workload identity is not supported by sandgate's E2B API")
	}
	if _, ok := req.Metadata[e2bmeta.Key]; ok {
		return bad("invalid_metadata", fmt.Sprintf("the metadata key %q is sandgate's own", e2bmeta.Key))
	}
	for k := range req.EnvVars {
		if !envNameRE.MatchString(k) {
			return bad("invalid_env", fmt.Sprintf("envVars: %q is not a valid environment variable name", k))
		}
	}
	egress, msg := egressOf(req)
	if msg != "" {
		return bad("invalid_network", msg)
	}
	cp.Egress = egress
	rec := e2bmeta.Record{TemplateID: req.TemplateID, EnvVars: req.EnvVars, TokenNonce: newTokenNonce()}
	if req.Secure != nil {
		rec.Secure = *req.Secure
	}
	if req.AutoPause != nil {
		rec.AutoPause = *req.AutoPause
	}
	rec.Timeout = min(timeout, gateway.MaxTTL)
	return cp, rec, true
}

// networkUpdate is SandboxNetworkUpdateConfig: it replaces the whole
// egress configuration (what it omits is cleared).
type networkUpdate struct {
	AllowOut            []string       `json:"allowOut"`
	DenyOut             []string       `json:"denyOut"`
	DNSServers          []string       `json:"dnsServers"`
	EgressProxy         any            `json:"egressProxy"`
	Rules               map[string]any `json:"rules"`
	AllowInternetAccess *bool          `json:"allowInternetAccess"`
}

// updateNetwork serves PUT /sandboxes/{id}/network: the session's egress
// allow-list becomes allowOut (empty with allowInternetAccess false), as
// PATCH /v1/sessions/{id} egress does: new connections follow it at once.
func (a *api) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var body networkUpdate
	if !decodeBody(w, r, &body) {
		return
	}
	allow, msg := egressOf(newSandbox{AllowInternetAccess: body.AllowInternetAccess,
		Network: &networkConfig{AllowOut: body.AllowOut, DenyOut: body.DenyOut, EgressProxy: body.EgressProxy, Rules: body.Rules}})
	if msg != "" {
		writeError(w, http.StatusBadRequest, "invalid_network", msg)
		return
	}
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if allow == nil {
		allow = []string{}
	}
	if _, err := a.d.Sessions.Update(r.Context(), principal(r), s.ID, gateway.UpdateParams{Egress: &allow}); err != nil {
		writeGatewayError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sandboxMetric is SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// cpuSampleGap is how far apart the two samples of a metric's CPU use are.
const cpuSampleGap = 200 * time.Millisecond

// metrics serves GET /sandboxes/{id}/metrics: one sample of the sandbox's
// use now (E2B keeps a series; start and end are accepted), from the
// driver's stats as /v1/sessions/{id}/stats reads them; what the driver
// cannot tell is 0.
func (a *api) metrics(w http.ResponseWriter, r *http.Request) {
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	l := a.listed(s)
	now := time.Now().UTC()
	m := sandboxMetric{Timestamp: now, TimestampUnix: now.Unix(), CPUCount: l.CPUCount,
		MemTotal: l.MemoryMB << 20, DiskTotal: l.DiskSizeMB << 20}
	st, ok := sandbox.As[sandbox.Statser](s.Sandbox())
	if !ok || s.Status() != gateway.StatusRunning {
		_ = writeJSON(w, http.StatusOK, []sandboxMetric{m})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	first, err := st.Stats(ctx)
	if err == nil {
		timer := time.NewTimer(cpuSampleGap)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
		var second sandbox.Stats
		if second, err = st.Stats(ctx); err == nil {
			if first.CPUSeconds != nil && second.CPUSeconds != nil {
				m.CPUUsedPct = 100 * (*second.CPUSeconds - *first.CPUSeconds) / cpuSampleGap.Seconds() / float64(max(m.CPUCount, 1))
				m.CPUUsedPct = max(0, min(m.CPUUsedPct, 100))
			}
			if v := second.MemoryBytes; v != nil {
				m.MemUsed = *v
			}
			if v := second.DiskUsedBytes; v != nil {
				m.DiskUsed = *v
			}
			if v := second.DiskTotalBytes; v != nil {
				m.DiskTotal = *v
			}
		}
	}
	if err != nil && r.Context().Err() == nil {
		a.d.Log.Warn("e2b_metrics_failed", "session", s.ID, "err", err)
		writeError(w, http.StatusServiceUnavailable, "stats_unavailable", "the sandbox's use could not be read now; retry")
		return
	}
	_ = writeJSON(w, http.StatusOK, []sandboxMetric{m})
}

// egressOf is the egress allow-list of a create: network.allowOut (the
// operator's --egress-allow bounds it, and the create then fails with
// its code). sandgate's sandboxes reach nothing they are not allowed to,
// so denyOut, which only narrows what allowOut does not name, holds
// already; allowInternetAccess false empties the list. E2B's other
// network options have no mapping: a create that sets one is refused
// (msg).
func egressOf(req newSandbox) (allow []string, msg string) {
	n := req.Network
	if n == nil {
		return nil, ""
	}
	if n.EgressProxy != nil {
		return nil, "network.egressProxy is not supported by sandgate's E2B API"
	}
	if len(n.Rules) > 0 {
		return nil, "network.rules are not supported by sandgate's E2B API (bind the operator's secrets instead)"
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		return nil, ""
	}
	for _, e := range n.AllowOut {
		e = strings.TrimSuffix(e, "/32")
		if !slices.Contains(allow, e) {
			allow = append(allow, e)
		}
	}
	return allow, ""
}

// clampTTL is E2B timeout t (seconds) as a TTL sandgate accepts.
func clampTTL(t int) int {
	return min(max(t, gateway.MinTTL), gateway.MaxTTL)
}

// sandboxAnswer is s as a create or connect answers it.
func (a *api) sandboxAnswer(s *gateway.Session) sandboxAnswer {
	tmpl := templateOf(s)
	return sandboxAnswer{TemplateID: tmpl, SandboxID: s.ID, ClientID: clientID, EnvdVersion: EnvdVersion, Alias: tmpl,
		EnvdAccessToken: a.sessionToken(s), TrafficAccessToken: a.sessionToken(s)}
}

// templateOf is the template s was created from: its E2B record's, or
// its image for a session created otherwise.
func templateOf(s *gateway.Session) string {
	if rec, ok := e2bmeta.Of(s); ok {
		return rec.TemplateID
	}
	if s.Image == "" {
		return "default"
	}
	return s.Image
}

// stateOf is E2B's state of a live session.
func stateOf(status string) string {
	if isPaused(status) {
		return "paused"
	}
	return "running"
}

// isPaused says a session of status is a paused sandbox to E2B: paused in
// place (memory kept), or stopped (files kept) where the driver cannot
// pause.
func isPaused(status string) bool {
	return status == gateway.StatusPaused || status == gateway.StatusStopped
}

// park pauses session id for E2B: in place, with its processes and
// memory (gateway.Manager.Pause), where the manager and driver can; else
// it stops it, keeping its files, and its kernels' contexts are
// forgotten (they died with its processes).
func (a *api) park(ctx context.Context, p gateway.Principal, id string) error {
	if pa, ok := a.d.Sessions.(rest.SessionPauser); ok {
		_, err := pa.Pause(ctx, p, id)
		ge, isGE := errors.AsType[*gateway.Error](err)
		if err == nil || !isGE || ge.Code != "pause_unsupported" {
			return err
		}
	}
	if _, err := a.d.Sessions.Stop(ctx, p, id); err != nil {
		return err
	}
	a.contexts.forget(id)
	return nil
}

// listed is s as a list shows it: it ends (endAt) when it pauses, for an
// autoPause sandbox with a pause pending, else at its expiry.
func (a *api) listed(s *gateway.Session) listedSandbox {
	rec := s.Snapshot()
	end := rec.ExpiresAt
	if at, ok := a.pauseAt(s.ID); ok {
		end = at
	}
	l := listedSandbox{TemplateID: templateOf(s), Alias: templateOf(s), SandboxID: s.ID, ClientID: clientID,
		StartedAt: s.CreatedAt.UTC(), EndAt: end.UTC(), State: stateOf(rec.Status), EnvdVersion: EnvdVersion,
		Metadata: e2bmeta.UserMetadata(s.Metadata), CPUCount: 1}
	if res := s.Resources; res != nil {
		l.CPUCount = max(1, int(math.Ceil(res.CPUs)))
		l.MemoryMB, l.DiskSizeMB = res.MemoryMiB, res.DiskMiB
	}
	return l
}

// session is the tenant's live session of the request's {id}, or false
// after answering 404.
func (a *api) session(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	id := chi.URLParam(r, "id")
	s, err := a.d.Sessions.Get(r.Context(), principal(r), id)
	if err == nil && !s.Live() {
		err = gateway.ErrNotFound
	}
	if err != nil {
		if ge, ok := errors.AsType[*gateway.Error](err); ok && (ge.Kind == gateway.KindNotFound || ge.Kind == gateway.KindGone) {
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("sandbox %q not found", id))
			return nil, false
		}
		writeGatewayError(w, err)
		return nil, false
	}
	return s, true
}

// get serves GET /sandboxes/{id}.
func (a *api) get(w http.ResponseWriter, r *http.Request) {
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	d := sandboxDetail{listedSandbox: a.listed(s), EnvdAccessToken: a.sessionToken(s),
		Lifecycle: lifecycle{OnTimeout: "kill"}}
	if rec, ok := e2bmeta.Of(s); ok && rec.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	allow := s.EgressAllow()
	internet := len(allow) > 0
	d.AllowInternetAccess = &internet
	d.Network = map[string]any{"allowOut": allow}
	_ = writeJSON(w, http.StatusOK, d)
}

// listV1 serves GET /sandboxes: the running sandboxes, narrowed by
// metadata.
func (a *api) listV1(w http.ResponseWriter, r *http.Request) {
	match, ok := metadataFilter(w, r.URL.Query().Get("metadata"))
	if !ok {
		return
	}
	out := []listedSandbox{}
	for _, s := range a.all(r) {
		if l := a.listed(s); l.State == "running" && match(l.Metadata) {
			out = append(out, l)
		}
	}
	_ = writeJSON(w, http.StatusOK, out)
}

// listV2 serves GET /v2/sandboxes: metadata, state, template and
// startedAfter filters, order by start, and pages of limit with the next
// page's token in X-Next-Token.
func (a *api) listV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	match, ok := metadataFilter(w, q.Get("metadata"))
	if !ok {
		return
	}
	states := map[string]bool{"running": true, "paused": true}
	if v := q.Get("state"); v != "" {
		states = map[string]bool{}
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				writeError(w, http.StatusBadRequest, "invalid_state", fmt.Sprintf("state %q is not running or paused", st))
				return
			}
			states[st] = true
		}
	}
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, "invalid_limit", fmt.Sprintf("limit must be 1 to %d", maxListLimit))
			return
		}
		limit = n
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_started_after", "startedAfter is not an RFC 3339 time")
			return
		}
		after = t
	}
	desc := q.Get("order") == "desc"
	if o := q.Get("order"); o != "" && o != "asc" && o != "desc" {
		writeError(w, http.StatusBadRequest, "invalid_order", "order is asc or desc")
		return
	}
	cursor, ok := parseCursor(q.Get("nextToken"))
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_next_token", "nextToken is not one this API handed out")
		return
	}
	tmpl := q.Get("template")
	var rows []listedSandbox
	for _, s := range a.all(r) {
		l := a.listed(s)
		if states[l.State] && match(l.Metadata) && (tmpl == "" || l.TemplateID == tmpl) && l.StartedAt.After(after) {
			rows = append(rows, l)
		}
	}
	if desc {
		slices.Reverse(rows) // all is oldest first
	}
	start := 0
	if cursor.id != "" {
		// The first row after the cursor's, in the list's order: a page
		// holds even when the cursor's sandbox is gone since.
		start = len(rows)
		for i, l := range rows {
			if c := cursor.compare(l); !desc && c < 0 || desc && c > 0 {
				start = i
				break
			}
		}
	}
	page := rows[start:min(start+limit, len(rows))]
	if start+limit < len(rows) {
		w.Header().Set("X-Next-Token", cursorOf(page[len(page)-1]))
	}
	if page == nil {
		page = []listedSandbox{}
	}
	_ = writeJSON(w, http.StatusOK, page)
}

// cursor is where a page ends: its last sandbox's start and id.
type cursor struct {
	started int64 // unix nanoseconds
	id      string
}

// compare is -1, 0 or 1 as the cursor's sandbox comes before l, is l, or
// comes after it, oldest first (by start, then id, as the session
// manager lists them).
func (c cursor) compare(l listedSandbox) int {
	if n := l.StartedAt.UnixNano(); n != c.started {
		return cmp.Compare(c.started, n)
	}
	return cmp.Compare(c.id, l.SandboxID)
}

// cursorOf is the nextToken of a page that ends with l.
func cursorOf(l listedSandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(l.StartedAt.UnixNano(), 10) + ":" + l.SandboxID))
}

// parseCursor is the cursor a nextToken names (zero for none).
func parseCursor(tok string) (cursor, bool) {
	if tok == "" {
		return cursor{}, true
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	if err != nil {
		return cursor{}, false
	}
	ns, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !sandbox.ValidID(id) {
		return cursor{}, false
	}
	return cursor{started: n, id: id}, true
}

// all is the tenant's live sessions, oldest first.
func (a *api) all(r *http.Request) []*gateway.Session {
	p := principal(r)
	_, total := a.d.Sessions.List(r.Context(), p, 1, 0)
	ss, _ := a.d.Sessions.List(r.Context(), p, max(total, 1), 0)
	return slices.DeleteFunc(ss, func(s *gateway.Session) bool { return !s.Live() })
}

// metadataFilter reads E2B's metadata query (key=value pairs, URL-encoded
// as a query string, each key and value encoded once more): a sandbox
// matches when its metadata has every pair.
func metadataFilter(w http.ResponseWriter, raw string) (func(map[string]string) bool, bool) {
	if raw == "" {
		return func(map[string]string) bool { return true }, true
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_metadata", "metadata is not key=value pairs: "+err.Error())
		return nil, false
	}
	want := map[string]string{}
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			writeError(w, http.StatusBadRequest, "invalid_metadata", "metadata is not key=value pairs")
			return nil, false
		}
		want[key] = val
	}
	return func(md map[string]string) bool {
		for k, v := range want {
			if got, ok := md[k]; !ok || got != v {
				return false
			}
		}
		return true
	}, true
}

// kill serves DELETE /sandboxes/{id}.
func (a *api) kill(w http.ResponseWriter, r *http.Request) {
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if err := a.d.Sessions.Delete(r.Context(), principal(r), s.ID); err != nil {
		writeGatewayError(w, err)
		return
	}
	a.contexts.forget(s.ID)
	a.cancelPause(s.ID, nil)
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is SandboxTimeoutRequest, SandboxRefreshRequest's duration
// and a connect's and resume's timeout.
type timeoutBody struct {
	Timeout  *int  `json:"timeout"`
	Duration *int  `json:"duration"`
	Memory   *bool `json:"memory"`
}

// setTimeout serves POST /sandboxes/{id}/timeout: the sandbox ends
// timeout seconds from now (clamped to sandgate's TTL bounds).
func (a *api) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Timeout == nil || *body.Timeout <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_timeout", "timeout must be a positive number of seconds")
		return
	}
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if !a.setTTL(w, r, s, *body.Timeout) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// setTTL makes s time out t seconds from now, or answers the error: it
// ends then, or, created with autoPause, it pauses then (autopause.go)
// and ends at the longest TTL from now.
func (a *api) setTTL(w http.ResponseWriter, r *http.Request, s *gateway.Session, t int) bool {
	ttl := clampTTL(t)
	rec, _ := e2bmeta.Of(s)
	if rec.AutoPause {
		ttl = gateway.MaxTTL
	}
	if _, err := a.d.Sessions.Update(r.Context(), principal(r), s.ID, gateway.UpdateParams{TTL: &ttl}); err != nil {
		writeGatewayError(w, err)
		return false
	}
	if rec.AutoPause {
		a.schedulePause(s, time.Duration(min(max(t, 1), gateway.MaxTTL))*time.Second)
	}
	return true
}

// refresh serves POST /sandboxes/{id}/refreshes: the sandbox lives at
// least duration seconds more (default 60, E2B's).
func (a *api) refresh(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return
	}
	d := 60
	if body.Duration != nil {
		d = *body.Duration
	}
	if d < 0 || d > 3600 {
		writeError(w, http.StatusBadRequest, "invalid_duration", "duration must be 0 to 3600 seconds")
		return
	}
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if time.Until(a.listed(s).EndAt) < time.Duration(d)*time.Second && !a.setTTL(w, r, s, d) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause serves POST /sandboxes/{id}/pause: the session pauses in place,
// processes and memory kept (park; a driver that cannot pause stops it,
// keeping its files only); 409 when it is paused already.
func (a *api) pause(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return
	}
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if isPaused(s.Status()) {
		writeError(w, http.StatusConflict, "already_paused", fmt.Sprintf("sandbox %q is already paused", s.ID))
		return
	}
	if err := a.park(r.Context(), principal(r), s.ID); err != nil {
		writeGatewayError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resume serves POST /sandboxes/{id}/resume: a paused sandbox starts
// again (201); a running one is a 409, as E2B answers.
func (a *api) resume(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return
	}
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if !isPaused(s.Status()) {
		writeError(w, http.StatusConflict, "already_running", fmt.Sprintf("sandbox %q is already running", s.ID))
		return
	}
	a.startAgain(w, r, s, body)
}

// connect serves POST /sandboxes/{id}/connect and its v2: a running
// sandbox answers 200, a paused one starts again and answers 201; both
// get the timeout.
func (a *api) connect(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return
	}
	s, ok := a.session(w, r)
	if !ok {
		return
	}
	if !isPaused(s.Status()) {
		if body.Timeout != nil && *body.Timeout > 0 && !a.setTTL(w, r, s, *body.Timeout) {
			return
		}
		_ = writeJSON(w, http.StatusOK, a.sandboxAnswer(s))
		return
	}
	a.startAgain(w, r, s, body)
}

// startAgain resumes stopped session s (its sandbox starts again with
// the same files: a process started in it resumes it), sets its timeout,
// and answers 201 with it.
func (a *api) startAgain(w http.ResponseWriter, r *http.Request, s *gateway.Session, body timeoutBody) {
	t := defaultTimeout
	if body.Timeout != nil && *body.Timeout > 0 {
		t = *body.Timeout
	}
	if !a.setTTL(w, r, s, t) {
		return
	}
	if err := wake(r.Context(), s); err != nil {
		writeGatewayError(w, err)
		return
	}
	_ = writeJSON(w, http.StatusCreated, a.sandboxAnswer(s))
}

// wake starts stopped session s again: a process started in it (which
// ends at once) resumes it, as any first process does.
func wake(ctx context.Context, s *gateway.Session) error {
	p, err := s.Start(ctx, sandbox.Cmd{Command: "true"}, gateway.StartOptions{Resume: true})
	if err != nil {
		return err
	}
	_ = p.Stdin().Close()
	_, _ = io.Copy(io.Discard, p.Stdout())
	if e := p.Stderr(); e != nil {
		_, _ = io.Copy(io.Discard, e)
		_ = e.Close()
	}
	_ = p.Stdout().Close()
	_, err = p.Wait()
	return err
}
