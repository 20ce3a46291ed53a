package compat_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat"
)

// The compat APIs' tests run the shared test stack (internal/gwtest: the
// session manager over the workdir driver, SSH, the tunnel, and rest
// behind a real http.Server on 127.0.0.1:0) with the compat APIs mounted
// on it as cmd/sandgate mounts them. The sandboxes' SFTP server is this
// test binary (gwtest.Dispatch).

func TestMain(m *testing.M) {
	gwtest.Dispatch()
	goleak.VerifyTestMain(m)
}

// API keys of the test gateway's tenants.
const (
	aliceKey = "sg_test_alice_9f6c1d7e2b3a4c5d"
	bobKey   = "sg_test_bob_1a2b3c4d5e6f7a8b"
)

// gwOptions configures a test gateway.
type gwOptions struct {
	// rateLimit is requests per minute per tenant (0: off).
	rateLimit int
	// dataPlane bounds the data plane (rest.Config.DataPlane).
	dataPlane rest.DataPlane
}

type testGateway struct {
	url    string
	mgr    *gateway.Manager
	client *http.Client
	logs   *gwtest.Buffer
}

// result is a response as the tests look at it.
type result struct {
	status int
	header http.Header
	body   []byte
}

func newGateway(t testing.TB, o gwOptions) *testGateway {
	t.Helper()
	st := gwtest.Start(t, gwtest.Options{
		Tokens: map[string]string{aliceKey: "alice", bobKey: "bob"}, RateLimit: o.rateLimit, DataPlane: o.dataPlane,
		Mounts: func(e gwtest.Engines) []rest.Mount {
			return compat.New(compat.Deps{Sessions: e.Sessions, Plane: e.Plane, Links: e.Links, Log: e.Log})
		},
	})
	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &testGateway{url: st.URL, mgr: st.Manager, client: client, logs: st.Log}
}

// filesGateway is the test gateway with rateLimit, its data plane bounded
// by dp.
func filesGateway(t *testing.T, rateLimit int, dp rest.DataPlane) *testGateway {
	t.Helper()
	return newGateway(t, gwOptions{rateLimit: rateLimit, dataPlane: dp})
}

// do sends one request. token "" sends no Authorization header; hdr holds
// extra header name/value pairs.
func (g *testGateway) do(t testing.TB, method, path, token string, body []byte, hdr ...string) result {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := g.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return result{status: res.StatusCode, header: res.Header, body: data}
}

// session is a /v1 session answer, as far as these tests read it.
type session struct {
	SessionID string `json:"sessionId"`
}

func (g *testGateway) create(t testing.TB, token string, body string) session {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	r := g.do(t, http.MethodPost, "/v1/sessions", token, b)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var s session
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatalf("decode session %q: %v", r.body, err)
	}
	return s
}

func (r result) errorCode() string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (r result) errorMessage() string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Message
}

// expect checks a /v1 answer's status and error code (rest's contract
// tests check the same).
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
}
