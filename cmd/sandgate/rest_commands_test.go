package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
)

// cmdAnswer is a command's JSON answer.
type cmdAnswer struct {
	ExitCode     *int    `json:"exitCode"`
	ExitSignal   *string `json:"exitSignal"`
	Stdout       *string `json:"stdout"`
	Stderr       *string `json:"stderr"`
	StdoutBase64 *string `json:"stdoutBase64"`
	Truncated    bool    `json:"truncated"`
	TimedOut     bool    `json:"timedOut"`
	Cwd          string  `json:"cwd"`
}

func (c cmdAnswer) code() int {
	if c.ExitCode == nil {
		return -1
	}
	return *c.ExitCode
}

func (c cmdAnswer) out() string {
	if c.Stdout == nil {
		return ""
	}
	return *c.Stdout
}

// runREST posts a command and decodes its 200 answer.
func runREST(t *testing.T, g *gatewayProc, id string, body map[string]any) cmdAnswer {
	t.Helper()
	var a cmdAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", body, &a); code != http.StatusOK {
		t.Fatalf("command %v: status %d", body, code)
	}
	return a
}

// waitGone polls the sandbox (and, under workdir, the host) until no
// process's command line matches pattern.
func waitGone(t *testing.T, g *gatewayProc, id, driver, pattern string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in := runREST(t, g, id, map[string]any{"command": "ps -eo args | grep -e '" + pattern + "' | grep -v grep || true"}).out()
		host := ""
		if driver == "workdir" {
			out, _ := exec.Command("pgrep", "-af", pattern).Output()
			host = string(out)
		}
		if strings.TrimSpace(in) == "" && strings.TrimSpace(host) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running after 10s: sandbox %q host %q", in, host)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestRESTCommands(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--sandbox", driver)
			s := g.createSession(t)
			id := s.SessionID
			mark := fmt.Sprintf("%d", time.Now().UnixNano()%1000000)

			t.Run("timeout kills the tree", func(t *testing.T) {
				a := runREST(t, g, id, map[string]any{
					"command": fmt.Sprintf("sleep 71%[1]s & setsid sleep 72%[1]s & (sleep 73%[1]s &); sleep 74%[1]s", mark), "timeout": 1})
				if !a.TimedOut || a.code() != 124 {
					t.Fatalf("got %+v", a)
				}
				waitGone(t, g, id, driver, "sleep 7[1-4]"+mark)
			})
			t.Run("output cap head and tail", func(t *testing.T) {
				a := runREST(t, g, id, map[string]any{"command": "printf START; seq 1 100000 >/dev/null; yes | head -c 50000; printf END", "maxOutputBytes": 16})
				if !a.Truncated || a.out() != "STARTy\ny"+"\ny\ny\nEND" {
					t.Errorf("got %q truncated=%v", a.out(), a.Truncated)
				}
			})
			t.Run("binary output", func(t *testing.T) {
				a := runREST(t, g, id, map[string]any{"command": `printf 'a\200\000'`})
				if a.Stdout != nil || a.StdoutBase64 == nil || *a.StdoutBase64 != "YYAA" {
					t.Errorf("got %+v", a)
				}
			})
			t.Run("argv env cwd stdin", func(t *testing.T) {
				runREST(t, g, id, map[string]any{"command": "mkdir -p 'a dir'"})
				a := runREST(t, g, id, map[string]any{"argv": []string{"sh", "-c", `printf '%s|%s|%s|' "$1" "$LC_T" "$(cat)"; pwd`, "x", `$HOME "q" 'r' *`},
					"env": map[string]string{"LC_T": "lc"}, "cwd": "a dir", "stdin": "in put"})
				if !strings.HasPrefix(a.out(), `$HOME "q" 'r' *|lc|in put|/`) || !strings.HasSuffix(a.Cwd, "/a dir") {
					t.Errorf("got %q cwd %q", a.out(), a.Cwd)
				}
				var e struct {
					Error struct{ Code, Message string }
				}
				if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": "env", "env": map[string]string{"PATH": "/x"}}, &e); code != 400 || e.Error.Code != "env_not_allowed" {
					t.Errorf("PATH: %d %+v", code, e)
				}
			})
			t.Run("shell", func(t *testing.T) {
				sh := func(cmd string, timeout float64) cmdAnswer {
					return runREST(t, g, id, map[string]any{"command": cmd, "shell": "main", "timeout": timeout})
				}
				sh("mkdir -p w && cd w && export V=kept; g() { echo gee; }; alias al='echo alias'", 10)
				if a := sh("echo $V; g; al", 10); a.out() != "kept\ngee\nalias\n" || !strings.HasSuffix(a.Cwd, "/w") {
					t.Errorf("state: %+v %q", a, a.out())
				}
				if a := sh(fmt.Sprintf("cd /; sleep 75%s & sleep 76%s", mark, mark), 1); !a.TimedOut || a.code() != 124 {
					t.Errorf("timeout: %+v", a)
				}
				waitGone(t, g, id, driver, "sleep 7[56]"+mark)
				if a := sh("echo $V; g; al; basename $PWD", 10); a.out() != "kept\ngee\nalias\nw\n" {
					t.Errorf("after timeout: %q", a.out())
				}
				var wg sync.WaitGroup
				for i := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var a cmdAnswer
						body := map[string]any{"command": fmt.Sprintf("echo one%d; sleep 0.2; echo two%d >&2; echo three%d", i, i, i), "shell": "main"}
						if code := gwtest.DoJSON(t, g.URL, g.Token, http.MethodPost, "/v1/sessions/"+id+"/commands", body, &a); code != 200 {
							t.Errorf("concurrent %d: %d", i, code)
							return
						}
						if a.out() != fmt.Sprintf("one%d\nthree%d\n", i, i) || a.Stderr == nil || *a.Stderr != fmt.Sprintf("two%d\n", i) {
							t.Errorf("concurrent %d: mixed %+v", i, a)
						}
					}()
				}
				wg.Wait()
				if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id+"/shells/main", nil, nil); code != 204 {
					t.Errorf("delete: %d", code)
				}
				if a := sh("echo ${V:-fresh}", 10); a.out() != "fresh\n" {
					t.Errorf("after delete: %q", a.out())
				}
			})
			t.Run("ndjson", func(t *testing.T) {
				lines := streamLines(t, g, id, `{"command": "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.05; done; exit 4"}`, nil)
				var out, errs []string
				for i, l := range lines {
					if _, final := l["exitCode"]; final != (i == len(lines)-1) {
						t.Fatalf("answer not last: %v", lines)
					}
					if v, ok := l["stdout"].(string); ok {
						out = append(out, v)
					}
					if v, ok := l["stderr"].(string); ok {
						errs = append(errs, v)
					}
				}
				if strings.Join(out, "") != "o1\no2\no3\n" || strings.Join(errs, "") != "e1\ne2\ne3\n" || len(out) < 2 {
					t.Errorf("stdout %q stderr %q", out, errs)
				}
				if last := lines[len(lines)-1]; last["exitCode"] != 4.0 {
					t.Errorf("answer %v", last)
				}
			})
			t.Run("disconnect kills, background does not", func(t *testing.T) {
				streamLines(t, g, id, fmt.Sprintf(`{"command": "echo started; sleep 77%s"}`, mark), func(map[string]any) bool { return false })
				waitGone(t, g, id, driver, "sleep 77"+mark)
				// The linux init SIGKILLs a killed command's tree again
				// KillGrace later, by its UTS namespace's inode number,
				// which a command started meanwhile may have been given
				// anew: let that pass before the next one.
				time.Sleep(sandbox.KillGrace + 500*time.Millisecond)
				streamLines(t, g, id, `{"command": "echo started; sleep 2; echo done > bg.txt", "background": true}`, func(map[string]any) bool { return false })
				deadline := time.Now().Add(10 * time.Second)
				for runREST(t, g, id, map[string]any{"command": "cat bg.txt 2>/dev/null || true"}).out() != "done\n" {
					if time.Now().After(deadline) {
						var h any
						g.api(t, http.MethodGet, "/v1/sessions/"+id+"/commands?limit=60", nil, &h)
						t.Fatalf("the background command did not finish: %v\n%s", h, g.stderr.String())
					}
					time.Sleep(200 * time.Millisecond)
				}
			})
			t.Run("history", func(t *testing.T) {
				if _, err := exec.LookPath("ssh"); err == nil {
					sshOut, errOut, code := runClient(t, g.clientEnv(), nil, "ssh", append(g.sshOpts(t, s), id, "echo via-ssh")...)
					if code != 0 || sshOut != "via-ssh\n" {
						t.Fatalf("ssh: %d %q %q", code, sshOut, errOut)
					}
				}
				var h struct {
					Commands []struct {
						Command, Source, Shell string
						TimedOut               bool
					}
				}
				if code := g.api(t, http.MethodGet, "/v1/sessions/"+id+"/commands", nil, &h); code != 200 {
					t.Fatalf("history: %d", code)
				}
				var sources []string
				seen := map[string]bool{}
				for _, c := range h.Commands {
					sources = append(sources, c.Source)
					seen[c.Source+"/"+c.Shell] = true
					if strings.Contains(c.Command, "__sandgate") {
						t.Errorf("internal command in the history: %q", c.Command)
					}
				}
				want := []string{"rest/", "rest/main"}
				if _, err := exec.LookPath("ssh"); err == nil {
					want = append(want, "ssh/")
				}
				for _, w := range want {
					if !seen[w] {
						t.Errorf("history lacks %s: %v", w, sources)
					}
				}
				if h.Commands[len(h.Commands)-1].Command != "echo via-ssh" && seen["ssh/"] {
					t.Errorf("most recent is not last: %+v", h.Commands[len(h.Commands)-1])
				}
			})
		})
	}
}

// streamLines posts body with Accept: application/x-ndjson and returns the
// lines read; keep, when set, is asked after each line whether to go on
// (false: the client disconnects).
func streamLines(t *testing.T, g *gatewayProc, id, body string, keep func(map[string]any) bool) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	req.Header.Set("Accept", "application/x-ndjson")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("stream: %d", res.StatusCode)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, v)
		if keep != nil && !keep(v) {
			return lines
		}
	}
	return lines
}
