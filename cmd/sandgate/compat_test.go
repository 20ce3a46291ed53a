package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// compatDoc is the compat APIs' documentation, whose examples these tests
// run as they are written there.
const compatDoc = "../../docs/compat.md"

// docExample returns the fenced block that follows the marker
// <!-- compat-example: name --> in docs/compat.md.
func docExample(t *testing.T, name string) string {
	t.Helper()
	doc, err := os.ReadFile(compatDoc)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- compat-example: " + regexp.QuoteMeta(name) + " -->\n```bash\n(.*?)\n```")
	m := re.FindSubmatch(doc)
	if m == nil {
		t.Fatalf("%s has no example %q", compatDoc, name)
	}
	return string(m[1])
}

// runExample runs a documented example with bash, its base URL (the
// gateway's default address) pointed at g, and TOKEN set to g's token.
func runExample(t *testing.T, g *gatewayProc, example string) string {
	t.Helper()
	const docBase = "http://127.0.0.1:8080"
	if !strings.Contains(example, "BASE="+docBase+"/compat/") {
		t.Fatalf("example does not set BASE to %s/compat/...: %s", docBase, example)
	}
	script := strings.Replace(example, "BASE="+docBase, "BASE="+g.URL, 1)
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(cleanEnv(), "TOKEN="+g.Token)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("example: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	return string(out)
}

// TestCompatDocMatchesSeed: the documented sbs example is the seed's curl
// smoke line with only the base URL and the token added.
func TestCompatDocMatchesSeed(t *testing.T) {
	seed := docExample(t, "sbs-seed")
	want := strings.Replace(seed, "BASE=http://127.0.0.1:8000", "BASE=http://127.0.0.1:8080/compat/sbs", 1)
	want = strings.ReplaceAll(want, "curl -sS ", `curl -sS -H "Authorization: Bearer $TOKEN" `)
	if got := docExample(t, "sbs"); got != want {
		t.Errorf("the sbs example is not the seed's line with the base URL and token:\n got %s\nwant %s", got, want)
	}
}

func TestCompat(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			t.Parallel()
			const stepTimeout = 2 * time.Second
			args := []string{"--step-timeout", stepTimeout.String()}
			g := startGateway(t, append([]string{"--sandbox", driver}, args...)...)
			compat := func(method, path string, body any, out any) int {
				t.Helper()
				return g.api(t, method, "/compat"+path, body, out)
			}

			// The sbs timeout takes the step timeout: it runs while the
			// rest does.
			type stepOut struct {
				Output, Error string
				ExitCode      int `json:"exit_code"`
			}
			var created struct {
				SessionID string `json:"session_id"`
			}
			if code := compat(http.MethodPost, "/sbs/sessions", map[string]any{}, &created); code != http.StatusOK {
				t.Fatalf("sbs create: %d", code)
			}
			timedOut := make(chan stepOut, 1)
			began := time.Now()
			go func() {
				var o stepOut
				code := gatewayJSON(g, http.MethodPost, "/compat/sbs/sessions/"+created.SessionID+"/step",
					map[string]any{"sandbox_id": created.SessionID, "type": "bash", "payload": map[string]string{"cmd": "echo started; sleep 100"}}, &o)
				if code != http.StatusOK {
					o.ExitCode = -code
				}
				timedOut <- o
			}()

			t.Run("sbs smoke line", func(t *testing.T) {
				out := runExample(t, g, docExample(t, "sbs"))
				lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
				var step stepOut
				if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &step) != nil || lines[1] != "DELETE 204" {
					t.Fatalf("output %q", out)
				}
				ws := strings.TrimSpace(step.Output)
				if step.ExitCode != 0 || step.Error != "" || !(ws == "/workspace" || strings.HasPrefix(ws, g.DataDir)) {
					t.Errorf("pwd step: %+v", step)
				}
			})

			t.Run("sbs python", func(t *testing.T) {
				var c struct {
					SessionID string `json:"session_id"`
				}
				compat(http.MethodPost, "/sbs/sessions", nil, &c)
				var o stepOut
				if code := compat(http.MethodPost, "/sbs/sessions/"+c.SessionID+"/step",
					map[string]any{"sandbox_id": c.SessionID, "type": "python", "payload": map[string]string{"code": "import sys; print(6*7); sys.exit(3)"}}, &o); code != http.StatusOK || o.Output != "42\n" || o.ExitCode != 3 {
					t.Errorf("python step: %d %+v", code, o)
				}
				if code := compat(http.MethodDelete, "/sbs/sessions/"+c.SessionID, nil, nil); code != http.StatusNoContent {
					t.Errorf("delete: %d", code)
				}
			})

			t.Run("sandkasten flow", func(t *testing.T) {
				out := runExample(t, g, docExample(t, "sandkasten"))
				var answers []map[string]any
				dec := json.NewDecoder(strings.NewReader(out))
				for dec.More() {
					var a map[string]any
					if err := dec.Decode(&a); err != nil {
						t.Fatalf("output %q: %v", out, err)
					}
					answers = append(answers, a)
				}
				if len(answers) != 5 {
					t.Fatalf("want 5 answers, got %q", out)
				}
				first, write, run, read, del := answers[0], answers[1], answers[2], answers[3], answers[4]
				if first["exit_code"] != 0.0 || !strings.HasSuffix(first["cwd"].(string), "/app") {
					t.Errorf("first exec: %v", first)
				}
				if write["ok"] != true || del["ok"] != true {
					t.Errorf("write %v, delete %v", write, del)
				}
				if run["exit_code"] != 0.0 || !strings.HasPrefix(run["output"].(string), "42\n") ||
					!strings.Contains(run["output"].(string), "foo.py") || run["cwd"] != first["cwd"] {
					t.Errorf("second exec: %v", run)
				}
				if read["content_base64"] != base64.StdEncoding.EncodeToString([]byte("print(6*7)\n")) || read["truncated"] != false {
					t.Errorf("read: %v", read)
				}
			})

			t.Run("sandkasten exec read write", func(t *testing.T) {
				var s struct {
					ID        string    `json:"id"`
					ExpiresAt time.Time `json:"expires_at"`
				}
				if code := compat(http.MethodPost, "/sandkasten/v1/sessions", map[string]any{"ttl_seconds": 120}, &s); code != http.StatusCreated {
					t.Fatalf("create: %d", code)
				}
				base := "/sandkasten/v1/sessions/" + s.ID
				type execOut struct {
					ExitCode  int    `json:"exit_code"`
					Cwd       string `json:"cwd"`
					Output    string `json:"output"`
					Truncated bool   `json:"truncated"`
				}
				run := func(cmd string, timeoutMs int) execOut {
					t.Helper()
					var o execOut
					if code := compat(http.MethodPost, base+"/exec", map[string]any{"cmd": cmd, "timeout_ms": timeoutMs}, &o); code != http.StatusOK {
						t.Fatalf("exec %q: %d", cmd, code)
					}
					return o
				}
				nativeExpiry := func() time.Time {
					var n struct {
						ExpiresAt time.Time `json:"expiresAt"`
					}
					if code := g.api(t, http.MethodGet, "/v1/sessions/"+s.ID, nil, &n); code != http.StatusOK {
						t.Fatalf("native get: %d", code)
					}
					return n.ExpiresAt
				}
				before := nativeExpiry()
				time.Sleep(1100 * time.Millisecond)
				if o := run("mkdir -p d && cd d && echo out && echo err >&2", 30000); o.ExitCode != 0 || o.Output != "out\nerr\n" || !strings.HasSuffix(o.Cwd, "/d") {
					t.Errorf("exec: %+v", o)
				}
				if after := nativeExpiry(); after.Sub(before) < time.Second {
					t.Errorf("exec did not extend the lease: expiresAt %v then %v", before, after)
				}
				if o := run("basename $PWD", 30000); o.Output != "d\n" {
					t.Errorf("cd did not persist: %+v", o)
				}
				if o := run("sleep 100", 1000); o.ExitCode != 124 {
					t.Errorf("timeout: %+v", o)
				}
				if o := run("basename $PWD", 30000); o.Output != "d\n" {
					t.Errorf("cwd after the timeout: %+v", o)
				}
				content := bytes.Repeat([]byte("0123456789"), 1000)
				if code := compat(http.MethodPost, base+"/fs/write", map[string]any{"path": "/workspace/d/data.bin", "content_base64": base64.StdEncoding.EncodeToString(content)}, nil); code != http.StatusOK {
					t.Fatalf("write: %d", code)
				}
				var r struct {
					ContentBase64 string `json:"content_base64"`
					Truncated     bool   `json:"truncated"`
				}
				for _, tc := range []struct {
					query string
					want  []byte
					trunc bool
				}{
					{"path=/workspace/d/data.bin", content, false},
					{"path=d/data.bin&max_bytes=15", content[:15], true},
				} {
					if code := compat(http.MethodGet, base+"/fs/read?"+tc.query, nil, &r); code != http.StatusOK ||
						r.ContentBase64 != base64.StdEncoding.EncodeToString(tc.want) || r.Truncated != tc.trunc {
						t.Errorf("read %s: %d truncated=%v %d bytes", tc.query, code, r.Truncated, len(r.ContentBase64))
					}
				}
				if o := run("wc -c < data.bin", 30000); strings.TrimSpace(o.Output) != "10000" {
					t.Errorf("the shell sees %q", o.Output)
				}
				if code := compat(http.MethodDelete, base, nil, nil); code != http.StatusOK {
					t.Errorf("delete: %d", code)
				}
			})

			o := <-timedOut
			took := time.Since(began)
			if o.ExitCode != 124 || o.Output != "started\n" || !strings.Contains(o.Error, "timed out") || took < stepTimeout || took > stepTimeout+15*time.Second {
				t.Errorf("sbs step past the timeout of %v: %+v after %v", stepTimeout, o, took)
			}
			if code := compat(http.MethodDelete, "/sbs/sessions/"+created.SessionID, nil, nil); code != http.StatusNoContent {
				t.Errorf("delete: %d", code)
			}
		})
	}
}

// gatewayJSON is g.api for a goroutine that must not call t.Fatal.
func gatewayJSON(g *gatewayProc, method, path string, body, out any) int {
	b, err := json.Marshal(body)
	if err != nil {
		return -1
	}
	req, err := http.NewRequest(method, g.URL+path, bytes.NewReader(b))
	if err != nil {
		return -1
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	if json.NewDecoder(res.Body).Decode(out) != nil {
		return -1
	}
	return res.StatusCode
}
