package envd_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
)

// sdkPython is a Python with the e2b SDK: $E2B_PYTHON, else the repo's
// .venv-e2b (make test-e2b makes it, with requirements-e2b.txt's pinned
// e2b). The test skips without one locally and fails under CI=true.
func sdkPython(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("E2B_PYTHON")}
	if root, err := filepath.Abs("../../../.."); err == nil {
		candidates = append(candidates, filepath.Join(root, ".venv-e2b", "bin", "python"))
	}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		if err := exec.Command(p, "-c", "import e2b").Run(); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("a Python with the e2b SDK is required in CI (make test-e2b makes .venv-e2b)")
	}
	t.Skip("no Python with the e2b SDK (set E2B_PYTHON or make .venv-e2b)")
	return ""
}

// accessToken is the test's stand-in for the e2b router's check of
// X-Access-Token: here the token is an API key, made the request's
// bearer token, in place of the Basic username envd's SDKs send.
func accessToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+r.Header.Get("X-Access-Token"))
		next.ServeHTTP(w, r)
	})
}

// TestSDKFlows runs the e2b Python SDK's own in-sandbox calls (commands,
// files, watch, pty; sync and async) against envd.
func TestSDKFlows(t *testing.T) {
	py := sdkPython(t)
	st := gwtest.Start(t, gwtest.Options{
		Tokens: map[string]string{aliceKey: "alice"},
		Mounts: func(e gwtest.Engines) []rest.Mount {
			srv := envd.New(envd.Deps{Sessions: e.Sessions, Plane: e.Plane, Log: e.Log})
			return []rest.Mount{{Prefix: prefix, Before: accessToken, Handler: http.StripPrefix(prefix, sandboxRouter(e.Sessions, srv))}}
		},
	})
	g := &testGateway{st: st}
	sb := g.newSandbox(t, aliceKey)

	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, py, "testdata/sdk_flows.py")
	cmd.Env = append(gwtest.CleanEnv(),
		"E2B_SANDBOX_URL="+st.URL+prefix, "SANDBOX_ID="+sb.id, "SANDBOX_TOKEN="+aliceKey,
		"ENVD_VERSION="+envd.Version, "E2B_API_KEY=unused")
	out, err := cmd.CombinedOutput()
	t.Logf("sdk_flows.py:\n%s", out)
	if err != nil || !strings.Contains(string(out), "all flows passed") {
		t.Fatalf("sdk_flows.py: %v", err)
	}
}
