package rest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox"
)

const specPath = "../api-spec/sandbox-api-spec.yaml"

// The validator decodes JSON itself; the spec's other content types are
// checked as opaque text (their shape is tested where they are served).
func init() {
	text := func(body io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(body)
		return string(b), err
	}
	for _, ct := range []string{"text/html", "application/yaml"} {
		openapi3filter.RegisterBodyDecoder(ct, text)
	}
}

// coverage records which (operation, status) pairs the tests saw.
type coverage struct {
	mu   sync.Mutex
	seen map[string]bool
}

func newCoverage() *coverage { return &coverage{seen: map[string]bool{}} }

func (c *coverage) add(op string, status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[op+" "+strconv.Itoa(status)] = true
}

func (c *coverage) has(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[key]
}

// specChecker validates requests and responses against the OpenAPI spec.
type specChecker struct {
	doc      *openapi3.T
	router   routers.Router
	fallback *routers.Route            // paths or methods the spec does not list
	connect  map[string]*routers.Route // x-connect, by path template
	opts     *openapi3filter.Options
	cov      *coverage
}

func loadSpec(t testing.TB) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(specPath)
	if err != nil {
		t.Fatalf("load %s: %v", specPath, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s does not validate: %v", specPath, err)
	}
	return doc
}

func newSpecChecker(t testing.TB, baseURL string, cov *coverage) *specChecker {
	t.Helper()
	doc := loadSpec(t)
	doc.Servers = openapi3.Servers{{URL: baseURL}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	if cov == nil {
		cov = newCoverage()
	}
	s := &specChecker{
		doc: doc, router: router, cov: cov, connect: map[string]*routers.Route{},
		opts: &openapi3filter.Options{
			IncludeResponseStatus:   true,
			AuthenticationFunc:      openapi3filter.NoopAuthenticationFunc,
			SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.EnableFormatValidation()},
		},
	}
	s.fallback = s.syntheticRoute(t, "(unlisted)", map[int]string{
		401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed",
		429: "TooManyRequests", 500: "InternalError",
	})
	for path, item := range doc.Paths.Map() {
		raw, ok := item.Extensions["x-connect"]
		if !ok {
			continue
		}
		xc, ok := raw.(map[string]any)
		if !ok {
			t.Fatalf("%s: x-connect is %T, want an object", path, raw)
		}
		resps, _ := xc["responses"].(map[string]any)
		byStatus := map[int]string{}
		for code, v := range resps {
			status, err := strconv.Atoi(code)
			if err != nil {
				t.Fatalf("%s: x-connect response %q is not a status", path, code)
			}
			if status == http.StatusOK {
				continue
			}
			m, _ := v.(map[string]any)
			name, _ := m["response"].(string)
			if name == "" {
				t.Fatalf("%s: x-connect response %d names no components/responses entry", path, status)
			}
			byStatus[status] = name
		}
		r := s.syntheticRoute(t, "CONNECT "+path, byStatus)
		r.Path = path
		s.connect[path] = r
	}
	return s
}

// syntheticRoute is a route whose operation answers with the named
// components/responses entries.
func (s *specChecker) syntheticRoute(t testing.TB, id string, byStatus map[int]string) *routers.Route {
	t.Helper()
	resps := openapi3.NewResponses()
	for status, name := range byStatus {
		ref, ok := s.doc.Components.Responses[name]
		if !ok || ref.Value == nil {
			t.Fatalf("%s: components/responses/%s does not exist", id, name)
		}
		resps.Set(strconv.Itoa(status), ref)
	}
	resps.Delete("default")
	op := openapi3.NewOperation()
	op.OperationID = id
	op.Responses = resps
	return &routers.Route{Spec: s.doc, Operation: op}
}

// check validates one exchange and reports every mismatch on t.
func (s *specChecker) check(t testing.TB, req *http.Request, reqBody []byte, r result) {
	t.Helper()
	for _, err := range s.validate(req, reqBody, r) {
		t.Errorf("spec: %v", err)
	}
}

// checkResponse validates only the response of an exchange.
func (s *specChecker) checkResponse(t testing.TB, req *http.Request, r result) {
	t.Helper()
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		route, params = s.fallback, nil
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: s.opts}
	for _, err := range s.validateResponse(req.Method+" "+req.URL.RequestURI(), in, r) {
		t.Errorf("spec: %v", err)
	}
}

// validate checks one exchange. A 2xx answer means the server accepted the
// request, so the request must be valid per the spec too.
func (s *specChecker) validate(req *http.Request, reqBody []byte, r result) []error {
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		route, params = s.fallback, nil
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: s.opts}
	var errs []error
	if r.status/100 == 2 && route != s.fallback {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			errs = append(errs, fmt.Errorf("%s %s (body %.200q) was accepted with %d but the spec rejects it: %w",
				req.Method, req.URL.RequestURI(), reqBody, r.status, err))
		}
	}
	return append(errs, s.validateResponse(req.Method+" "+req.URL.RequestURI(), in, r)...)
}

// checkConnect validates the answer to a CONNECT against x-connect.
func (s *specChecker) checkConnect(t testing.TB, path string, r result) {
	t.Helper()
	for _, err := range s.validateConnect(path, r) {
		t.Errorf("spec: %v", err)
	}
}

func (s *specChecker) validateConnect(path string, r result) []error {
	tmpl := ""
	for p := range s.connect {
		prefix := strings.TrimSuffix(p, "{id}")
		if strings.HasPrefix(path, prefix) && !strings.Contains(path[len(prefix):], "/") {
			tmpl = p
		}
	}
	route := s.connect[tmpl]
	if route == nil {
		route = s.fallback
	}
	if r.status == http.StatusOK && route != s.fallback {
		s.cov.add(route.Operation.OperationID, r.status)
		return nil
	}
	req, _ := http.NewRequest(http.MethodConnect, "http://gateway"+path, nil)
	in := &openapi3filter.RequestValidationInput{Request: req, Route: route, Options: s.opts}
	return s.validateResponse("CONNECT "+path, in, r)
}

func (s *specChecker) validateResponse(what string, in *openapi3filter.RequestValidationInput, r result) []error {
	s.cov.add(in.Route.Operation.OperationID, r.status)
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: r.status, Header: r.header, Options: s.opts,
	}
	rin.SetBodyBytes(r.body)
	var errs []error
	if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
		errs = append(errs, fmt.Errorf("%s -> %d %.300q does not match the spec: %w", what, r.status, r.body, err))
	}
	if r.status == http.StatusNoContent && len(r.body) != 0 {
		errs = append(errs, fmt.Errorf("%s -> 204 with a body %q", what, r.body))
	}
	return errs
}

// TestSpecCheckerRejectsDrift makes sure the checker used by every test is
// not vacuous: answers that drift from the spec must be reported.
func TestSpecCheckerRejectsDrift(t *testing.T) {
	s := newSpecChecker(t, "http://127.0.0.1:9", nil)
	id := "sbx-abcdefghijklmnopqrst"
	session := `{"sessionId":"` + id + `","status":"running","image":"default","metadata":{},` +
		`"createdAt":"2024-01-02T03:04:05Z","expiresAt":"2024-01-02T04:04:05Z","lastActivityAt":"2024-01-02T03:04:05Z",` +
		`"ttl":3600,"egress":{"allow":[],"bytesIn":0,"bytesOut":0},"ssh":{"username":"sandbox","hostKeys":["ssh-ed25519 AAAA"],"knownHostsLine":"* ssh-ed25519 AAAA","connectPath":"/v1/sessions/` + id + `"}}`
	jsonHdr := http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}}
	errBody := func(code string) []byte { return []byte(`{"error":{"code":"` + code + `","message":"m"}}`) }
	cases := []struct {
		name, method, path string
		r                  result
		ok                 bool
	}{
		{"good session", "GET", "/v1/sessions/" + id, result{200, jsonHdr, []byte(session)}, true},
		{"extra field", "GET", "/v1/sessions/" + id, result{200, jsonHdr, []byte(strings.Replace(session, `"ttl"`, `"tenant":"x","ttl"`, 1))}, false},
		{"bad status enum", "GET", "/v1/sessions/" + id, result{200, jsonHdr, []byte(strings.Replace(session, `"running"`, `"sleeping"`, 1))}, false},
		{"bad date-time", "GET", "/v1/sessions/" + id, result{200, jsonHdr, []byte(strings.Replace(session, `2024-01-02T03:04:05Z`, `yesterday`, 1))}, false},
		{"missing ssh", "GET", "/v1/sessions/" + id, result{200, jsonHdr, []byte(strings.Replace(session, `"ssh":`, `"sh":`, 1))}, false},
		{"undocumented status", "GET", "/v1/sessions/" + id, result{409, jsonHdr, errBody("not_found")}, false},
		{"unknown error code", "GET", "/v1/sessions/" + id, result{404, jsonHdr, errBody("gone")}, false},
		{"401 without WWW-Authenticate", "GET", "/v1/sessions", result{401, jsonHdr, errBody("unauthorized")}, false},
		{"401 with WWW-Authenticate", "GET", "/v1/sessions", result{401, http.Header{"Content-Type": {"application/json"}, "Www-Authenticate": {`Bearer realm="x"`}}, errBody("unauthorized")}, true},
		{"text error", "GET", "/v1/sessions", result{400, http.Header{"Content-Type": {"text/plain"}}, []byte("bad")}, false},
		{"201 without Location", "POST", "/v1/sessions", result{201, jsonHdr, []byte(session)}, false},
		{"unlisted path 404", "GET", "/nope", result{404, jsonHdr, errBody("unknown_endpoint")}, true},
		{"unlisted path 200", "GET", "/nope", result{200, jsonHdr, []byte(`{}`)}, false},
		{"204 with body", "DELETE", "/v1/sessions/" + id, result{204, http.Header{}, []byte("x")}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, "http://127.0.0.1:9"+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			errs := s.validate(req, nil, c.r)
			if c.ok && len(errs) > 0 {
				t.Errorf("valid exchange reported: %v", errs)
			}
			if !c.ok && len(errs) == 0 {
				t.Error("drift not reported")
			}
		})
	}
	if errs := s.validateConnect("/sessions/"+id, result{418, jsonHdr, errBody("not_found")}); len(errs) == 0 {
		t.Error("CONNECT with an undocumented status not reported")
	}
	if errs := s.validateConnect("/v1/sessions/"+id, result{404, jsonHdr, errBody("not_found")}); len(errs) > 0 {
		t.Errorf("CONNECT 404 reported: %v", errs)
	}
}

func TestSpecIsValid(t *testing.T) {
	doc := loadSpec(t)
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi = %q, want 3.0.3", doc.OpenAPI)
	}
	if _, ok := doc.Components.SecuritySchemes["bearerAuth"]; !ok {
		t.Error("no bearerAuth security scheme")
	}
	want := map[string][]string{
		"/healthz":                   {http.MethodGet},
		"/readyz":                    {http.MethodGet},
		"/v1/sessions":               {http.MethodGet, http.MethodPost},
		"/v1/sessions/{id}":          {http.MethodDelete, http.MethodGet, http.MethodPatch},
		"/v1/host-keys":              {http.MethodGet},
		"/v1/images":                 {http.MethodGet},
		"/v1/sessions/{id}/ssh":      {http.MethodGet},
		"/v1/sessions/{id}/terminal": {http.MethodGet},
		"/v1/sessions/{id}/tickets":  {http.MethodPost},
		"/sessions/{id}":             nil,
		"/openapi.yaml":              {http.MethodGet},
		"/openapi.json":              {http.MethodGet},
		"/docs":                      {http.MethodGet},
		"/":                          {http.MethodGet},
	}
	for path, methods := range want {
		item := doc.Paths.Value(path)
		if item == nil {
			t.Errorf("spec lacks %s", path)
			continue
		}
		var got []string
		for m := range item.Operations() {
			got = append(got, m)
		}
		sort.Strings(got)
		if !slices.Equal(got, methods) {
			t.Errorf("%s methods = %v, want %v", path, got, methods)
		}
		for m, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", m, path)
			}
			public := !strings.HasPrefix(path, "/v1/") && path != "/sessions/{id}"
			open := op.Security != nil && (len(*op.Security) == 0 || slices.ContainsFunc(*op.Security,
				func(r openapi3.SecurityRequirement) bool { return len(r) == 0 }))
			if open != public {
				t.Errorf("%s %s: no-auth = %v, want %v", m, path, open, public)
			}
		}
	}
	for _, path := range []string{"/v1/sessions/{id}", "/sessions/{id}"} {
		if _, ok := doc.Paths.Value(path).Extensions["x-connect"]; !ok {
			t.Errorf("%s has no x-connect", path)
		}
	}
	for path := range doc.Paths.Map() {
		if _, ok := want[path]; !ok && !dataPlanePath(path) {
			t.Errorf("spec has %s, which this test does not know", path)
		}
	}
	req := doc.Components.Schemas["CreateSessionRequest"].Value
	if req.AdditionalProperties.Has == nil || *req.AdditionalProperties.Has {
		t.Error("CreateSessionRequest must set additionalProperties: false")
	}
	ttl := req.Properties["ttl"].Value
	if *ttl.Min != gateway.MinTTL || *ttl.Max != gateway.MaxTTL || ttl.Default != float64(gateway.DefaultTTL) {
		t.Errorf("ttl bounds %v..%v default %v, want %d..%d default %d", *ttl.Min, *ttl.Max, ttl.Default, gateway.MinTTL, gateway.MaxTTL, gateway.DefaultTTL)
	}
	status := doc.Components.Schemas["Session"].Value.Properties["status"].Value
	for _, s := range []string{gateway.StatusRunning, gateway.StatusDeleted, gateway.StatusExpired, gateway.StatusFailed} {
		if !slices.Contains(status.Enum, any(s)) {
			t.Errorf("Session.status enum lacks %q", s)
		}
	}
}

// failingStore is a store whose writes fail.
type failingStore struct{ *gateway.MemStore }

func (failingStore) Put(...gateway.Record) error { return errors.New("disk full") }

// switchStore is a store whose writes fail while fail is set.
type switchStore struct {
	*gateway.MemStore
	fail atomic.Bool
}

func (s *switchStore) Put(recs ...gateway.Record) error {
	if s.fail.Load() {
		return errors.New("disk full")
	}
	return s.MemStore.Put(recs...)
}

// putLostSession stores a running session of tenant whose sandbox does not
// exist, as after a restart that lost it, and returns its id.
func putLostSession(t testing.TB, store gateway.Store, tenant string) string {
	t.Helper()
	id := "sbx-lostlostlostlostlost"
	now := time.Now().UTC()
	err := store.Put(gateway.Record{
		ID: id, Tenant: tenant, PasswordHash: make([]byte, 32),
		View: gateway.View{
			Image: "default", Metadata: map[string]any{"k": "v"}, Status: gateway.StatusRunning,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivityAt: now, TTL: 3600,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// panicSessions stands in for a manager with a bug: every call panics.
type panicSessions struct{}

func (panicSessions) Create(context.Context, gateway.Principal, gateway.CreateParams) (*gateway.Session, string, error) {
	panic("boom: internal detail")
}

func (panicSessions) Get(context.Context, gateway.Principal, string) (*gateway.Session, error) {
	panic("boom: internal detail")
}

func (panicSessions) List(context.Context, gateway.Principal, int, int) ([]*gateway.Session, int) {
	panic("boom: internal detail")
}

func (panicSessions) Delete(context.Context, gateway.Principal, string) error {
	panic("boom: internal detail")
}

func (panicSessions) Update(context.Context, gateway.Principal, string, gateway.UpdateParams) (*gateway.Session, error) {
	panic("boom: internal detail")
}

// TestContract drives every path, method and reachable status of the real
// server; every answer is validated against the spec as it arrives, and at
// the end every response the spec documents must have been seen.
func TestContract(t *testing.T) {
	cov := newCoverage()
	var notReady atomic.Bool
	g := newGateway(t, gwOptions{
		gateway: gateway.Config{MaxSessionsPerTenant: 2, MaxSessions: 3, Images: []string{"default", "python"}},
		// High enough never to trigger here, so the X-RateLimit-* headers
		// are on every authenticated answer.
		rateLimit: 1000,
		ready: func() (map[string]any, error) {
			if notReady.Load() {
				return nil, fmt.Errorf("sandbox driver is not usable")
			}
			return map[string]any{"sandbox": "workdir", "limits": map[string]any{"pids": false}}, nil
		},
		cov: cov,
	})
	pubKey := g.hostKeys[0] // any authorized_keys line will do

	t.Run("health", func(t *testing.T) {
		expect(t, g.do(t, http.MethodGet, "/healthz", "", nil), 200, "")
		expect(t, g.do(t, http.MethodGet, "/readyz", "", nil), 200, "")
		notReady.Store(true)
		expect(t, g.do(t, http.MethodGet, "/readyz", "", nil), 503, "not_ready")
		notReady.Store(false)
		expect(t, g.do(t, http.MethodGet, "/readyz", aliceKey, nil), 200, "")
		expect(t, g.do(t, http.MethodGet, "/readyz", "wrong", nil), 401, "unauthorized")
		for _, p := range []string{"/openapi.yaml", "/openapi.json", "/docs", "/"} {
			expect(t, g.do(t, http.MethodGet, p, "", nil), 200, "")
		}
		expect(t, g.do(t, http.MethodPost, "/healthz", "", nil), 405, "method_not_allowed")
		expect(t, g.do(t, http.MethodGet, "/nope", "", nil), 404, "unknown_endpoint")
		expect(t, g.do(t, http.MethodGet, "/v1/nope", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodGet, "/v1/nope", aliceKey, nil), 404, "unknown_endpoint")
	})

	var a1, a2 sessionOut
	t.Run("create", func(t *testing.T) {
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", "garbage", []byte(`{}`)), 401, "unauthorized")

		r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil)
		expect(t, r, 201, "")
		a1 = r.session(t)
		if got := r.header.Get("Location"); got != "/v1/sessions/"+a1.SessionID {
			t.Errorf("Location = %q", got)
		}
		if a1.TTL != gateway.DefaultTTL || a1.Image != "default" || a1.Status != "running" || len(a1.Metadata) != 0 {
			t.Errorf("defaults: %+v", a1)
		}
		if a1.SSH.Password == "" || a1.SSH.Username != "sandbox" || a1.SSH.ConnectPath != "/v1/sessions/"+a1.SessionID {
			t.Errorf("ssh: %+v", a1.SSH)
		}
		if !slices.Equal(a1.SSH.HostKeys, g.hostKeys) || a1.SSH.KnownHostsLine != "* "+g.hostKeys[0] {
			t.Errorf("host keys: %+v", a1.SSH)
		}
		if !a1.ExpiresAt.Equal(a1.CreatedAt.Add(time.Duration(a1.TTL) * time.Second)) {
			t.Errorf("expiresAt %v != createdAt %v + ttl", a1.ExpiresAt, a1.CreatedAt)
		}

		r = g.do(t, http.MethodPost, "/v1/sessions", aliceKey,
			[]byte(`{"ttl": 7200, "image": "python", "metadata": {"job": 7, "tags": ["a"]}, "sshPublicKey": "`+pubKey+`"}`))
		expect(t, r, 201, "")
		a2 = r.session(t)
		if a2.TTL != 7200 || a2.Image != "python" || a2.Metadata["job"] != float64(7) {
			t.Errorf("chosen values: %+v", a2)
		}

		if a1.Resources == nil || *a1.Resources != (gateway.Resources{MemoryMiB: 512, CPUs: 1, Pids: 256, DiskMiB: 1024}) {
			t.Errorf("default resources: %+v", a1.Resources)
		}
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{}`)), 429, "quota_exceeded")
		b1 := g.create(t, bobKey, `{"ttl": null, "image": null, "metadata": null, "labels": null, "resources": null, "sshPublicKey": null}`)
		r = g.do(t, http.MethodPost, "/v1/sessions", carolKey, nil)
		expect(t, r, 503, "capacity") // the gateway's limit, not carol's
		if r.header.Get("Retry-After") == "" {
			t.Error("503 capacity without Retry-After")
		}
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+b1.SessionID, bobKey, nil), 204, "")
		// Resources asked for (omitted fields: the defaults) and labels.
		r = g.do(t, http.MethodPost, "/v1/sessions", bobKey,
			[]byte(`{"labels": {"team": "x"}, "resources": {"memoryMiB": 2048, "cpus": 0.5, "pids": null}}`))
		expect(t, r, 201, "")
		b3 := r.session(t)
		if b3.Metadata["team"] != "x" || b3.Resources == nil ||
			*b3.Resources != (gateway.Resources{MemoryMiB: 2048, CPUs: 0.5, Pids: 256, DiskMiB: 1024}) {
			t.Errorf("labels and resources: %+v %+v", b3.Metadata, b3.Resources)
		}
		if got := g.do(t, http.MethodGet, "/v1/sessions/"+b3.SessionID, bobKey, nil).session(t); got.Resources == nil || *got.Resources != *b3.Resources {
			t.Errorf("GET resources %+v, want %+v", got.Resources, b3.Resources)
		}
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+b3.SessionID, bobKey, nil), 204, "")

		// Idempotency-Key: a replay, a reused key, one in progress (below).
		ik := []string{"Idempotency-Key", "contract-1"}
		r = g.do(t, http.MethodPost, "/v1/sessions", bobKey, []byte(`{"ttl": 600}`), ik...)
		expect(t, r, 201, "")
		b2 := r.session(t)
		r = g.do(t, http.MethodPost, "/v1/sessions", bobKey, []byte(`{"ttl": 600}`), ik...)
		expect(t, r, 200, "")
		if s := r.session(t); s.SessionID != b2.SessionID || s.SSH.Password != "" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay: %s %+v", r.header, s)
		}
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", bobKey, []byte(`{"ttl": 601}`), ik...), 422, "idempotency_key_reused")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", bobKey, nil, "Idempotency-Key", strings.Repeat("k", 256)), 400, "invalid_idempotency_key")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+b2.SessionID, bobKey, nil), 204, "")

		for _, c := range []struct{ body, code string }{
			{`[]`, "invalid_json"},
			{`{`, "invalid_json"},
			{`{} {}`, "invalid_json"},
			{`{"ttl": "long"}`, "invalid_field"},
			{`{"extra": 1}`, "unknown_field"},
			{`{"ttl": 59}`, "invalid_ttl"},
			{`{"image": "nope"}`, "unknown_image"},
			{`{"sshPublicKey": "ssh-ed25519 not-base64"}`, "invalid_ssh_public_key"},
			{`{"sshPublicKey": "command=\"true\" ` + pubKey + `"}`, "invalid_ssh_public_key"},
			{`{"metadata": {"a": [[[[[[[[1]]]]]]]]}}`, "metadata_too_deep"},
			{`{"metadata": {"a": {` + manyKeys(64) + `}}}`, "metadata_too_many_keys"},
			{`{"metadata": {"a": "` + strings.Repeat("x", 16384) + `"}}`, "metadata_too_large"},
			{`{"labels": {"a": [[[[[[[[1]]]]]]]]}}`, "metadata_too_deep"},
			{`{"metadata": {"a": 1}, "labels": {"b": 2}}`, "invalid_field"},
			{`{"metadata": {}, "labels": {}}`, "invalid_field"},
			{`{"resources": {"memoryMiB": 4096}}`, "resources_exceeded"},
			{`{"resources": {"cpus": 4.5}}`, "resources_exceeded"},
			{`{"resources": {"pids": 1025}}`, "resources_exceeded"},
			{`{"resources": {"diskMiB": 8192}}`, "resources_exceeded"},
			{`{"resources": {"memoryMiB": 1}}`, "invalid_resources"},
			{`{"resources": {"cpus": 0}}`, "invalid_resources"},
			{`{"resources": {"memoryMiB": "1G"}}`, "invalid_field"},
			{`{"resources": {"pids": 1.5}}`, "invalid_field"},
			{`{"resources": {"swapMiB": 1}}`, "unknown_field"},
			{`{"resources": []}`, "invalid_field"},
		} {
			expect(t, g.do(t, http.MethodPost, "/v1/sessions", carolKey, []byte(c.body)), 400, c.code)
		}
		big := `{"metadata": {"x": "` + strings.Repeat("a", rest.MaxBodyBytes) + `"}}`
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", carolKey, []byte(big)), 413, "body_too_large")
	})

	t.Run("read", func(t *testing.T) {
		r := g.do(t, http.MethodGet, "/v1/sessions", aliceKey, nil)
		expect(t, r, 200, "")
		for _, q := range []string{"?limit=1", "?limit=1&offset=1", "?limit=100&offset=5", "?offset=0"} {
			expect(t, g.do(t, http.MethodGet, "/v1/sessions"+q, aliceKey, nil), 200, "")
		}
		expect(t, g.do(t, http.MethodGet, "/v1/sessions?limit=0", aliceKey, nil), 400, "invalid_limit")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions?offset=-1", aliceKey, nil), 400, "invalid_offset")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions?offset=", aliceKey, nil), 400, "invalid_offset")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions", "", nil), 401, "unauthorized")

		r = g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID, aliceKey, nil)
		expect(t, r, 200, "")
		if s := r.session(t); s.SSH.Password != "" || s.SessionID != a1.SessionID {
			t.Errorf("get: %+v", s)
		}
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID, bobKey, nil), 404, "not_found")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/sbx-missing", aliceKey, nil), 404, "not_found")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID, "", nil), 401, "unauthorized")

		r = g.do(t, http.MethodGet, "/v1/host-keys", aliceKey, nil)
		expect(t, r, 200, "")
		expect(t, g.do(t, http.MethodGet, "/v1/host-keys", "", nil), 401, "unauthorized")
	})

	t.Run("update", func(t *testing.T) {
		path := "/v1/sessions/" + a1.SessionID
		before := g.do(t, http.MethodGet, path, aliceKey, nil).session(t)
		start := time.Now().UTC().Truncate(time.Second)
		r := g.do(t, http.MethodPatch, path, aliceKey, []byte(`{"ttl": 7200}`))
		expect(t, r, 200, "")
		s := r.session(t)
		if s.TTL != 7200 || s.SSH.Password != "" || s.SessionID != a1.SessionID {
			t.Errorf("after PATCH: %+v", s)
		}
		if s.ExpiresAt.Before(start.Add(7200*time.Second)) || s.ExpiresAt.After(time.Now().Add(7201*time.Second)) {
			t.Errorf("expiresAt %v, want about now + 7200s", s.ExpiresAt)
		}
		if got := g.do(t, http.MethodGet, path, aliceKey, nil).session(t); !got.ExpiresAt.Equal(s.ExpiresAt) || got.TTL != 7200 {
			t.Errorf("GET after PATCH: ttl %d expiresAt %v", got.TTL, got.ExpiresAt)
		}
		// No change: an empty body, {}, nulls.
		for _, body := range []string{"", `{}`, `{"ttl": null}`} {
			r := g.do(t, http.MethodPatch, path, aliceKey, []byte(body))
			expect(t, r, 200, "")
			if got := r.session(t); !got.ExpiresAt.Equal(s.ExpiresAt) {
				t.Errorf("PATCH %q moved expiresAt", body)
			}
		}
		expect(t, g.do(t, http.MethodPatch, path, aliceKey, []byte(`{"ttl": 60}`)), 200, "")
		if got := g.do(t, http.MethodGet, path, aliceKey, nil).session(t); !got.ExpiresAt.Before(before.ExpiresAt) {
			t.Errorf("a shorter ttl kept expiresAt at %v", got.ExpiresAt)
		}
		expect(t, g.do(t, http.MethodPatch, path, aliceKey, []byte(`{"ttl": 3600}`)), 200, "")
		for _, c := range []struct{ body, code string }{
			{`{"ttl": 59}`, "invalid_ttl"},
			{`{"ttl": 28801}`, "invalid_ttl"},
			{`{"ttl": "long"}`, "invalid_field"},
			{`{"image": "python"}`, "unknown_field"},
			{`{"TTL": 600}`, "unknown_field"},
			{`[]`, "invalid_json"},
		} {
			expect(t, g.do(t, http.MethodPatch, path, aliceKey, []byte(c.body)), 400, c.code)
		}
		big := `{"ttl": 600, "x": "` + strings.Repeat("a", rest.MaxBodyBytes) + `"}`
		expect(t, g.do(t, http.MethodPatch, path, aliceKey, []byte(big)), 413, "body_too_large")
		expect(t, g.do(t, http.MethodPatch, path, bobKey, []byte(`{"ttl": 600}`)), 404, "not_found")
		expect(t, g.do(t, http.MethodPatch, "/v1/sessions/sbx-missing", aliceKey, []byte(`{"ttl": 600}`)), 404, "not_found")
		expect(t, g.do(t, http.MethodPatch, path, "", []byte(`{"ttl": 600}`)), 401, "unauthorized")
		if got := g.do(t, http.MethodGet, path, aliceKey, nil).session(t); got.TTL != 3600 {
			t.Errorf("refused PATCHes changed ttl to %d", got.TTL)
		}
	})

	t.Run("methods", func(t *testing.T) {
		expect(t, g.do(t, http.MethodPut, "/v1/sessions", aliceKey, nil), 405, "method_not_allowed")
		expect(t, g.do(t, http.MethodPut, "/v1/sessions/"+a1.SessionID, aliceKey, []byte(`{}`)), 405, "method_not_allowed")
		expect(t, g.do(t, http.MethodPatch, "/sessions/"+a1.SessionID, aliceKey, []byte(`{"ttl": 600}`)), 405, "method_not_allowed")
		expect(t, g.do(t, http.MethodGet, "/sessions/"+a1.SessionID, aliceKey, nil), 405, "method_not_allowed")
		expect(t, g.do(t, http.MethodDelete, "/v1/host-keys", aliceKey, nil), 405, "method_not_allowed")
	})

	t.Run("connect", func(t *testing.T) {
		for _, c := range []struct {
			path string
			hdr  []string
		}{
			{"/v1/sessions/" + a1.SessionID, []string{"Proxy-Authorization", "Bearer " + aliceKey}},
			{"/sessions/" + a1.SessionID, []string{"Authorization", "Bearer " + aliceKey}},
		} {
			r, _, br := g.rawConnect(t, c.path, c.hdr...)
			expect(t, r, 200, "")
			line, err := br.ReadString('\n')
			if err != nil || line != sshBanner {
				t.Errorf("CONNECT %s: after 200 got %q, %v; want the SSH banner", c.path, line, err)
			}
		}
		r, _, _ := g.rawConnect(t, "/v1/sessions/"+a1.SessionID)
		expect(t, r, 401, "unauthorized")
		if !strings.HasPrefix(r.header.Get("Proxy-Authenticate"), "Bearer") {
			t.Errorf("CONNECT 401 Proxy-Authenticate = %q", r.header.Get("Proxy-Authenticate"))
		}
		r, _, _ = g.rawConnect(t, "/sessions/"+a1.SessionID, "Proxy-Authorization", "Bearer wrong")
		expect(t, r, 401, "unauthorized")
		r, _, _ = g.rawConnect(t, "/v1/sessions/"+a1.SessionID, "Proxy-Authorization", "Bearer "+bobKey)
		expect(t, r, 404, "not_found")
		r, _, _ = g.rawConnect(t, "/sessions/sbx-missing", "Proxy-Authorization", "Bearer "+aliceKey)
		expect(t, r, 404, "not_found")
		testSSHWebSocket(t, g, a1.SessionID) // sshws_test.go
	})

	t.Run("delete", func(t *testing.T) {
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+a1.SessionID, bobKey, nil), 404, "not_found")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+a1.SessionID, "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+a1.SessionID, aliceKey, nil), 204, "")
		// A deleted session is gone (410) for the tombstone ttl: on every
		// route, CONNECT too, and the message says when, why and by whom.
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+a1.SessionID, aliceKey, nil), 410, "session_gone")
		r := g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID, aliceKey, nil)
		expect(t, r, 410, "session_gone")
		for _, want := range []string{"(reason: deleted)", `by tenant \"alice\" (api_key)`, "deleted at "} {
			if !strings.Contains(string(r.body), want) {
				t.Errorf("gone body %s lacks %q", r.body, want)
			}
		}
		expect(t, g.do(t, http.MethodPatch, "/v1/sessions/"+a1.SessionID, aliceKey, []byte(`{"ttl": 600}`)), 410, "session_gone")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID+"/files?path=.", aliceKey, nil), 410, "session_gone")
		for _, p := range []string{"/v1/sessions/", "/sessions/"} {
			r, _, _ = g.rawConnect(t, p+a1.SessionID, "Proxy-Authorization", "Bearer "+aliceKey)
			expect(t, r, 410, "session_gone")
		}
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID+"/ssh", aliceKey, nil, wsHeaders()...), 410, "session_gone")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID+"/terminal", aliceKey, nil, wsHeaders()...), 410, "session_gone")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+a1.SessionID+"/tickets", aliceKey, nil), 410, "session_gone")
		// Another tenant's tombstone is a missing id, exactly.
		rb := g.do(t, http.MethodGet, "/v1/sessions/"+a1.SessionID, bobKey, nil)
		expect(t, rb, 404, "not_found")
		rm := g.do(t, http.MethodGet, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa", bobKey, nil)
		if string(rb.body) != string(rm.body) {
			t.Errorf("another tenant's tombstone %s differs from a missing id %s", rb.body, rm.body)
		}
		r, _, _ = g.rawConnect(t, "/v1/sessions/"+a1.SessionID, "Proxy-Authorization", "Bearer "+bobKey)
		expect(t, r, 404, "not_found")
	})

	t.Run("images", func(t *testing.T) {
		imgs := &testImages{list: []rest.ImageInfo{{Name: "docker.io/library/busybox:1", Digest: "sha256:" + strings.Repeat("ab", 32),
			SizeBytes: 2 << 20, PulledAt: time.Now().UTC()}}, allow: []string{"docker.io/library/*"},
			aliases: []rest.ImageAlias{{Name: "python:3.11-slim", Image: "default"}, {Name: "bb", Image: "docker.io/library/busybox:1"}}}
		ig := newGateway(t, gwOptions{cov: cov, images: imgs, gateway: gateway.Config{ImageSource: imgs}})
		r := ig.do(t, http.MethodGet, "/v1/images", aliceKey, nil)
		expect(t, r, 200, "")
		var got struct {
			Images  []rest.ImageInfo  `json:"images"`
			Allow   []string          `json:"allow"`
			Aliases []rest.ImageAlias `json:"aliases"`
		}
		if err := json.Unmarshal(r.body, &got); err != nil || len(got.Images) != 1 || got.Images[0].Name != imgs.list[0].Name || !slices.Equal(got.Allow, imgs.allow) ||
			!slices.Equal(got.Aliases, imgs.aliases) {
			t.Errorf("images: %s (%v)", r.body, err)
		}
		expect(t, ig.do(t, http.MethodGet, "/v1/images", "", nil), 401, "unauthorized")
		expect(t, ig.do(t, http.MethodGet, "/v1/images", aliceKey, nil), 200, "")
		// A pull that fails: 502 with the registry's reason, nothing created.
		r = ig.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"image": "docker.io/library/unpullable:1"}`))
		expect(t, r, 502, "image_pull_failed")
		if !strings.Contains(string(r.body), "manifest unknown") {
			t.Errorf("pull failure without the registry's reason: %s", r.body)
		}
		expect(t, ig.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"image": "ghcr.io/other/x:1"}`)), 400, "unknown_image")
		imgs.fail = true
		expect(t, ig.do(t, http.MethodGet, "/v1/images", aliceKey, nil), 500, "internal")
		if n := ig.list(t, aliceKey).Total; n != 0 {
			t.Errorf("%d sessions after failed creates", n)
		}
	})

	t.Run("rate-limited", func(t *testing.T) {
		rl := newGateway(t, gwOptions{rateLimit: 2, cov: cov})
		s := rl.create(t, aliceKey, "")
		expect(t, rl.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil), 200, "")
		for _, c := range []struct{ method, path string }{
			{http.MethodPost, "/v1/sessions"},
			{http.MethodGet, "/v1/sessions"},
			{http.MethodGet, "/v1/sessions/" + s.SessionID},
			{http.MethodPatch, "/v1/sessions/" + s.SessionID},
			{http.MethodDelete, "/v1/sessions/" + s.SessionID},
			{http.MethodGet, "/v1/host-keys"},
			{http.MethodGet, "/v1/images"},
			{http.MethodGet, "/v1/nope"},
		} {
			r := rl.do(t, c.method, c.path, aliceKey, nil)
			expect(t, r, 429, "rate_limited")
			checkRateLimited(t, r, 2)
		}
		for _, p := range []string{"/v1/sessions/", "/sessions/"} {
			r, _, _ := rl.rawConnect(t, p+s.SessionID, "Proxy-Authorization", "Bearer "+aliceKey)
			expect(t, r, 429, "rate_limited")
		}
		// Failed authentications are limited per address, on /readyz too.
		for range 2 {
			expect(t, rl.do(t, http.MethodGet, "/readyz", "wrong", nil), 401, "unauthorized")
		}
		expect(t, rl.do(t, http.MethodGet, "/readyz", "wrong", nil), 429, "rate_limited")
	})

	t.Run("sandbox-failure", func(t *testing.T) {
		bad := newGateway(t, gwOptions{breakDriver: true, cov: cov})
		expect(t, bad.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil), 503, "sandbox_failed")
		if l := bad.list(t, aliceKey); l.Total != 0 {
			t.Errorf("a failed create left %d sessions", l.Total)
		}
	})

	t.Run("store-failure", func(t *testing.T) {
		sf := newGateway(t, gwOptions{store: failingStore{gateway.NewMemStore()}, cov: cov})
		expect(t, sf.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil), 503, "store_failed")
		if n := sf.sandboxDirs(t); n != 0 {
			t.Errorf("a create that could not be recorded left %d sandboxes", n)
		}
		// A PATCH that cannot be recorded changes nothing.
		store := &switchStore{MemStore: gateway.NewMemStore()}
		uf := newGateway(t, gwOptions{store: store, cov: cov})
		s := uf.create(t, aliceKey, `{"ttl": 600}`)
		store.fail.Store(true)
		expect(t, uf.do(t, http.MethodPatch, "/v1/sessions/"+s.SessionID, aliceKey, []byte(`{"ttl": 7200}`)), 503, "store_failed")
		store.fail.Store(false)
		if got := uf.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil).session(t); got.TTL != 600 || !got.ExpiresAt.Equal(s.ExpiresAt) {
			t.Errorf("an unrecorded PATCH took effect: ttl %d expiresAt %v", got.TTL, got.ExpiresAt)
		}
	})

	t.Run("failed-session", func(t *testing.T) {
		store := gateway.NewMemStore()
		id := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		r := fg.do(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil)
		expect(t, r, 200, "")
		var got struct {
			Status       string `json:"status"`
			StatusReason string `json:"statusReason"`
		}
		_ = json.Unmarshal(r.body, &got)
		if got.Status != gateway.StatusFailed || got.StatusReason == "" {
			t.Errorf("restored session without its sandbox: status %q reason %q", got.Status, got.StatusReason)
		}
		if l := fg.list(t, aliceKey); l.Total != 1 || l.Sessions[0].Status != gateway.StatusFailed {
			t.Errorf("list: %+v", l)
		}
		for _, p := range []string{"/v1/sessions/", "/sessions/"} {
			r, _, _ := fg.rawConnect(t, p+id, "Proxy-Authorization", "Bearer "+aliceKey)
			expect(t, r, 409, "session_not_running")
		}
		expect(t, fg.do(t, http.MethodPatch, "/v1/sessions/"+id, aliceKey, []byte(`{"ttl": 600}`)), 409, "session_not_running")
		fg.create(t, aliceKey, "") // a failed session holds no quota slot
		expect(t, fg.do(t, http.MethodDelete, "/v1/sessions/"+id, aliceKey, nil), 204, "")
		r = fg.do(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil)
		expect(t, r, 410, "session_gone")
		if !strings.Contains(string(r.body), "it had failed: sandbox lost across the gateway restart") {
			t.Errorf("gone body %s does not say why the session failed", r.body)
		}
	})

	t.Run("internal-error", func(t *testing.T) {
		pg := newGateway(t, gwOptions{wrap: func(rest.Sessions) rest.Sessions { return panicSessions{} }, cov: cov})
		for _, c := range []struct{ method, path string }{
			{http.MethodPost, "/v1/sessions"},
			{http.MethodGet, "/v1/sessions"},
			{http.MethodGet, "/v1/sessions/sbx-any"},
			{http.MethodPatch, "/v1/sessions/sbx-any"},
			{http.MethodDelete, "/v1/sessions/sbx-any"},
		} {
			r := pg.do(t, c.method, c.path, aliceKey, nil)
			expect(t, r, 500, "internal")
			if strings.Contains(string(r.body), "boom") {
				t.Errorf("%s %s: panic detail reached the client: %s", c.method, c.path, r.body)
			}
		}
		if !strings.Contains(pg.logs.String(), "handler_panic") {
			t.Error("panics were not logged")
		}
	})

	t.Run("idempotency-in-progress", func(t *testing.T) {
		gate := &gatedDriver{entered: make(chan struct{}, 1), release: make(chan struct{})}
		ig := newGateway(t, gwOptions{wrapDriver: gate.wrap, cov: cov})
		ik := []string{"Idempotency-Key", "slow-1"}
		first := make(chan result, 1)
		go func() { first <- ig.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil, ik...) }()
		<-gate.entered
		r := ig.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil, ik...)
		expect(t, r, 409, "idempotency_key_in_progress")
		if r.header.Get("Retry-After") == "" {
			t.Error("409 idempotency_key_in_progress without Retry-After")
		}
		close(gate.release)
		expect(t, <-first, 201, "")
	})

	t.Run("shutting-down", func(t *testing.T) {
		sd := newGateway(t, gwOptions{cov: cov})
		s := sd.create(t, aliceKey, "")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		sd.tun.Shutdown(ctx)
		for _, p := range []string{"/v1/sessions/", "/sessions/"} {
			r, _, _ := sd.rawConnect(t, p+s.SessionID, "Proxy-Authorization", "Bearer "+aliceKey)
			expect(t, r, 503, "shutting_down")
		}
		expect(t, sd.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID+"/ssh", aliceKey, nil, wsHeaders()...), 503, "shutting_down")
		expect(t, sd.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID+"/terminal", aliceKey, nil, wsHeaders()...), 503, "shutting_down")
	})

	// Every response the spec documents was produced by the real server
	// (the data plane's paths have contract tests of their own).
	requireSeen(t, cov, func(path string) bool { return !dataPlanePath(path) }, map[string]string{
		"getHostKeys 500":       "the handler has no failure path; documented because every handler sits behind the panic recoverer",
		"createSession 404":     "workspace_not_found and snapshot_not_found: seen in TestContractWorkspaces",
		"deleteSession 400":     "an invalid keepWorkspace: seen in TestContractWorkspaces",
		"deleteSession 409":     "workspace_sync_failed (files over the limit): seen in TestContractWorkspaces",
		"deleteSession 503":     "workspace_sync_failed (the store failed): seen in TestContractWorkspaces",
		"sshWebSocket 409":      "session_not_running: the tunnel server's check, shared with CONNECT (tunnel.Server.ServeHTTP)",
		"sshWebSocket 429":      "too_many_ssh_startups: sshd's admission, shared with CONNECT (tunnel.Admitter)",
		"terminalWebSocket 409": "session_not_running: the tunnel server's check, shared with CONNECT (tunnel.Server.ServeHTTP)",
		"terminalWebSocket 429": "too_many_ssh_startups: sshd's admission, shared with CONNECT (tunnel.Admitter)",
		"createTicket 429":      "too_many_tickets: seen in TestTicketLimit (100 tickets)",
	})
}

// dataPlanePath reports whether a spec path is the data plane's (commands,
// shells, files, processes, the kernel, links, stop, logs, ports, stats), the
// audit's, or a seed's compat API, whose contract tests live in their own files.
func dataPlanePath(path string) bool {
	for _, p := range []string{"/commands", "/shells/", "/files", "/processes", "/python", "/stop", "/pause", "/resume", "/fork", "/logs", "/links/", "/compat/", "/ports/", "/{path}", "/stats", "/egress", "/timeline", "/v1/audit", "/workspaces", "/snapshots"} {
		if strings.Contains(path, p) {
			return true
		}
	}
	return false
}

// requireSeen fails t unless every response the spec documents for the
// paths keep selects was seen in cov, but for those unreachable explains.
func requireSeen(t *testing.T, cov *coverage, keep func(path string) bool, unreachable map[string]string) {
	t.Helper()
	doc := loadSpec(t)
	var missing []string
	for path, item := range doc.Paths.Map() {
		if !keep(path) {
			continue
		}
		for _, op := range item.Operations() {
			for code, resp := range op.Responses.Map() {
				// The rate limit is one middleware in front of every
				// route; TestContract sees its 429 on /v1's own paths.
				if resp.Ref == "#/components/responses/TooManyRequests" && dataPlanePath(path) {
					continue
				}
				key := op.OperationID + " " + code
				if !cov.has(key) && unreachable[key] == "" {
					missing = append(missing, key)
				}
			}
		}
		if xc, ok := item.Extensions["x-connect"].(map[string]any); ok {
			resps, _ := xc["responses"].(map[string]any)
			for code := range resps {
				if key := "CONNECT " + path + " " + code; !cov.has(key) {
					missing = append(missing, key)
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("documented responses never seen from the server: %v", missing)
	}
}

// expect checks a status and, for errors, the envelope's code.
func expect(t testing.TB, r result, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d (body %.300s)", r.status, status, r.body)
		return
	}
	if code != "" && r.errorCode() != code {
		t.Errorf("code %q, want %q (body %.300s)", r.errorCode(), code, r.body)
	}
	if status >= 400 && r.errorMessage() == "" {
		t.Errorf("%d without an error message: %s", status, r.body)
	}
	if status == http.StatusUnauthorized && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("401 WWW-Authenticate = %q, want Bearer", r.header.Get("WWW-Authenticate"))
	}
}

// checkRateLimited checks the headers of a rate-limited answer.
func checkRateLimited(t testing.TB, r result, limit int) {
	t.Helper()
	if got := r.header.Get("X-RateLimit-Limit"); got != strconv.Itoa(limit) {
		t.Errorf("X-RateLimit-Limit = %q, want %d", got, limit)
	}
	if got := r.header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("X-RateLimit-Remaining = %q, want 0", got)
	}
	reset, err := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64)
	if now := time.Now().Unix(); err != nil || reset < now || reset > now+61 {
		t.Errorf("X-RateLimit-Reset = %q, want a unix time within the next minute", r.header.Get("X-RateLimit-Reset"))
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra <= 0 || ra > 60 {
		t.Errorf("Retry-After = %q", r.header.Get("Retry-After"))
	}
}

// manyKeys returns n JSON object members "k0": 0, "k1": 1, ...
func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `"k%d": %d`, i, i)
	}
	return b.String()
}

// gatedDriver holds the first sandbox Create until release is closed, to
// observe a create in progress.
type gatedDriver struct {
	gateway.Driver
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (g *gatedDriver) wrap(d gateway.Driver) gateway.Driver {
	g.Driver = d
	return g
}

func (g *gatedDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Driver.Create(ctx, spec)
}

// testImages stands in for the image store at the API's boundary: it lists
// fixed images, allows one pattern and answers every pull with a
// registry's refusal. (The store itself is tested with a real registry in
// package images and end to end in cmd/sandgate.)
type testImages struct {
	list    []rest.ImageInfo
	allow   []string
	aliases []rest.ImageAlias
	fail    bool
}

func (t *testImages) ImageAliases() []rest.ImageAlias { return t.aliases }

func (t *testImages) ListImages(context.Context) ([]rest.ImageInfo, []string, error) {
	if t.fail {
		return nil, nil, errors.New("index unreadable")
	}
	return t.list, t.allow, nil
}

func (t *testImages) Check(name string) error {
	if strings.HasPrefix(name, "docker.io/library/") {
		return nil
	}
	return gateway.Invalid("unknown_image", "unknown image "+name+"; allowed: docker.io/library/*")
}

func (t *testImages) Resolve(_ context.Context, name string) (*sandbox.Image, error) {
	return nil, &gateway.Error{Kind: gateway.KindUpstream, Code: "image_pull_failed",
		Message: "pull " + name + ": MANIFEST_UNKNOWN: manifest unknown"}
}

func (t *testImages) Hold(string, *sandbox.Image) error     { return nil }
func (t *testImages) HoldWarm(string, *sandbox.Image) error { return nil }
func (t *testImages) Release(string)                        {}
