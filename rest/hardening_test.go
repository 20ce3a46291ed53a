package rest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// waitLog waits until the gateway has logged msg.
func waitLog(t testing.TB, g *testGateway, msg string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(g.logs.String(), msg) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in the logs:\n%s", msg, g.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lateSessions, while late is set, makes each Create finish only after
// its client has gone (its request context is done), as a slow sandbox
// would; entered receives a value as each such Create starts.
type lateSessions struct {
	rest.Sessions
	late    atomic.Bool
	entered chan struct{}
}

func (l *lateSessions) Create(ctx context.Context, p gateway.Principal, cp gateway.CreateParams) (*gateway.Session, string, error) {
	if l.late.Load() {
		select {
		case l.entered <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
		ctx = context.WithoutCancel(ctx)
	}
	return l.Sessions.Create(ctx, p, cp)
}

// sendCreate sends a create over a new connection and returns the
// connection without reading the answer.
func sendCreate(t testing.TB, g *testGateway, body string, hdr ...string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", g.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + aliceKey + "\r\n"
	for i := 0; i+1 < len(hdr); i += 2 {
		req += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	req += "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestCreateRolledBackWhenClientGone: a client that sends a create and
// disconnects never hears of the session, so none may remain (before, it
// lived on with a password nobody had, holding quota until the idle timeout).
func TestCreateRolledBackWhenClientGone(t *testing.T) {
	t.Run("gone during the create", func(t *testing.T) {
		late := &lateSessions{entered: make(chan struct{}, 1)}
		late.late.Store(true)
		g := newGateway(t, gwOptions{
			gateway: gateway.Config{MaxSessionsPerTenant: 1},
			wrap: func(s rest.Sessions) rest.Sessions {
				late.Sessions = s
				return late
			},
		})
		body := `{"ttl": 600}`
		conn := sendCreate(t, g, body, "Idempotency-Key", "gone-1")
		<-late.entered
		conn.Close()
		waitLog(t, g, "session_create_rolled_back")
		if n := g.sandboxDirs(t); n != 0 {
			t.Errorf("%d sandboxes remain after an abandoned create", n)
		}
		if l := g.list(t, aliceKey); l.Total != 0 {
			t.Errorf("%d sessions remain after an abandoned create", l.Total)
		}
		// Nothing holds alice's only quota slot or her key: a retry with
		// the same key creates a session and hands out its password.
		late.late.Store(false)
		r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(body), "Idempotency-Key", "gone-1")
		expect(t, r, http.StatusCreated, "")
		if r.session(t).SSH.Password == "" {
			t.Error("the retry got no password")
		}
	})
	t.Run("ten gone at once", func(t *testing.T) {
		late := &lateSessions{entered: make(chan struct{}, 1)}
		late.late.Store(true)
		g := newGateway(t, gwOptions{wrap: func(s rest.Sessions) rest.Sessions {
			late.Sessions = s
			return late
		}})
		for range 10 {
			sendCreate(t, g, `{}`).Close()
		}
		// Each is abandoned before its create or rolled back after it.
		deadline := time.Now().Add(15 * time.Second)
		for {
			logs := g.logs.String()
			n := strings.Count(logs, "session_create_abandoned") + strings.Count(logs, "session_create_rolled_back")
			if n == 10 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of 10 abandoned creates accounted for:\n%s", n, logs)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if n := g.sandboxDirs(t); n != 0 {
			t.Errorf("%d sandboxes remain after 10 abandoned creates", n)
		}
		if l := g.list(t, aliceKey); l.Total != 0 {
			t.Errorf("%d sessions remain after 10 abandoned creates", l.Total)
		}
	})
}

// brokenWriter is a client connection that is gone: every write fails.
type brokenWriter struct {
	header http.Header
	status int
}

func (b *brokenWriter) Header() http.Header { return b.header }
func (b *brokenWriter) WriteHeader(s int)   { b.status = s }
func (b *brokenWriter) Write([]byte) (int, error) {
	return 0, errors.New("write: broken pipe")
}

// TestCreateRolledBackWhenAnswerFails: when the 201 cannot be written, the
// session is deleted again.
func TestCreateRolledBackWhenAnswerFails(t *testing.T) {
	g := newGateway(t, gwOptions{})
	req, err := http.NewRequest(http.MethodPost, "/v1/sessions", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	w := &brokenWriter{header: http.Header{}}
	g.handler.ServeHTTP(w, req)
	if w.status != http.StatusCreated {
		t.Fatalf("status %d, want an attempted 201", w.status)
	}
	if !strings.Contains(g.logs.String(), "session_create_rolled_back") {
		t.Error("the rollback was not logged")
	}
	if n := g.sandboxDirs(t); n != 0 {
		t.Errorf("%d sandboxes remain after an undeliverable create", n)
	}
	if l := g.list(t, aliceKey); l.Total != 0 {
		t.Errorf("%d sessions remain after an undeliverable create", l.Total)
	}
}

// TestIdempotentCreate: the same Idempotency-Key and body return the same
// session (200, Idempotent-Replayed: true, no password), take no quota and
// make no sandbox; another body is 422; bad keys are 400.
func TestIdempotentCreate(t *testing.T) {
	g := newGateway(t, gwOptions{gateway: gateway.Config{MaxSessionsPerTenant: 1}})
	ik := []string{"Idempotency-Key", "c0ffee-1"}
	r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"metadata": {"job": 1}}`), ik...)
	expect(t, r, http.StatusCreated, "")
	first := r.session(t)
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Error("a first create says it is a replay")
	}
	for _, body := range []string{`{"metadata": {"job": 1}}`, `{"metadata": {"job": 1}, "ttl": 3600, "image": "default"}`} {
		r = g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(body), ik...)
		expect(t, r, http.StatusOK, "")
		s := r.session(t)
		if s.SessionID != first.SessionID || s.SSH.Password != "" || r.header.Get("Idempotent-Replayed") != "true" ||
			r.header.Get("Location") != "/v1/sessions/"+first.SessionID {
			t.Errorf("replay of %s: %s %+v", body, r.header, s)
		}
	}
	if n := g.sandboxDirs(t); n != 1 {
		t.Errorf("%d sandboxes, want 1", n)
	}
	expect(t, g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"metadata": {"job": 2}}`), ik...),
		http.StatusUnprocessableEntity, "idempotency_key_reused")
	expect(t, g.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil, "Idempotency-Key", "other"),
		http.StatusTooManyRequests, "quota_exceeded") // a new key is a new session
	// Bob's key of the same text is bob's own.
	if s := g.create2(t, bobKey, ik...); s.SessionID == first.SessionID || s.SSH.Password == "" {
		t.Errorf("bob got %+v", s)
	}

	for name, hdr := range map[string][]string{
		"too long":  {"Idempotency-Key", strings.Repeat("k", gateway.MaxIdempotencyKeyLen+1)},
		"empty":     {"Idempotency-Key", ""},
		"tab":       {"Idempotency-Key", "a\tb"},
		"non-ASCII": {"Idempotency-Key", "cl\xc3\xa9"},
	} {
		r := g.exchange(t, false, http.MethodPost, "/v1/sessions", carolKey, nil, hdr...)
		expect(t, r, http.StatusBadRequest, "invalid_idempotency_key")
		if t.Failed() {
			t.Logf("key %s", name)
		}
	}
	// Two Idempotency-Key headers.
	conn, err := net.DialTimeout("tcp", g.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+carolKey+
		"\r\nIdempotency-Key: a\r\nIdempotency-Key: b\r\nContent-Length: 0\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("two Idempotency-Key headers: %d", res.StatusCode)
	}
	if l := g.list(t, carolKey); l.Total != 0 {
		t.Errorf("bad keys created %d sessions", l.Total)
	}
}

// create2 is create with extra headers.
func (g *testGateway) create2(t testing.TB, token string, hdr ...string) sessionOut {
	t.Helper()
	r := g.do(t, http.MethodPost, "/v1/sessions", token, nil, hdr...)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	return r.session(t)
}

// TestReadyzHidesDetailsWithoutToken: without a token /readyz says only
// ready or not ready; the driver, its limits (the host's uid base among
// them) and the reason it is not ready are for authenticated callers.
func TestReadyzHidesDetailsWithoutToken(t *testing.T) {
	var fail bool
	g := newGateway(t, gwOptions{ready: func() (map[string]any, error) {
		if fail {
			return nil, fmt.Errorf("cgroup /sys/fs/cgroup/sandgate is not writable")
		}
		return map[string]any{"sandbox": "linux", "limits": map[string]any{"uidBase": 1 << 30}}, nil
	}})
	r := g.do(t, http.MethodGet, "/readyz", "", nil)
	expect(t, r, http.StatusOK, "")
	if got := strings.TrimSpace(string(r.body)); got != `{"status":"ready"}` {
		t.Errorf("unauthenticated /readyz = %s", got)
	}
	r = g.do(t, http.MethodGet, "/readyz", aliceKey, nil)
	expect(t, r, http.StatusOK, "")
	if !strings.Contains(string(r.body), "uidBase") || !strings.Contains(string(r.body), `"sandbox":"linux"`) {
		t.Errorf("authenticated /readyz = %s", r.body)
	}
	expect(t, g.do(t, http.MethodGet, "/readyz", "wrong", nil), http.StatusUnauthorized, "unauthorized")

	fail = true
	r = g.do(t, http.MethodGet, "/readyz", "", nil)
	expect(t, r, http.StatusServiceUnavailable, "not_ready")
	if strings.Contains(r.errorMessage(), "cgroup") {
		t.Errorf("unauthenticated not-ready message %q shows the reason", r.errorMessage())
	}
	r = g.do(t, http.MethodGet, "/readyz", aliceKey, nil)
	expect(t, r, http.StatusServiceUnavailable, "not_ready")
	if !strings.Contains(r.errorMessage(), "cgroup") {
		t.Errorf("authenticated not-ready message %q hides the reason", r.errorMessage())
	}
}

// TestCreateRejectsKeyOptionsAndBigMetadata: authorized_keys options are
// refused by name; metadata beyond its bounds is refused naming the bound.
func TestCreateRejectsKeyOptionsAndBigMetadata(t *testing.T) {
	g := newGateway(t, gwOptions{gateway: gateway.Config{MaxSessionsPerTenant: 100}})
	key := g.hostKeys[0]
	deep := `1`
	for range gateway.MaxMetadataDepth {
		deep = `[` + deep + `]`
	}
	cases := []struct {
		body, code string
		mention    []string
	}{
		{`{"sshPublicKey": "command=\"/bin/sh\",from=\"10.1.2.3\" ` + key + `"}`, "invalid_ssh_public_key", []string{"command", "from"}},
		{`{"sshPublicKey": "no-port-forwarding ` + key + `"}`, "invalid_ssh_public_key", []string{"no-port-forwarding"}},
		{`{"metadata": {"a": ` + deep + `}}`, "metadata_too_deep", []string{strconv.Itoa(gateway.MaxMetadataDepth)}},
		{`{"metadata": {` + manyKeys(gateway.MaxMetadataKeys+1) + `}}`, "metadata_too_many_keys", []string{strconv.Itoa(gateway.MaxMetadataKeys)}},
		{`{"metadata": {"a": {` + manyKeys(gateway.MaxMetadataKeys) + `}}}`, "metadata_too_many_keys", []string{strconv.Itoa(gateway.MaxMetadataKeys)}},
		{`{"metadata": {"a": "` + strings.Repeat("x", gateway.MaxMetadataBytes) + `"}}`, "metadata_too_large", []string{strconv.Itoa(gateway.MaxMetadataBytes)}},
	}
	for _, c := range cases {
		r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(c.body))
		expect(t, r, http.StatusBadRequest, c.code)
		for _, m := range c.mention {
			if !strings.Contains(r.errorMessage(), m) {
				t.Errorf("%.80s: message %q does not name %q", c.body, r.errorMessage(), m)
			}
		}
	}
	if n := g.sandboxDirs(t); n != 0 {
		t.Errorf("%d sandboxes", n)
	}
	// At the bounds, accepted and given back as sent.
	md := `{"a": ` + deep[1:len(deep)-1] + `, "b": "` + strings.Repeat("y", 1000) + `"}`
	s := g.create(t, aliceKey, `{"metadata": `+md+`, "sshPublicKey": "`+key+` me@host"}`)
	var want map[string]any
	_ = json.Unmarshal([]byte(md), &want)
	if got, _ := json.Marshal(s.Metadata); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("metadata %s, want %s", got, md)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestAllowMatchesSpec: a 405's Allow lists exactly the operations the
// spec documents for the path (CONNECT, no OpenAPI operation, only where
// there is nothing else: the /sessions/{id} alias), and the spec says so.
// Schemathesis's allow_header_conformance check holds the server to this.
func TestAllowMatchesSpec(t *testing.T) {
	g := newGateway(t, gwOptions{})
	doc := loadSpec(t)
	allowDoc := doc.Components.Responses["MethodNotAllowed"].Value.Headers["Allow"].Value.Description
	if !strings.Contains(allowDoc, "CONNECT") {
		t.Errorf("the spec's Allow header does not say when it lists CONNECT: %q", allowDoc)
	}
	for path, item := range doc.Paths.Map() {
		var want []string
		for m := range item.Operations() {
			want = append(want, m)
		}
		if _, ok := item.Extensions["x-connect"]; ok && len(want) == 0 {
			want = append(want, http.MethodConnect)
		}
		slices.Sort(want)
		token := aliceKey
		if !strings.HasPrefix(path, "/v1/") && path != "/sessions/{id}" {
			token = ""
		}
		// Two methods no path documents, or the first of them a path does not.
		probes := []string{http.MethodOptions, http.MethodPut}
		if slices.Contains(want, http.MethodPut) {
			probes[1] = http.MethodTrace
		}
		for _, method := range probes {
			if slices.Contains(want, method) {
				continue // a path that documents every method (a preview's)
			}
			r := g.do(t, method, strings.ReplaceAll(path, "{id}", "sbx-aaaaaaaaaaaaaaaaaaaa"), token, nil)
			expect(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
			var got []string
			for _, m := range strings.Split(r.header.Get("Allow"), ",") {
				got = append(got, strings.TrimSpace(m))
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s %s: Allow %v, spec documents %v", method, path, got, want)
			}
		}
	}
}

// TestSpecDescribesInputs: the spec states the formats and bounds the
// server enforces.
func TestSpecDescribesInputs(t *testing.T) {
	doc := loadSpec(t)
	req := doc.Components.Schemas["CreateSessionRequest"].Value
	key := req.Properties["sshPublicKey"].Value.Description
	for _, w := range []string{"authorized_keys", "options", "ssh-ed25519", "invalid_ssh_public_key"} {
		if !strings.Contains(key, w) {
			t.Errorf("sshPublicKey's description does not mention %q", w)
		}
	}
	md := req.Properties["metadata"].Value
	for _, w := range []string{strconv.Itoa(gateway.MaxMetadataDepth), strconv.Itoa(gateway.MaxMetadataKeys),
		strconv.Itoa(gateway.MaxMetadataBytes), "metadata_too_deep", "metadata_too_many_keys", "metadata_too_large"} {
		if !strings.Contains(md.Description, w) {
			t.Errorf("metadata's description does not mention %q", w)
		}
	}
	if md.MaxProps == nil || *md.MaxProps != gateway.MaxMetadataKeys {
		t.Errorf("metadata maxProperties = %v, want %d", md.MaxProps, gateway.MaxMetadataKeys)
	}
	var maxLen uint64
	for _, p := range doc.Paths.Value("/v1/sessions").Post.Parameters {
		if p.Value.In == "header" && p.Value.Name == "Idempotency-Key" && p.Value.Schema.Value.MaxLength != nil {
			maxLen = *p.Value.Schema.Value.MaxLength
		}
	}
	if maxLen != gateway.MaxIdempotencyKeyLen {
		t.Errorf("POST /v1/sessions documents no Idempotency-Key of at most %d bytes", gateway.MaxIdempotencyKeyLen)
	}
}
