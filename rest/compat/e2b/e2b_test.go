package e2b_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b"
)

// These tests run the shared test stack (internal/gwtest: the session
// manager over the workdir driver and rest behind a real http.Server)
// with the E2B facade mounted as cmd/sandgate mounts it. The real SDKs'
// suite is compat-tests/e2b (make test-e2b).

func TestMain(m *testing.M) {
	gwtest.Dispatch()
	goleak.VerifyTestMain(m)
}

const (
	aliceKey = "sg_test_alice_5e1f0a9b8c7d6e5f"
	bobKey   = "sg_test_bob_0f1e2d3c4b5a6978"
)

type testGateway struct {
	url    string
	client *http.Client
}

func newGateway(t *testing.T, aliases ...string) *testGateway {
	t.Helper()
	st := gwtest.Start(t, gwtest.Options{
		Tokens: map[string]string{aliceKey: "alice", bobKey: "bob"},
		Mounts: func(e gwtest.Engines) []rest.Mount {
			return e2b.New(e2b.Deps{Sessions: e.Sessions, Plane: e.Plane, Key: e.Links.Key, ImageAliases: aliases, Log: e.Log})
		},
	})
	client := &http.Client{Timeout: 60 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &testGateway{url: st.URL, client: client}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request; hdr are header name/value pairs.
func (g *testGateway) do(t *testing.T, method, path string, body any, hdr ...string) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		t.Fatal(err)
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
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: data}
}

func decode[T any](t *testing.T, a answer) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("decode %s: %v", a.body, err)
	}
	return v
}

type sandboxAnswer struct {
	TemplateID         string `json:"templateID"`
	SandboxID          string `json:"sandboxID"`
	EnvdVersion        string `json:"envdVersion"`
	EnvdAccessToken    string `json:"envdAccessToken"`
	TrafficAccessToken string `json:"trafficAccessToken"`
}

type listed struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	State      string            `json:"state"`
	Metadata   map[string]string `json:"metadata"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
}

type e2bError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code"`
}

func (g *testGateway) create(t *testing.T, key string, body map[string]any) sandboxAnswer {
	t.Helper()
	a := g.do(t, "POST", "/compat/e2b/v2/sandboxes", body, "X-API-Key", key)
	if a.status != http.StatusCreated {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	sb := decode[sandboxAnswer](t, a)
	t.Cleanup(func() { g.do(t, "DELETE", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, "X-API-Key", key) })
	return sb
}

// wantError checks an answer is E2B's error shape with status and code.
func wantError(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	e := decode[e2bError](t, a)
	if a.status != status || e.Code != status || e.ErrorCode != code || e.Message == "" {
		t.Errorf("%s: %d %s, want %d %s in E2B's shape", what, a.status, a.body, status, code)
	}
}

// TestSandboxURLAuthentication: a sandbox URL call needs the sandbox's own
// access token (every sandbox gets one, secure or not) or an API key of
// the sandbox's tenant; nothing else reaches it.
func TestSandboxURLAuthentication(t *testing.T) {
	g := newGateway(t)
	a := g.create(t, aliceKey, map[string]any{"templateID": "base", "secure": false})
	b := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	if a.EnvdAccessToken == "" || a.TrafficAccessToken != a.EnvdAccessToken || a.EnvdAccessToken == b.EnvdAccessToken {
		t.Fatalf("tokens: %+v %+v", a, b)
	}
	contexts := func(hdr ...string) answer {
		return g.do(t, "GET", "/compat/e2b/sandbox/contexts", nil, hdr...)
	}
	for _, c := range []struct {
		name   string
		hdr    []string
		status int
	}{
		{"no credential", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999"}, http.StatusUnauthorized},
		{"a made-up token", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", "e2bt_" + strings.Repeat("A", 43)}, http.StatusUnauthorized},
		{"another sandbox's token", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", b.EnvdAccessToken}, http.StatusUnauthorized},
		{"the token, on an unknown sandbox", []string{"E2b-Sandbox-Id", "sbx-unknown", "E2b-Sandbox-Port", "49999", "X-Access-Token", a.EnvdAccessToken}, http.StatusUnauthorized},
		{"another tenant's key", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999", "X-API-Key", bobKey}, http.StatusNotFound},
		{"the token", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", a.EnvdAccessToken}, http.StatusOK},
		{"the traffic token", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999", "E2B-Traffic-Access-Token", a.EnvdAccessToken}, http.StatusOK},
		{"the tenant's key", []string{"E2b-Sandbox-Id", a.SandboxID, "E2b-Sandbox-Port", "49999", "X-API-Key", aliceKey}, http.StatusOK},
	} {
		if got := contexts(c.hdr...); got.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, got.status, got.body, c.status)
		}
	}
	// envd's port gets the same check.
	if got := g.do(t, "GET", "/compat/e2b/sandbox/health", nil, "E2b-Sandbox-Id", a.SandboxID); got.status != http.StatusUnauthorized {
		t.Errorf("envd without a token: %d %s", got.status, got.body)
	}
	tok := []string{"E2b-Sandbox-Id", a.SandboxID, "X-Access-Token", a.EnvdAccessToken}
	wantError(t, "no sandbox id", g.do(t, "GET", "/compat/e2b/sandbox/contexts", nil, "X-API-Key", aliceKey, "E2b-Sandbox-Port", "49999"),
		http.StatusBadRequest, "missing_sandbox_id")
	wantError(t, "another port", g.do(t, "GET", "/compat/e2b/sandbox/", nil, append(tok, "E2b-Sandbox-Port", "8080")...),
		http.StatusNotImplemented, "unsupported_port")
	// A killed sandbox's token opens nothing.
	g.do(t, "DELETE", "/compat/e2b/sandboxes/"+a.SandboxID, nil, "X-API-Key", aliceKey)
	if got := contexts(append(tok, "E2b-Sandbox-Port", "49999")...); got.status != http.StatusUnauthorized {
		t.Errorf("a killed sandbox's token: %d %s", got.status, got.body)
	}
}

// TestControlAPI: create, get, list (metadata, state, pages), timeout,
// pause, connect, kill, as E2B's OpenAPI has them.
func TestControlAPI(t *testing.T) {
	g := newGateway(t)
	key := []string{"X-API-Key", aliceKey}
	sb := g.create(t, aliceKey, map[string]any{"templateID": "code-interpreter-v1", "timeout": 10,
		"metadata": map[string]string{"team": "a"}, "envVars": map[string]string{"X": "1"}})
	if sb.TemplateID != "code-interpreter-v1" || sb.EnvdVersion == "" || !strings.HasPrefix(sb.SandboxID, "sbx-") {
		t.Errorf("create: %+v", sb)
	}
	other := g.create(t, aliceKey, map[string]any{"templateID": "base", "metadata": map[string]string{"team": "b"}})

	got := g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...)
	info := decode[listed](t, got)
	if got.status != http.StatusOK || info.State != "running" || info.Metadata["team"] != "a" || len(info.Metadata) != 1 {
		t.Errorf("get: %d %s", got.status, got.body)
	}
	// A timeout under sandgate's least TTL gets the least (60 s).
	if d := info.EndAt.Sub(info.StartedAt); d < 59*time.Second || d > 61*time.Second {
		t.Errorf("timeout 10 gave %s", d)
	}
	// The session is a native one: /v1 shows it, with its labels.
	v1 := g.do(t, "GET", "/v1/sessions/"+sb.SandboxID, nil, "Authorization", "Bearer "+aliceKey)
	if v1.status != http.StatusOK || !strings.Contains(string(v1.body), `"team":"a"`) {
		t.Errorf("/v1: %d %s", v1.status, v1.body)
	}

	list := func(query string) ([]listed, string) {
		a := g.do(t, "GET", "/compat/e2b/v2/sandboxes"+query, nil, key...)
		if a.status != http.StatusOK {
			t.Fatalf("list %s: %d %s", query, a.status, a.body)
		}
		return decode[[]listed](t, a), a.header.Get("X-Next-Token")
	}
	ids := func(ls []listed) (out []string) {
		for _, l := range ls {
			out = append(out, l.SandboxID)
		}
		return out
	}
	if ls, next := list("?metadata=team%3Da"); len(ls) != 1 || ls[0].SandboxID != sb.SandboxID || next != "" {
		t.Errorf("metadata filter: %v %q", ids(ls), next)
	}
	page1, next := list("?limit=1")
	page2, last := list("?limit=1&nextToken=" + next)
	if len(page1) != 1 || len(page2) != 1 || next == "" || last != "" || page1[0].SandboxID == page2[0].SandboxID {
		t.Errorf("pages: %v %q %v %q", ids(page1), next, ids(page2), last)
	}
	d1, dnext := list("?limit=1&order=desc")
	d2, _ := list("?limit=1&order=desc&nextToken=" + dnext)
	if len(d1) != 1 || len(d2) != 1 || d1[0].SandboxID != page2[0].SandboxID || d2[0].SandboxID != page1[0].SandboxID {
		t.Errorf("pages newest first: %v %v", ids(d1), ids(d2))
	}
	if a := g.do(t, "GET", "/compat/e2b/v2/sandboxes?nextToken=bm90LWEtY3Vyc29y", nil, key...); a.status != http.StatusBadRequest {
		t.Errorf("a made-up nextToken: %d %s", a.status, a.body)
	}
	if ls, _ := list(""); len(ls) != 2 {
		t.Errorf("bob's list would be empty, alice's has both: %v", ids(ls))
	}
	if ls := decode[[]listed](t, g.do(t, "GET", "/compat/e2b/v2/sandboxes", nil, "X-API-Key", bobKey)); len(ls) != 0 {
		t.Errorf("bob sees %v", ids(ls))
	}
	wantError(t, "bob's kill", g.do(t, "DELETE", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, "X-API-Key", bobKey),
		http.StatusNotFound, "not_found")

	if a := g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/timeout", map[string]int{"timeout": 900}, key...); a.status != http.StatusNoContent {
		t.Errorf("timeout: %d %s", a.status, a.body)
	}
	info = decode[listed](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...))
	if d := time.Until(info.EndAt); d < 800*time.Second || d > 901*time.Second {
		t.Errorf("after timeout 900: ends in %s", d)
	}

	if a := g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/pause", map[string]any{}, key...); a.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", a.status, a.body)
	}
	wantError(t, "pause again", g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/pause", nil, key...), http.StatusConflict, "already_paused")
	if ls, _ := list("?state=paused"); len(ls) != 1 || ls[0].SandboxID != sb.SandboxID || ls[0].State != "paused" {
		t.Errorf("paused list: %+v", ls)
	}
	if ls := decode[[]listed](t, g.do(t, "GET", "/compat/e2b/sandboxes", nil, key...)); len(ls) != 1 || ls[0].SandboxID != other.SandboxID {
		t.Errorf("the v1 list shows running sandboxes only: %v", ids(ls))
	}
	con := g.do(t, "POST", "/compat/e2b/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]int{"timeout": 300}, key...)
	if con.status != http.StatusCreated || decode[sandboxAnswer](t, con).EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("connect to a paused sandbox: %d %s", con.status, con.body)
	}
	if st := decode[listed](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...)).State; st != "running" {
		t.Errorf("after connect: %s", st)
	}
	if con := g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/connect", map[string]int{"timeout": 300}, key...); con.status != http.StatusOK {
		t.Errorf("connect to a running sandbox: %d %s", con.status, con.body)
	}
	wantError(t, "resume a running one", g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/resume", map[string]any{}, key...),
		http.StatusConflict, "already_running")

	if a := g.do(t, "DELETE", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...); a.status != http.StatusNoContent {
		t.Errorf("kill: %d %s", a.status, a.body)
	}
	wantError(t, "kill again", g.do(t, "DELETE", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...), http.StatusNotFound, "not_found")
	wantError(t, "get a killed one", g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...), http.StatusNotFound, "not_found")
}

// TestCreateRefusalsAndUnmapped: what has no mapping is refused, in E2B's
// error shape; without a key nothing is served.
func TestCreateRefusalsAndUnmapped(t *testing.T) {
	g := newGateway(t)
	key := []string{"X-API-Key", aliceKey}
	for _, c := range []struct {
		name string
		body map[string]any
		code string
	}{
		{"no template", map[string]any{}, "invalid_template"},
		{"mcp", map[string]any{"templateID": "base", "mcp": map[string]any{"x": map[string]string{}}}, "unsupported"},
		{"volumes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]string{"name": "v", "path": "/v"}}}, "unsupported"},
		{"our metadata key", map[string]any{"templateID": "base", "metadata": map[string]string{"_e2b": "x"}}, "invalid_metadata"},
		{"a bad variable", map[string]any{"templateID": "base", "envVars": map[string]string{"A=B": "x"}}, "invalid_env"},
		{"an egress proxy", map[string]any{"templateID": "base", "network": map[string]any{"egressProxy": map[string]string{"address": "x"}}}, "invalid_network"},
		{"a negative timeout", map[string]any{"templateID": "base", "timeout": -1}, "invalid_timeout"},
	} {
		wantError(t, c.name, g.do(t, "POST", "/compat/e2b/v2/sandboxes", c.body, key...), http.StatusBadRequest, c.code)
	}
	wantError(t, "not JSON", g.do(t, "POST", "/compat/e2b/sandboxes", "[", key...), http.StatusBadRequest, "invalid_json")
	for _, p := range []string{"/compat/e2b/templates", "/compat/e2b/v3/templates", "/compat/e2b/sandboxes/x/fork", "/compat/e2b/volumes", "/compat/e2b/secrets"} {
		wantError(t, p, g.do(t, "POST", p, map[string]any{}, key...), http.StatusNotImplemented, "unsupported")
	}
	if a := g.do(t, "GET", "/compat/e2b/v2/sandboxes", nil); a.status != http.StatusUnauthorized {
		t.Errorf("no key: %d %s", a.status, a.body)
	}
	if a := g.do(t, "GET", "/compat/e2b/v2/sandboxes", nil, "X-API-Key", "wrong"); a.status != http.StatusUnauthorized {
		t.Errorf("a wrong key: %d %s", a.status, a.body)
	}
}

// TestTemplateAliases: a template --image-alias names is that image; any
// other is the default image.
func TestTemplateAliases(t *testing.T) {
	g := newGateway(t, "my-template")
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	v1 := g.do(t, "GET", "/v1/sessions/"+sb.SandboxID, nil, "Authorization", "Bearer "+aliceKey)
	if !strings.Contains(string(v1.body), `"image":"default"`) && !strings.Contains(string(v1.body), `"image":""`) {
		t.Errorf("base: %s", v1.body)
	}
	// The stack's image source knows no my-template: the create asks for it
	// (and is refused by the image source), rather than the default.
	a := g.do(t, "POST", "/compat/e2b/v2/sandboxes", map[string]any{"templateID": "my-template"}, "X-API-Key", aliceKey)
	if a.status == http.StatusCreated {
		s := decode[sandboxAnswer](t, a)
		g.do(t, "DELETE", "/compat/e2b/sandboxes/"+s.SandboxID, nil, "X-API-Key", aliceKey)
		v1 := g.do(t, "GET", "/v1/sessions/"+s.SandboxID, nil, "Authorization", "Bearer "+aliceKey)
		t.Errorf("an aliased template got the default image: %s", v1.body)
	}
}

// lines is an /execute answer's JSON lines.
func lines(t *testing.T, a answer) []map[string]any {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("execute: %d %s", a.status, a.body)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(a.body))
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func ofType(ls []map[string]any, typ string) (out []map[string]any) {
	for _, l := range ls {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// TestCodeInterpreter: /execute streams stdout, results (with the MIME
// types of the display hooks) and errors; contexts are kernels and shells.
func TestCodeInterpreter(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "code-interpreter-v1"})
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	exec := func(body map[string]any) []map[string]any {
		return lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", body, hdr...))
	}
	if ls := exec(map[string]any{"code": "x = 1"}); len(ofType(ls, "result")) != 0 || len(ofType(ls, "error")) != 0 {
		t.Errorf("x = 1: %v", ls)
	}
	ls := exec(map[string]any{"code": "print('hi')\nx + 1"})
	res := ofType(ls, "result")
	if len(res) != 1 || res[0]["text"] != "2" || res[0]["is_main_result"] != true {
		t.Errorf("x + 1: %v", ls)
	}
	// Output streams as the kernel hands it over: "hi\n" may come as one
	// message or as several (print writes "hi", then "\n").
	var stdout string
	for _, o := range ofType(ls, "stdout") {
		text, _ := o["text"].(string)
		stdout += text
		if o["timestamp"] == nil {
			t.Errorf("stdout without a timestamp: %v", ls)
		}
	}
	if stdout != "hi\n" {
		t.Errorf("stdout %q: %v", stdout, ls)
	}
	ls = exec(map[string]any{"code": "class R:\n    def _repr_html_(self): return '<i>r</i>'\n    def _repr_svg_(self): return '<svg/>'\nR()"})
	if res := ofType(ls, "result"); len(res) != 1 || res[0]["html"] != "<i>r</i>" || res[0]["svg"] != "<svg/>" {
		t.Errorf("rich: %v", ls)
	}
	ls = exec(map[string]any{"code": "class P:\n    def _repr_mimebundle_(self): return {'application/x-custom': 'c', 'image/png': '" +
		base64.StdEncoding.EncodeToString([]byte("png")) + "'}\ndisplay(P())"})
	if res := ofType(ls, "result"); len(res) != 1 || res[0]["is_main_result"] != false || res[0]["png"] == nil ||
		res[0]["extra"].(map[string]any)["application/x-custom"] != "c" {
		t.Errorf("display: %v", ls)
	}
	ls = exec(map[string]any{"code": "def f():\n    raise ValueError('bad')\nf()"})
	errs := ofType(ls, "error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "bad" ||
		!strings.Contains(errs[0]["traceback"].(string), "raise ValueError('bad')") {
		t.Errorf("error: %v", ls)
	}
	ls = exec(map[string]any{"code": "import os\nos.environ['E2B_T']", "env_vars": map[string]string{"E2B_T": "v"}})
	if res := ofType(ls, "result"); len(res) != 1 || res[0]["text"] != "'v'" {
		t.Errorf("env_vars: %v", ls)
	}
	if ls := exec(map[string]any{"code": "import os\nos.environ.get('E2B_T')"}); len(ofType(ls, "result")) != 0 {
		t.Errorf("env_vars outlived their call: %v", ls)
	}
	ls = exec(map[string]any{"code": "echo one; echo two >&2; exit 4", "language": "bash"})
	if out, e := ofType(ls, "stdout"), ofType(ls, "error"); len(out) != 1 || out[0]["text"] != "one\n" || len(e) != 1 || e[0]["value"] != "exit status 4" {
		t.Errorf("bash: %v", ls)
	}
	wantError(t, "js", g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "1", "language": "js"}, hdr...),
		http.StatusBadRequest, "unsupported_language")

	// A context is a kernel of its own, in its cwd.
	c := g.do(t, "POST", "/compat/e2b/sandbox/contexts", map[string]any{"language": "python", "cwd": "/tmp"}, hdr...)
	ctx := decode[struct{ ID, Language, Cwd string }](t, c)
	if c.status != http.StatusOK || ctx.Language != "python" || ctx.Cwd != "/tmp" {
		t.Fatalf("context: %d %s", c.status, c.body)
	}
	if res := ofType(exec(map[string]any{"code": "import os\nos.getcwd()", "context_id": ctx.ID}), "result"); len(res) != 1 || res[0]["text"] != "'/tmp'" {
		t.Errorf("context cwd: %v", res)
	}
	if e := ofType(exec(map[string]any{"code": "x", "context_id": ctx.ID}), "error"); len(e) != 1 || e[0]["name"] != "NameError" {
		t.Errorf("the context shares the default kernel's state: %v", e)
	}
	if cs := decode[[]struct{ ID string }](t, g.do(t, "GET", "/compat/e2b/sandbox/contexts", nil, hdr...)); len(cs) != 3 {
		t.Errorf("contexts: %v", cs)
	}
	wantError(t, "a bad cwd", g.do(t, "POST", "/compat/e2b/sandbox/contexts", map[string]any{"cwd": "/no/such/dir"}, hdr...),
		http.StatusBadRequest, "invalid_cwd")
	if a := g.do(t, "DELETE", "/compat/e2b/sandbox/contexts/"+ctx.ID, nil, hdr...); a.status != http.StatusNoContent {
		t.Errorf("delete context: %d %s", a.status, a.body)
	}
	wantError(t, "a deleted context", g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "1", "context_id": ctx.ID}, hdr...),
		http.StatusNotFound, "context_not_found")
	if a := g.do(t, "POST", "/compat/e2b/sandbox/contexts/default/restart", nil, hdr...); a.status != http.StatusNoContent {
		t.Errorf("restart: %d %s", a.status, a.body)
	}
	if e := ofType(exec(map[string]any{"code": "x"}), "error"); len(e) != 1 || e[0]["name"] != "NameError" {
		t.Errorf("after restart: %v", e)
	}

	// A sandbox has at most 7 contexts besides the defaults; a pause
	// forgets them (their kernels died with its processes).
	for i := range 8 {
		c := g.do(t, "POST", "/compat/e2b/sandbox/contexts", map[string]any{"language": "bash"}, hdr...)
		if i < 7 && c.status != http.StatusOK {
			t.Fatalf("context %d: %d %s", i, c.status, c.body)
		}
		if i == 7 {
			wantError(t, "an eighth context", c, http.StatusTooManyRequests, "too_many_contexts")
		}
	}
	key := []string{"X-API-Key", aliceKey}
	g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/pause", nil, key...)
	g.do(t, "POST", "/compat/e2b/sandboxes/"+sb.SandboxID+"/connect", map[string]int{"timeout": 300}, key...)
	if cs := decode[[]struct{ ID string }](t, g.do(t, "GET", "/compat/e2b/sandbox/contexts", nil, hdr...)); len(cs) != 2 {
		t.Errorf("contexts after a pause: %v", cs)
	}
}

// TestExecuteCutsStreams: an execution's stdout is forwarded up to the
// bound, then one line says it was cut.
func TestExecuteCutsStreams(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "import sys\nfor _ in range(40):\n    sys.stdout.write('x' * 65536)\nsys.stdout.flush()"}, hdr...))
	n := 0
	for _, l := range ofType(ls, "stdout") {
		n += len(l["text"].(string))
	}
	notes := 0
	for _, l := range ofType(ls, "stderr") {
		if strings.Contains(l["text"].(string), "stdout cut at") {
			notes++
		}
	}
	if n != rest.DefaultCommandOutput || notes != 1 {
		t.Errorf("forwarded %d bytes of stdout with %d notes, want %d and 1", n, notes, rest.DefaultCommandOutput)
	}
}

// TestExecuteKernelRefused: the answer starts at once (200, as E2B's
// server does); a kernel that cannot run the code ends it with an error
// line named by sandgate's code.
func TestExecuteKernelRefused(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	for i := range 8 { // /v1 kernels fill the session's eight
		a := g.do(t, "POST", "/v1/sessions/"+sb.SandboxID+"/python", map[string]any{"code": "1", "kernel": "k" + string(rune('0'+i))},
			"Authorization", "Bearer "+aliceKey)
		if a.status != http.StatusOK {
			t.Fatalf("/v1 kernel %d: %d %s", i, a.status, a.body)
		}
	}
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "1"}, hdr...))
	if e := ofType(ls, "error"); len(e) != 1 || e[0]["name"] != "too_many_kernels" || len(ofType(ls, "end_of_execution")) != 1 {
		t.Errorf("a ninth kernel: %v", ls)
	}
}

// TestInterpreterCreateEnv: the create's envVars hold in the code
// interpreter's kernels and shells too, under a call's own env_vars, and
// again after a restart.
func TestInterpreterCreateEnv(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "code-interpreter-v1", "envVars": map[string]string{"E2B_A": "create", "E2B_B": "create"}})
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	text := func(body map[string]any) string {
		ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", body, hdr...))
		if res := ofType(ls, "result"); len(res) == 1 {
			return res[0]["text"].(string)
		}
		var out string
		for _, l := range ofType(ls, "stdout") {
			out += l["text"].(string)
		}
		return out
	}
	if got := text(map[string]any{"code": "import os\n(os.environ['E2B_A'], os.environ['E2B_B'])", "env_vars": map[string]string{"E2B_B": "call"}}); got != "('create', 'call')" {
		t.Errorf("python: %s", got)
	}
	if got := text(map[string]any{"code": "echo $E2B_A $E2B_B", "language": "bash", "env_vars": map[string]string{"E2B_B": "call"}}); got != "create call\n" {
		t.Errorf("bash: %q", got)
	}
	g.do(t, "POST", "/compat/e2b/sandbox/contexts/default/restart", nil, hdr...)
	if got := text(map[string]any{"code": "import os\nos.environ['E2B_A']"}); got != "'create'" {
		t.Errorf("after a restart: %s", got)
	}
}

// TestAutoPause: a sandbox created with autoPause pauses at its timeout,
// keeping its files, instead of ending; setting the timeout again moves
// the pause; connecting starts it again.
func TestAutoPause(t *testing.T) {
	g := newGateway(t)
	key := []string{"X-API-Key", aliceKey}
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base", "timeout": 2, "autoPause": true})
	info := decode[struct {
		listed
		Lifecycle struct{ OnTimeout string } `json:"lifecycle"`
	}](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...))
	if info.Lifecycle.OnTimeout != "pause" || time.Until(info.EndAt) > 3*time.Second {
		t.Errorf("autoPause sandbox: %+v", info)
	}
	// The session's TTL is the longest: it is the pause that comes first.
	v1 := decode[struct{ TTL int }](t, g.do(t, "GET", "/v1/sessions/"+sb.SandboxID, nil, "Authorization", "Bearer "+aliceKey))
	if v1.TTL != 28800 {
		t.Errorf("ttl %d", v1.TTL)
	}
	state := func() string {
		return decode[listed](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...)).State
	}
	deadline := time.Now().Add(30 * time.Second)
	for state() != "paused" {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not pause at its timeout")
		}
		time.Sleep(100 * time.Millisecond)
	}
	con := g.do(t, "POST", "/compat/e2b/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]int{"timeout": 600}, key...)
	if con.status != http.StatusCreated || state() != "running" {
		t.Fatalf("connect: %d %s, %s", con.status, con.body, state())
	}
	if end := decode[listed](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...)).EndAt; time.Until(end) < 500*time.Second {
		t.Errorf("after connect with timeout 600: pauses at %v", end)
	}
	// A sandbox without autoPause ends at its timeout: lifecycle says so.
	plain := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	pi := decode[struct {
		Lifecycle struct{ OnTimeout string } `json:"lifecycle"`
	}](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+plain.SandboxID, nil, key...))
	if pi.Lifecycle.OnTimeout != "kill" {
		t.Errorf("plain: %+v", pi)
	}
}

// TestNetworkAndMetrics: PUT /network maps onto the egress allow-list
// (this stack has no egress proxy: the manager's refusal comes back in
// E2B's shape; compat-tests/e2b updates one on the real binary), and GET
// /metrics samples the sandbox's use.
func TestNetworkAndMetrics(t *testing.T) {
	g := newGateway(t)
	key := []string{"X-API-Key", aliceKey}
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	wantError(t, "allowOut without an egress proxy", g.do(t, "PUT", "/compat/e2b/sandboxes/"+sb.SandboxID+"/network",
		map[string]any{"allowOut": []string{"example.com"}}, key...), http.StatusBadRequest, "egress_unavailable")
	if a := g.do(t, "PUT", "/compat/e2b/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allowInternetAccess": false}, key...); a.status != http.StatusNoContent {
		t.Errorf("no network: %d %s", a.status, a.body)
	}
	wantError(t, "rules", g.do(t, "PUT", "/compat/e2b/sandboxes/"+sb.SandboxID+"/network", map[string]any{"rules": map[string]any{"a.example": map[string]any{}}}, key...),
		http.StatusBadRequest, "invalid_network")

	a := g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID+"/metrics", nil, key...)
	ms := decode[[]struct {
		CPUCount   int     `json:"cpuCount"`
		CPUUsedPct float64 `json:"cpuUsedPct"`
		Timestamp  time.Time
	}](t, a)
	if a.status != http.StatusOK || len(ms) != 1 || ms[0].CPUCount < 1 || time.Since(ms[0].Timestamp) > time.Minute {
		t.Errorf("metrics: %d %s", a.status, a.body)
	}
	wantError(t, "bob's metrics", g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID+"/metrics", nil, "X-API-Key", bobKey), http.StatusNotFound, "not_found")
}
