package e2b_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b"
)

// newGatewayDeps is newGateway with the facade's Deps adjusted by tune.
func newGatewayDeps(t *testing.T, tune func(*e2b.Deps)) *testGateway {
	t.Helper()
	st := gwtest.Start(t, gwtest.Options{
		Tokens: map[string]string{aliceKey: "alice", bobKey: "bob"},
		Mounts: func(e gwtest.Engines) []rest.Mount {
			d := e2b.Deps{Sessions: e.Sessions, Plane: e.Plane, Key: e.Links.Key, Log: e.Log}
			tune(&d)
			return e2b.New(d)
		},
	})
	client := &http.Client{Timeout: 60 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &testGateway{url: st.URL, client: client}
}

// stuckExecute sends an /execute of code on a connection whose client
// never reads the answer (a small receive buffer), and returns the
// connection.
func stuckExecute(t *testing.T, g *testGateway, hdr []string, body string) net.Conn {
	t.Helper()
	addr := strings.TrimPrefix(g.url, "http://")
	d := net.Dialer{Control: nil}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	req := fmt.Sprintf("POST /compat/e2b/sandbox/execute HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", addr, len(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	req += "\r\n" + body
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestExecuteClientStopsReading: a client that stops reading /execute's
// answer does not hold the kernel: the answer fails at the write stall,
// its cell is interrupted, and the next call runs.
func TestExecuteClientStopsReading(t *testing.T) {
	for _, lang := range []string{"python", "bash"} {
		t.Run(lang, func(t *testing.T) {
			g := newGatewayDeps(t, func(d *e2b.Deps) { d.WriteStall = 2 * time.Second })
			sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
			hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
			// 1 MiB of \x01 is 6 MiB of JSON (\u0001): more than the
			// sockets' buffers hold; then the cell waits for ever.
			code := `{"code":"import sys, time\nsys.stdout.write('\\x01' * (1 << 20))\nsys.stdout.flush()\ntime.sleep(3600)"}`
			if lang == "bash" {
				code = `{"language":"bash","code":"head -c 1048576 /dev/zero | tr '\\\\0' '\\\\1'; sleep 3600"}`
			}
			stuckExecute(t, g, hdr, code)
			time.Sleep(time.Second) // the stuck call has the kernel first
			next := map[string]any{"code": "1 + 1"}
			if lang == "bash" {
				next = map[string]any{"code": "echo 2", "language": "bash"}
			}
			done := make(chan answer, 1)
			go func() { done <- g.do(t, "POST", "/compat/e2b/sandbox/execute", next, hdr...) }()
			select {
			case a := <-done:
				ls := lines(t, a)
				if len(ofType(ls, "error")) != 0 || len(ofType(ls, "end_of_execution")) != 1 {
					t.Errorf("the next call: %v", ls)
				}
			case <-time.After(45 * time.Second):
				t.Fatal("a client that stops reading holds the kernel")
			}
		})
	}
}

// TestAutoPauseAfterImplicitResume: an autoPause sandbox that a sandbox
// URL call resumes (here /execute) pauses again at its timeout.
func TestAutoPauseAfterImplicitResume(t *testing.T) {
	g := newGateway(t)
	key := []string{"X-API-Key", aliceKey}
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base", "timeout": 2, "autoPause": true})
	state := func() string {
		return decode[listed](t, g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, key...)).State
	}
	waitState := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for state() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the sandbox is not %s", want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitState("paused")
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "1 + 1"}, hdr...))
	if res := ofType(ls, "result"); len(res) != 1 || res[0]["text"] != "2" {
		t.Fatalf("execute on a paused sandbox: %v", ls)
	}
	waitState("paused")
}

// TestEnvVarsNotShown: a create's envVars reach the sandbox's processes
// but no API returns them: not /v1's GET or list of the session, nor
// E2B's.
func TestEnvVarsNotShown(t *testing.T) {
	g := newGateway(t)
	const secret = "s3cret-value-42"
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base", "envVars": map[string]string{"API_SECRET": secret}})
	bearer := []string{"Authorization", "Bearer " + aliceKey}
	for _, a := range []answer{
		g.do(t, "GET", "/v1/sessions/"+sb.SandboxID, nil, bearer...),
		g.do(t, "GET", "/v1/sessions", nil, bearer...),
		g.do(t, "GET", "/compat/e2b/sandboxes/"+sb.SandboxID, nil, "X-API-Key", aliceKey),
		g.do(t, "GET", "/compat/e2b/v2/sandboxes", nil, "X-API-Key", aliceKey),
	} {
		if a.status != http.StatusOK || strings.Contains(string(a.body), secret) || strings.Contains(string(a.body), "API_SECRET") {
			t.Errorf("%d %s", a.status, a.body)
		}
	}
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "import os\nos.environ['API_SECRET']"}, hdr...))
	if res := ofType(ls, "result"); len(res) != 1 || res[0]["text"] != "'"+secret+"'" {
		t.Errorf("the sandbox's env: %v", ls)
	}
	bash := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "echo $API_SECRET", "language": "bash"}, hdr...))
	if out := ofType(bash, "stdout"); len(out) != 1 || out[0]["text"] != secret+"\n" {
		t.Errorf("bash's env: %v", bash)
	}
}

// TestExecuteEnvVarsConcurrent: concurrent calls to one context each see
// their own env_vars, and none outlives its call.
func TestExecuteEnvVarsConcurrent(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	const n = 4
	got := make(chan string, n)
	for i := range n {
		go func() {
			a := g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{
				"code":     "import os, time\ntime.sleep(0.3)\nos.environ['E2B_C']",
				"env_vars": map[string]string{"E2B_C": fmt.Sprint("v", i)}}, hdr...)
			var text string
			for _, l := range lines(t, a) {
				if l["type"] == "result" {
					text = l["text"].(string)
				}
			}
			if want := fmt.Sprintf("'v%d'", i); text != want {
				text = fmt.Sprintf("call %d saw %s, want %s", i, text, want)
			} else {
				text = ""
			}
			got <- text
		}()
	}
	for range n {
		if e := <-got; e != "" {
			t.Error(e)
		}
	}
	ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "import os\nos.environ.get('E2B_C')"}, hdr...))
	if len(ofType(ls, "result")) != 0 {
		t.Errorf("env_vars outlived their calls: %v", ls)
	}
}

// TestAccessTokenKey: a sandbox's access token is not an HMAC under the
// gateway's raw link key (its own key is derived from it), and it
// differs for two sandboxes of one tenant even knowing tenant and id.
func TestAccessTokenKey(t *testing.T) {
	var key []byte
	g := newGatewayDeps(t, func(d *e2b.Deps) { key = d.Key })
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	m := hmac.New(sha256.New, key)
	m.Write([]byte("e2b-access-token\x00alice\x00" + sb.SandboxID))
	raw := "e2bt_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	if raw == sb.EnvdAccessToken {
		t.Fatal("the access token is an HMAC of tenant and id under the raw link key")
	}
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999"}
	if a := g.do(t, "GET", "/compat/e2b/sandbox/contexts", nil, append(hdr, "X-Access-Token", raw)...); a.status != http.StatusUnauthorized {
		t.Errorf("the raw key's token: %d", a.status)
	}
	if a := g.do(t, "GET", "/compat/e2b/sandbox/contexts", nil, append(hdr, "X-Access-Token", sb.EnvdAccessToken)...); a.status != http.StatusOK {
		t.Errorf("the token: %d", a.status)
	}
	con := decode[sandboxAnswer](t, g.do(t, "POST", "/compat/e2b/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]int{"timeout": 300}, "X-API-Key", aliceKey))
	if con.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("connect handed out another token")
	}
}

// TestExecuteLargeResult: the value of an expression larger than the
// bound comes back cut, as the main result (not a note that it was
// dropped).
func TestExecuteLargeResult(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	ls := lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "'x' * 2_000_000"}, hdr...))
	res := ofType(ls, "result")
	if len(res) != 1 {
		t.Fatalf("results: %d", len(res))
	}
	text, _ := res[0]["text"].(string)
	if res[0]["is_main_result"] != true || !strings.HasPrefix(text, "'xxxx") || len(text) > rest.DefaultCommandOutput || len(text) < rest.DefaultCommandOutput/2 {
		t.Errorf("main result: main %v, %d bytes: %.60q", res[0]["is_main_result"], len(text), text)
	}
}

// TestDeleteDefaultContext: the default contexts cannot be deleted (their
// kernel is /v1's default one): 400, and the kernel keeps its state.
func TestDeleteDefaultContext(t *testing.T) {
	g := newGateway(t)
	sb := g.create(t, aliceKey, map[string]any{"templateID": "base"})
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken}
	lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "kept = 1"}, hdr...))
	for _, id := range []string{"default", "e2b-bash"} {
		wantError(t, id, g.do(t, "DELETE", "/compat/e2b/sandbox/contexts/"+id, nil, hdr...), http.StatusBadRequest, "default_context")
	}
	if res := ofType(lines(t, g.do(t, "POST", "/compat/e2b/sandbox/execute", map[string]any{"code": "kept"}, hdr...)), "result"); len(res) != 1 || res[0]["text"] != "1" {
		t.Errorf("the default kernel after the refused delete: %v", res)
	}
}
