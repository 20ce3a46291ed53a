package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestCompatAgentSandbox runs Agent Sandbox's documented examples (the
// seed's ChatGPT conversation, an artifact fetched with plain curl)
// against the real binary, and its timeout under --max-command-timeout.
func TestCompatAgentSandbox(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			t.Parallel()
			g := startGateway(t, "--sandbox", driver, "--max-command-timeout", "2s")

			t.Run("conversation", func(t *testing.T) {
				out := runExample(t, g, docExample(t, "agent-sandbox"))
				want := `{"output":"10\n","artifacts":[]}` + "\n" + `{"output":"15\n","artifacts":[]}` + "\n"
				if out != want {
					t.Errorf("output %q, want %q", out, want)
				}
			})

			t.Run("artifact", func(t *testing.T) {
				out := runExample(t, g, docExample(t, "agent-sandbox-artifact"))
				if out != "hello, world\n"+`{"status":"success"}`+"\n" {
					t.Errorf("output %q", out)
				}
			})

			t.Run("timeout", func(t *testing.T) {
				type execOut struct {
					Output    string `json:"output"`
					Artifacts []struct {
						Path        string `json:"path"`
						MimeType    string `json:"mime_type"`
						DownloadURL string `json:"download_url"`
					} `json:"artifacts"`
				}
				run := func(code string) execOut {
					t.Helper()
					var o execOut
					if status := g.api(t, http.MethodPost, "/compat/agent-sandbox/v1/execute",
						map[string]any{"user_id": "bob", "session_id": "t", "code": code}, &o); status != http.StatusOK {
						t.Fatalf("execute %q: %d", code, status)
					}
					return o
				}
				run("n = 7")
				began := time.Now()
				o := run("import time\ntime.sleep(30)")
				if took := time.Since(began); o.Output != "TimeoutError: execution timed out\n" || took > 20*time.Second {
					t.Errorf("sleep past --max-command-timeout: %q after %v", o.Output, took)
				}
				if o := run("n"); o.Output != "7\n" {
					t.Errorf("n after the timeout: %q", o.Output)
				}
				o = run("import json\njson.dump({'a': 1}, open('r.json', 'w'))")
				if len(o.Artifacts) != 1 || o.Artifacts[0].Path != "r.json" || o.Artifacts[0].MimeType != "application/json" {
					t.Fatalf("artifacts: %+v", o.Artifacts)
				}
				res, err := http.Get(o.Artifacts[0].DownloadURL)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				var got map[string]int
				if res.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got["a"] != 1 {
					t.Errorf("download: %d %q", res.StatusCode, body)
				}
				var stopped map[string]string
				if status := g.api(t, http.MethodPost, "/compat/agent-sandbox/v1/sandbox/stop",
					map[string]any{"user_id": "bob", "session_id": "t"}, &stopped); status != http.StatusOK || stopped["status"] != "success" {
					t.Errorf("stop: %d %v", status, stopped)
				}
				if !strings.Contains(g.stderr.String(), "compat_session_deleted") {
					t.Errorf("no compat_session_deleted in the log")
				}
			})
		})
	}
}
