package envd_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem/filesystemconnect"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process/processconnect"
)

// The tests run the shared test stack (internal/gwtest: the session
// manager over the workdir driver, and rest behind a real http.Server on
// 127.0.0.1:0) with envd mounted at /compat/e2b/sandbox behind a small
// router that resolves the session of E2b-Sandbox-Id for the caller (the
// e2b package's router does that in the product), and talk to it with a
// real Connect client generated from our protos, in JSON as the SDKs do.

func TestMain(m *testing.M) {
	gwtest.Dispatch()
	goleak.VerifyTestMain(m)
}

const (
	aliceKey = "sg_test_alice_9f6c1d7e2b3a4c5d"
	bobKey   = "sg_test_bob_1a2b3c4d5e6f7a8b"
	prefix   = "/compat/e2b/sandbox"
)

// testSealer seals the envVars of the records the tests make.
var testSealer = e2bmeta.NewSealer([]byte("envd-tests-key-0123456789abcdef!"))

type testGateway struct {
	st *gwtest.Stack
}

// newGateway starts a stack with envd mounted; watch bounds the
// watchers, streams (when given) the streaming calls.
func newGateway(t *testing.T, watch envd.WatchBounds, streams ...envd.StreamBounds) *testGateway {
	t.Helper()
	var sb envd.StreamBounds
	if len(streams) > 0 {
		sb = streams[0]
	}
	st := gwtest.Start(t, gwtest.Options{
		Tokens: map[string]string{aliceKey: "alice", bobKey: "bob"},
		Mounts: func(e gwtest.Engines) []rest.Mount {
			srv := envd.New(envd.Deps{Sessions: e.Sessions, Plane: e.Plane, Log: e.Log, Watch: watch, Streams: sb, Sealer: testSealer})
			return []rest.Mount{{Prefix: prefix, Handler: http.StripPrefix(prefix, sandboxRouter(e.Sessions, srv))}}
		},
	})
	return &testGateway{st: st}
}

// sandboxRouter is the e2b router's part the tests need: the session of
// E2b-Sandbox-Id, the caller's (rest authenticated it).
func sandboxRouter(sessions rest.Sessions, srv *envd.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := gateway.PrincipalFrom(r.Context())
		s, err := sessions.Get(r.Context(), p, r.Header.Get("E2b-Sandbox-Id"))
		if err != nil {
			rest.WriteGatewayError(w, err)
			return
		}
		srv.ServeSession(w, r, s, p)
	})
}

// sandbox is one session as a client of its envd sees it.
type sandbox struct {
	id    string
	http  *http.Client
	base  string
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
	token string
}

// headers adds the sandbox's routing and auth headers to every request.
type headers struct {
	base http.RoundTripper
	hdr  map[string]string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// newSandbox creates a session for token and its envd clients.
func (g *testGateway) newSandbox(t *testing.T, token string) *sandbox {
	t.Helper()
	var s struct {
		SessionID string `json:"sessionId"`
	}
	if code := gwtest.DoJSON(t, g.st.URL, token, http.MethodPost, "/v1/sessions", map[string]any{}, &s); code != http.StatusCreated {
		t.Fatalf("create session: %d", code)
	}
	return g.client(t, token, s.SessionID)
}

// client is the envd clients of session id, authenticated with token.
func (g *testGateway) client(t *testing.T, token, id string) *sandbox {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: headers{base: tr, hdr: map[string]string{
		"Authorization": "Bearer " + token, "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983",
	}}}
	base := g.st.URL + prefix
	return &sandbox{
		id: id, http: hc, base: base, token: token,
		proc: processconnect.NewProcessClient(hc, base, connect.WithProtoJSON()),
		fs:   filesystemconnect.NewFilesystemClient(hc, base, connect.WithProtoJSON()),
	}
}

// ctx is a test's context with a generous deadline (the machine is
// loaded: nothing asserts a time).
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// code is err's Connect code (0 for nil).
func code(err error) connect.Code {
	if err == nil {
		return 0
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

// wantCode fails the test unless err has Connect code want.
func wantCode(t *testing.T, err error, want connect.Code) {
	t.Helper()
	if code(err) != want {
		t.Fatalf("error %v (code %v), want code %v", err, code(err), want)
	}
}

// do sends a plain HTTP request to the sandbox URL.
func (sb *sandbox) do(t *testing.T, method, path, contentType string, body io.Reader, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, sb.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := sb.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, string(b)
}

// eventually retries check until it passes or a minute passed.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
