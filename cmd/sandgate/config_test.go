package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serve --config: a YAML file of settings named as the flags; the
// command line, then the SANDGATE_* twins, win over it; --print-config
// shows the result with secrets masked, in a form --config reads back;
// a gateway started from the file alone uses its settings.
func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sandgate.yaml")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(path, `# settings
listen: 127.0.0.1:0
sandbox: workdir
keep-sandboxes-on-exit: false
max-sessions: 1
max-sessions-per-tenant: 7
idle-timeout: 45m
rate-limit: 100
api-key: [team-a:config-key-canary, second-key-canary]
metrics-token: metrics-token-canary
egress-allow:
  - "*.example.com"
  - pypi.org
`)
	env := append(cleanEnv(), "HOME="+dir, "SANDGATE_RATE_LIMIT=200", "SANDGATE_IDLE_TIMEOUT=50m")
	out, errOut, code := runClient(t, env, nil, sandgateBin, "serve", "--config", path, "--idle-timeout", "5m", "--print-config")
	if code != 0 || errOut != "" {
		t.Fatalf("--print-config: exit %d %s", code, errOut)
	}
	for _, want := range []string{
		"\nmax-sessions: 1\n", "\nmax-sessions-per-tenant: 7\n", // the file
		"\nrate-limit: 200\n",    // the environment over the file
		"\nidle-timeout: 5m0s\n", // the flag over both
		"\nlisten: 127.0.0.1:0\n", "\negress-allow: ['*.example.com', pypi.org]\n",
		"\napi-key: ['team-a:********', '********']\n", "\nmetrics-token: '********'\n",
		"\nmax-waiting-conns: 1024\n", // a default
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "canary") || strings.Contains(out, "\nconfig:") || strings.Contains(out, "print-config:") {
		t.Errorf("--print-config shows a secret or itself:\n%s", out)
	}
	// What it prints is a configuration file: read back, it prints the same.
	printed := filepath.Join(dir, "printed.yaml")
	write(printed, out)
	again, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--config", printed, "--print-config")
	if code != 0 || again != out {
		t.Errorf("--print-config of its own output: exit %d %s\n%s", code, errOut, again)
	}
	// An environment twin names the file too.
	if out, _, code := runClient(t, append(cleanEnv(), "SANDGATE_CONFIG="+path), nil, sandgateBin, "serve", "--print-config"); code != 0 || !strings.Contains(out, "\nmax-sessions-per-tenant: 7\n") {
		t.Errorf("SANDGATE_CONFIG: exit %d\n%s", code, out)
	}

	// Mistakes: the error, naming the file and line, then one --help line.
	for _, tc := range []struct{ body, want string }{
		{"max-sesions: 3\n", `sandgate.yaml:1: unknown key "max-sesions"`},
		{"listen: x\nmax-sessions: many\n", "sandgate.yaml:2: max-sessions"},
		{"- listen\n", "want a mapping"},
		{"config: other.yaml\n", `unknown key "config"`},
		{"api-key:\n  a: b\n", "want a value or a list"},
	} {
		bad := filepath.Join(dir, "bad", "sandgate.yaml")
		os.MkdirAll(filepath.Dir(bad), 0o700)
		write(bad, tc.body)
		_, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--config", bad)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || len(lines) != 2 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("config %q: exit %d %q, want %q", tc.body, code, errOut, tc.want)
		}
	}
	if _, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--config", filepath.Join(dir, "missing.yaml")); code != 2 || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("missing config file: exit %d %q", code, errOut)
	}

	// A gateway from the file alone: its key works, its bound holds.
	g := &gatewayProc{DataDir: t.TempDir(), Token: "second-key-canary"}
	g.start(t, []string{"serve", "--config", path, "--data-dir", g.DataDir})
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, nil); code != http.StatusCreated {
		t.Fatalf("create with the file's key: %d\n%s", code, g.stderr.String())
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, nil); code == http.StatusCreated {
		t.Errorf("a second session past the file's max-sessions: 1 was created")
	}
}

// serve --config FILE.toml: the same keys in TOML, the same precedence
// (flag, then SANDGATE_* twin, then the file), the same --print-config;
// mistakes name the file and line; a gateway runs from the file alone.
func TestServeConfigFileTOML(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sandgate.toml")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(path, `# settings
listen = "127.0.0.1:0"
sandbox = "workdir"
keep-sandboxes-on-exit = false
max-sessions = 1
"max-sessions-per-tenant" = 7
idle-timeout = "45m"
rate-limit = 100
api-key = ["team-a:config-key-canary", "second-key-canary"]
metrics-token = "metrics-token-canary"
egress-allow = [
  "*.example.com",
  "pypi.org",
]
`)
	env := append(cleanEnv(), "HOME="+dir, "SANDGATE_RATE_LIMIT=200", "SANDGATE_IDLE_TIMEOUT=50m")
	out, errOut, code := runClient(t, env, nil, sandgateBin, "serve", "--config", path, "--idle-timeout", "5m", "--print-config")
	if code != 0 || errOut != "" {
		t.Fatalf("--print-config: exit %d %s", code, errOut)
	}
	for _, want := range []string{
		"\nmax-sessions: 1\n", "\nmax-sessions-per-tenant: 7\n", "\nkeep-sandboxes-on-exit: false\n", // the file
		"\nrate-limit: 200\n",    // the environment over the file
		"\nidle-timeout: 5m0s\n", // the flag over both
		"\nlisten: 127.0.0.1:0\n", "\negress-allow: ['*.example.com', pypi.org]\n",
		"\napi-key: ['team-a:********', '********']\n", "\nmetrics-token: '********'\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "canary") {
		t.Errorf("--print-config shows a secret:\n%s", out)
	}
	// The YAML twin of the file gives the same settings.
	yml := filepath.Join(dir, "same.yaml")
	write(yml, "listen: 127.0.0.1:0\nsandbox: workdir\nkeep-sandboxes-on-exit: false\nmax-sessions: 1\nmax-sessions-per-tenant: 7\nidle-timeout: 45m\nrate-limit: 100\napi-key: [team-a:config-key-canary, second-key-canary]\nmetrics-token: metrics-token-canary\negress-allow: ['*.example.com', pypi.org]\n")
	fromTOML, _, _ := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--config", path, "--print-config")
	fromYAML, _, _ := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--config", yml, "--print-config")
	if fromTOML != fromYAML || fromTOML == "" {
		t.Errorf("TOML and YAML of the same settings differ:\n%s\n---\n%s", fromTOML, fromYAML)
	}

	for _, tc := range []struct{ body, want string }{
		{"max-sesions = 3\n", `sandgate.toml:1: unknown key "max-sesions"`},
		{"listen = \"x\"\nmax-sessions = \"many\"\n", "sandgate.toml:2: max-sessions"},
		{"listen = \"x\"\nlisten = \"y\"\n", "sandgate.toml:2"},
		{"max-sessions = \n", "sandgate.toml:1"},
		{"[api-key]\na = \"b\"\n", "want a value or a list"},
		{"api-key = [[\"a\"]]\n", "each a scalar"},
		{"config = \"other.toml\"\n", `unknown key "config"`},
	} {
		bad := filepath.Join(dir, "bad", "sandgate.toml")
		os.MkdirAll(filepath.Dir(bad), 0o700)
		write(bad, tc.body)
		_, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--config", bad)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || len(lines) != 2 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("config %q: exit %d %q, want %q", tc.body, code, errOut, tc.want)
		}
	}

	// A gateway from the file alone: its key works, its bound holds.
	g := &gatewayProc{DataDir: t.TempDir(), Token: "second-key-canary"}
	g.start(t, []string{"serve", "--config", path, "--data-dir", g.DataDir})
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, nil); code != http.StatusCreated {
		t.Fatalf("create with the file's key: %d\n%s", code, g.stderr.String())
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, nil); code == http.StatusCreated {
		t.Errorf("a second session past the file's max-sessions: 1 was created")
	}
}
