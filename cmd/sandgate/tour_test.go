package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tourSubstitutions are the README tour's lines that cannot run as they
// are in a test, each with what runs instead. Every other line of the
// block runs verbatim; a line listed here that the README no longer has
// fails the test, so the list cannot silently drift either.
var tourSubstitutions = map[string]string{
	// The test installs the binary under test first (make install BIN=…
	// PREFIX=…, the same target), as root, before it becomes the user.
	"make build && sudo make install # sandgate on PATH: /usr/local/bin (PREFIX=...); or use ./bin/sandgate": ": installed by the test",
	// Its key line goes to a file the next line reads (SANDGATE_LISTEN
	// picks a free port: the default 8080 may be taken on a CI host).
	"sandgate serve &                # no configuration needed; prints: export SANDBOX_API_TOKEN=...": `sandgate serve >serve.log 2>&1 & SERVE_PID=$!
for _ in $(seq 600); do grep -q '^export SANDBOX_API_TOKEN=' serve.log && break; sleep 0.1; done`,
	"export SANDBOX_API_TOKEN=...    # paste the line it printed (the key is kept in the data dir)": `eval "$(grep -m1 '^export SANDBOX_API_TOKEN=' serve.log)"
for _ in $(seq 600); do curl -sf "http://$SANDGATE_LISTEN/readyz" >/dev/null && break; sleep 0.1; done`,
	"export SANDBOX_API_URL=http://127.0.0.1:8080": `export SANDBOX_API_URL=http://$SANDGATE_LISTEN`,
	// The id the curl above printed: the one session left.
	"ID=sbx-…": `ID=$(sandgate session ls --json | python3 -c 'import json,sys; s=json.load(sys.stdin); assert len(s)==1, s; print(s[0]["sessionId"])')`,
}

// readmeBlock is the first fenced block of language lang under heading in
// the Markdown file path.
func readmeBlock(t *testing.T, path, heading, lang string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := "\n" + string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s has no %q section", path, heading)
	}
	s = s[i:]
	fence := "\n```" + lang + "\n"
	start := strings.Index(s, fence)
	if start < 0 {
		t.Fatalf("%s: %q has no ```%s block", path, heading, lang)
	}
	s = s[start+len(fence):]
	end := strings.Index(s, "\n```")
	if end < 0 {
		t.Fatalf("%s: the block under %q does not end", path, heading)
	}
	return s[:end]
}

// readmeTour is the shell block under "## A 60-second tour" in README.md.
func readmeTour(t *testing.T) []string {
	return strings.Split(readmeBlock(t, "../../README.md", "## A 60-second tour", "sh"), "\n")
}

// pythonSDKInstall is the Python SDK README's install line; the tour runs
// it (in a virtualenv of the user's: Debian's python3 refuses pip
// installs) on a copy of sdk-python/, then the README's example.
const pythonSDKInstall = "pip install ./sdk-python          # from a checkout of the sandgate repository"

// tsSDKInstall is the TypeScript SDK README's install line.
const tsSDKInstall = "cd sdk-typescript && npm ci && npm run build     # from a checkout of the sandgate repository"

// tsExampleScript builds the TypeScript SDK as its README says, adds it to
// a new npm project of the user's, and runs the README's example there (as
// an ES module: the example has no type annotations).
func tsExampleScript(t *testing.T) string {
	t.Helper()
	const readme = "../../sdk-typescript/README.md"
	install := readmeBlock(t, readme, "# @sandgate/sdk", "sh")
	if strings.TrimSpace(install) != tsSDKInstall {
		t.Fatalf("the TypeScript SDK README's install line is %q; the tour runs %q (update tsSDKInstall)", install, tsSDKInstall)
	}
	example := readmeBlock(t, readme, "## Example", "ts")
	return "(\n" + tsSDKInstall + "\n)\n" +
		"mkdir ts-app && cd ts-app && npm init -y >/dev/null && npm install --no-audit --no-fund ../sdk-typescript\n" +
		"cat > quickstart.mjs <<'JS'\n" + example + "\nJS\n" +
		"node quickstart.mjs\ngrep -qx 'made in the sandbox' output.txt\ncd ..\n"
}

// sdkExampleScript installs the Python SDK as its README says and runs its
// example verbatim, with API_URL and TOKEN from the environment the tour
// set (the README: "API_URL is the gateway's base URL").
func sdkExampleScript(t *testing.T) string {
	t.Helper()
	const readme = "../../sdk-python/README.md"
	install := readmeBlock(t, readme, "# sandgate-sdk (Python)", "")
	if strings.TrimSpace(install) != strings.TrimSpace(pythonSDKInstall) {
		t.Fatalf("the Python SDK README's install line is %q; the tour runs %q (update pythonSDKInstall)", install, pythonSDKInstall)
	}
	example := readmeBlock(t, readme, "## Example", "python")
	return "python3 -m venv sdk-venv\n" +
		"sdk-venv/bin/pip install -q --disable-pip-version-check ./sdk-python\n" +
		"cat > local_script.py <<'PY'\nimport platform\nwith open('output.txt', 'w') as f:\n    f.write('computed in the sandbox: %d\\n' % sum(range(10)))\nprint('remote script ran on python', platform.python_version())\nPY\n" +
		"cat > sdk_example.py <<'PY'\nimport os\nAPI_URL, TOKEN = os.environ['SANDBOX_API_URL'], os.environ['SANDBOX_API_TOKEN']\n" + example + "\nPY\n" +
		"sdk-venv/bin/python sdk_example.py\ngrep -q 'computed in the sandbox: 45' output.txt\n"
}

// TestReadmeTour runs the README's 60-second tour as a fresh user: a new
// account (when root) with an empty HOME and no ~/.ssh, sandgate installed
// by make install, every line verbatim but the few in tourSubstitutions,
// stdin at EOF (so ssh, sftp and sandgate ssh run their shells and end).
// Then the Python SDK README's install line and example, verbatim. Any
// failing line fails it (bash -e, pipefail). `make test-tour` runs it;
// .ci/run too. The same for the TypeScript SDK README's install line and
// example. (pip and npm fetch the SDKs' dependencies from the registries.)
func TestReadmeTour(t *testing.T) {
	if os.Getenv("SANDGATE_TOUR") == "" {
		t.Skip("set SANDGATE_TOUR=1 (make test-tour): it adds a user account when run as root")
	}
	for _, tool := range []string{"ssh", "sftp", "scp", "curl", "python3", "make", "bash", "node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the tour needs %s: %v", tool, err)
		}
	}
	lines := readmeTour(t)
	var script strings.Builder
	script.WriteString("set -euo pipefail\nset -x\ncd \"$HOME\"\nmkdir -p src && echo 'print(1)' > src/main.py && echo hello > file.txt\ncp -r \"$TOUR_SDK\" sdk-python\ncp -r \"$TOUR_TS_SDK\" sdk-typescript\n")
	used := map[string]bool{}
	for _, l := range lines {
		if sub, ok := tourSubstitutions[l]; ok {
			used[l] = true
			script.WriteString(sub + "\n")
			continue
		}
		script.WriteString(l + "\n")
	}
	for l := range tourSubstitutions {
		if !used[l] {
			t.Errorf("README's tour no longer has the line %q (update tourSubstitutions)", l)
		}
	}
	script.WriteString(sdkExampleScript(t))
	script.WriteString(tsExampleScript(t))
	script.WriteString("sandgate session ls\nkill -TERM $SERVE_PID; wait $SERVE_PID\necho TOUR-OK\n")

	// A world-readable root for the install and the home.
	root, err := os.MkdirTemp("", "sandgate-tour-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(root, "prefix")
	bin, err := filepath.Abs(sandgateBin)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("make", "-s", "-C", "../..", "install", "BIN="+bin, "PREFIX="+prefix).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}

	// The SDK as a checkout has it, readable by the user: the tour runs the
	// README's pip install ./sdk-python from its HOME.
	sdkCopy := filepath.Join(root, "sdk-python")
	if out, err := exec.Command("cp", "-r", "../../sdk-python", sdkCopy).CombinedOutput(); err != nil {
		t.Fatalf("copy sdk-python: %v\n%s", err, out)
	}
	for _, junk := range []string{"build", "dist", ".pytest_cache"} {
		os.RemoveAll(filepath.Join(sdkCopy, junk))
	}
	tsCopy := filepath.Join(root, "sdk-typescript")
	if err := os.Mkdir(tsCopy, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"README.md", "package.json", "package-lock.json", "tsconfig.json", "src", "examples"} {
		if out, err := exec.Command("cp", "-r", filepath.Join("../../sdk-typescript", f), tsCopy).CombinedOutput(); err != nil {
			t.Fatalf("copy sdk-typescript: %v\n%s", err, out)
		}
	}
	if out, err := exec.Command("chmod", "-R", "a+rX", root).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v\n%s", err, out)
	}

	home := filepath.Join(root, "home")
	var cred *syscall.Credential
	userName := ""
	if os.Geteuid() == 0 {
		userName = fmt.Sprintf("sgtour%d", os.Getpid()%100000)
		if out, err := exec.Command("useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash", "--user-group", userName).CombinedOutput(); err != nil {
			t.Fatalf("useradd: %v\n%s", err, out)
		}
		t.Cleanup(func() {
			// The user's processes are gone when the script's group is; userdel -r removes the home.
			if out, err := exec.Command("userdel", "--remove", userName).CombinedOutput(); err != nil {
				t.Errorf("userdel: %v\n%s", err, out)
			}
		})
		u, err := user.Lookup(userName)
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	} else {
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(home, ".ssh")); err == nil {
		t.Fatalf("the fresh HOME %s has a ~/.ssh", home)
	}
	scriptPath := filepath.Join(root, "tour.sh")
	if err := os.WriteFile(scriptPath, []byte(script.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", scriptPath)
	cmd.Dir = home
	cmd.Env = []string{
		"HOME=" + home, "USER=" + userName, "LOGNAME=" + userName, "SHELL=/bin/bash", "LANG=C.UTF-8",
		"PATH=" + filepath.Join(prefix, "bin") + ":/usr/local/bin:/usr/bin:/bin",
		"SANDGATE_LISTEN=" + listen, "TOUR_SDK=" + sdkCopy, "TOUR_TS_SDK=" + tsCopy,
	}
	// pip reaches the package index (the SDK's dependencies) as the CI host does.
	for _, k := range []string{"npm_config_registry", "NPM_CONFIG_REGISTRY", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything the script left
	t.Logf("the tour, as %q with HOME=%s:\n%s", userName, home, out.String())
	if err != nil || !strings.Contains(out.String(), "\nTOUR-OK\n") {
		log, _ := os.ReadFile(filepath.Join(home, "serve.log"))
		t.Fatalf("the README's tour failed: %v\nserve.log:\n%s", err, log)
	}
}
