package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/gwtest"
)

type fullSession struct {
	SessionID    string    `json:"sessionId"`
	Status       string    `json:"status"`
	StatusReason string    `json:"statusReason"`
	ExpiresAt    time.Time `json:"expiresAt"`
}

// restartWith stops g with sig (SIGKILL: a crash) and starts a new gateway
// with driver on the same data dir.
func restartWith(t *testing.T, g *gatewayProc, sig syscall.Signal, driver string) *gatewayProc {
	t.Helper()
	_ = g.cmd.Process.Signal(sig)
	<-g.done
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	g2.start(t, []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", driver,
		"--api-key", g.Token, "--keep-sandboxes-on-exit=false"})
	return g2
}

// requireLinuxDriver skips where the linux driver cannot run (not root, no
// user namespaces) and fails under CI=true, where it must.
func requireLinuxDriver(t *testing.T) {
	t.Helper()
	_, err := os.Stat("/proc/self/ns/user")
	if os.Geteuid() == 0 && err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("the linux driver needs root and user namespaces in CI")
	}
	t.Skip("the linux driver needs root and user namespaces")
}

func TestRestartKeepsSessions(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	for _, tc := range []struct {
		driver string
		sig    syscall.Signal
		n      int
	}{
		{"workdir", syscall.SIGKILL, 6},
		{"workdir", syscall.SIGTERM, 6},
		{"linux", syscall.SIGKILL, 20},
		{"linux", syscall.SIGTERM, 20},
	} {
		t.Run(tc.driver+"/"+tc.sig.String(), func(t *testing.T) {
			if tc.driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--keep-sandboxes-on-exit=true", "--sandbox", tc.driver)
			n := tc.n
			var acked []fullSession
			bgPIDs := map[string]string{}
			for i := 0; i < n; i++ {
				var s fullSession
				if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"ttl": 600}, &s); code != http.StatusCreated {
					t.Fatalf("create: %d", code)
				}
				acked = append(acked, s)
				js := sessionJSON{SessionID: s.SessionID}
				var raw sessionJSON
				g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &raw)
				js.SSH = raw.SSH
				out, e, code := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, js), s.SessionID,
					fmt.Sprintf("echo data-%d > file.txt; nohup sleep 1000 >/dev/null 2>&1 & echo $!", i))...)
				if code != 0 {
					t.Fatalf("ssh: %d %s", code, e)
				}
				bgPIDs[s.SessionID] = strings.TrimSpace(out)
			}
			// Load in flight when the gateway stops: creates and execs.
			var wg sync.WaitGroup
			stopLoad := make(chan struct{})
			for w := 0; w < 3; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stopLoad:
							return
						default:
						}
						req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions", strings.NewReader("{}"))
						req.Header.Set("Authorization", "Bearer "+g.Token)
						if resp, err := http.DefaultClient.Do(req); err == nil {
							resp.Body.Close()
						} else {
							return
						}
					}
				}()
			}
			// SSH execs in flight too, on the acknowledged sessions.
			for w := 0; w < 2; w++ {
				var raw sessionJSON
				g.api(t, http.MethodGet, "/v1/sessions/"+acked[w].SessionID, nil, &raw)
				opts := append(g.sshOpts(t, raw), acked[w].SessionID, "echo busy >> busy.log; sleep 0.05")
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stopLoad:
							return
						default:
						}
						c := newCmd(g.clientEnv(), ssh, opts...)
						if c.Run() != nil {
							return // the gateway went away mid-exec
						}
					}
				}()
			}
			time.Sleep(300 * time.Millisecond)
			g2 := restartWith(t, g, tc.sig, tc.driver)
			close(stopLoad)
			wg.Wait()

			for i, s := range acked {
				var got fullSession
				if code := g2.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &got); code != http.StatusOK {
					t.Fatalf("session %s after restart: %d", s.SessionID, code)
				}
				if got.Status != "running" || !got.ExpiresAt.Equal(s.ExpiresAt) {
					t.Fatalf("after restart: %+v, want running with expiresAt %v", got, s.ExpiresAt)
				}
				var raw sessionJSON
				g2.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &raw)
				out, e, code := runClient(t, g2.clientEnv(), nil, ssh, append(g2.sshOpts(t, raw), s.SessionID, "cat file.txt")...)
				if code != 0 || out != fmt.Sprintf("data-%d\n", i) {
					t.Fatalf("files after restart: %d %q %s", code, out, e)
				}
				if tc.driver == "linux" { // the linux driver keeps processes too
					out, _, _ := runClient(t, g2.clientEnv(), nil, ssh, append(g2.sshOpts(t, raw), s.SessionID, "kill -0 "+bgPIDs[s.SessionID]+" && echo alive")...)
					if out != "alive\n" {
						t.Fatalf("background process of %s gone after restart: %q", s.SessionID, out)
					}
				}
			}
			// Every session the new gateway lists works, and every workdir
			// belongs to a listed session: nothing is half-created.
			var list struct {
				Sessions []fullSession
				Total    int
			}
			g2.api(t, http.MethodGet, "/v1/sessions?limit=100", nil, &list)
			listed := map[string]bool{}
			for _, s := range list.Sessions {
				if s.Status != "running" {
					t.Errorf("session %s is %s after restart: %s", s.SessionID, s.Status, s.StatusReason)
				}
				listed[s.SessionID] = true
			}
			for _, sub := range []string{"sessions", "sandboxes"} {
				entries, _ := os.ReadDir(filepath.Join(g.DataDir, sub))
				for _, e := range entries {
					if !listed[e.Name()] && !strings.HasPrefix(e.Name(), ".") { // .*: driver caches
						t.Errorf("%s/%s has no session", sub, e.Name())
					}
				}
			}
			// The workdir driver keeps files, not processes: none of the old run is left.
			if pids := sessionProcesses(g.sessionIDs()); len(pids) > 0 {
				t.Errorf("processes of the old run left: %v", pids)
			}
		})
	}
}

func TestRestartMarksLostSandboxFailed(t *testing.T) {
	g := startGateway(t, "--keep-sandboxes-on-exit=true")
	var s fullSession
	g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s)
	_ = g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.done
	if err := os.RemoveAll(filepath.Join(g.DataDir, "sessions", s.SessionID)); err != nil {
		t.Fatal(err)
	}
	g2 := restartWith(t, g, syscall.SIGKILL, "workdir")
	var got fullSession
	if code := g2.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &got); code != http.StatusOK {
		t.Fatalf("get: %d", code)
	}
	if got.Status != "failed" || got.StatusReason == "" {
		t.Fatalf("lost sandbox: %+v, want failed with a reason", got)
	}
	// The audit log says it failed, and why.
	if f := find(readAudit(t, filepath.Join(g.DataDir, "audit.log")), audit.Event{Kind: audit.KindSession, Session: s.SessionID, Op: "failed"}); len(f) != 1 || f[0].Reason != got.StatusReason {
		t.Errorf("failed events %+v, want one with reason %q", f, got.StatusReason)
	}
	// A failed session refuses tunnels with a clear status, and can be deleted.
	out, errOut, code := runClient(t, g2.clientEnv(), strings.NewReader(""), sandgateBin, "proxy", s.SessionID)
	if code == 0 || out != "" || !strings.Contains(errOut, "409") || !strings.Contains(errOut, "failed") {
		t.Fatalf("proxy to a failed session: %d %q %q", code, out, errOut)
	}
	if code := g2.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete failed session: %d", code)
	}
	if code := g2.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusGone {
		t.Fatalf("get after delete: %d, want 410 session_gone", code)
	}
}

// TestRestartKeepsTTLExtension: a PATCH that moved a session's expiry is
// what the next gateway enforces, after a crash (SIGKILL) too; the
// session's resources stay as created.
func TestRestartKeepsTTLExtension(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			g := startGateway(t, "--keep-sandboxes-on-exit=true")
			var s struct {
				fullSession
				TTL int `json:"ttl"`
			}
			res := map[string]any{"memoryMiB": 1024, "pids": 300}
			if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"ttl": 120, "resources": res}, &s); code != http.StatusCreated {
				t.Fatalf("create: %d", code)
			}
			var ext struct {
				fullSession
				TTL int `json:"ttl"`
			}
			if code := g.api(t, http.MethodPatch, "/v1/sessions/"+s.SessionID, map[string]any{"ttl": 7200}, &ext); code != http.StatusOK {
				t.Fatalf("patch: %d", code)
			}
			if ext.TTL != 7200 || !ext.ExpiresAt.After(s.ExpiresAt.Add(7000*time.Second)) {
				t.Fatalf("after PATCH: ttl %d expiresAt %v (was %v)", ext.TTL, ext.ExpiresAt, s.ExpiresAt)
			}
			g2 := restartWith(t, g, sig, "workdir")
			var got struct {
				fullSession
				TTL       int            `json:"ttl"`
				Resources map[string]any `json:"resources"`
			}
			if code := g2.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &got); code != http.StatusOK {
				t.Fatalf("get after restart: %d", code)
			}
			if got.Status != "running" || got.TTL != 7200 || !got.ExpiresAt.Equal(ext.ExpiresAt) {
				t.Fatalf("after restart: %+v ttl %d, want running, ttl 7200, expiresAt %v", got.fullSession, got.TTL, ext.ExpiresAt)
			}
			if got.Resources["memoryMiB"] != 1024.0 || got.Resources["pids"] != 300.0 || got.Resources["cpus"] != 1.0 {
				t.Errorf("resources after restart: %v", got.Resources)
			}
		})
	}
}

// TestLinuxSessionResources: resources asked for at create are the
// sandbox's cgroup limits under the real binary, and a request above a cap
// names the limit.
func TestLinuxSessionResources(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux", "--sandbox-max-memory", "1GiB")
	var s struct {
		SessionID string         `json:"sessionId"`
		Resources map[string]any `json:"resources"`
	}
	body := map[string]any{"resources": map[string]any{"memoryMiB": 256, "pids": 100, "cpus": 0.5}}
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	if s.Resources["memoryMiB"] != 256.0 || s.Resources["pids"] != 100.0 || s.Resources["cpus"] != 0.5 {
		t.Errorf("resources: %v", s.Resources)
	}
	for file, want := range map[string]string{
		"memory/sandgate/" + s.SessionID + "/procs/memory.limit_in_bytes": "268435456",
		"pids/sandgate/" + s.SessionID + "/procs/pids.max":                "100",
		"cpu/sandgate/" + s.SessionID + "/procs/cpu.cfs_quota_us":         "50000",
	} {
		b, err := os.ReadFile("/sys/fs/cgroup/" + file)
		if err != nil {
			t.Logf("%s: %v (not cgroup v1 here)", file, err)
			continue
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	// The memory limit is enforced: 400 MiB written into memory is killed
	// at 256 MiB and runs at 1024 MiB.
	ssh := gwtest.RequireTool(t, "ssh")
	alloc := `python3 -c "b = b'x' * (400 << 20); print(len(b) >> 20)"; echo exit=$?`
	for _, c := range []struct {
		mib  int
		want string
	}{{256, "exit=137\n"}, {1024, "400\nexit=0\n"}} {
		var sess struct {
			sessionJSON
			SessionID string `json:"sessionId"`
		}
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"resources": map[string]any{"memoryMiB": c.mib}}, &sess); code != http.StatusCreated {
			t.Fatalf("create %d MiB: %d", c.mib, code)
		}
		sess.sessionJSON.SessionID = sess.SessionID
		out, errOut, code := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, sess.sessionJSON), sess.SessionID, alloc)...)
		if out != c.want || code != 0 {
			t.Errorf("400 MiB at memoryMiB %d: %q (stderr %q, exit %d), want %q", c.mib, out, errOut, code, c.want)
		}
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	body = map[string]any{"resources": map[string]any{"memoryMiB": 2048}}
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &e); code != http.StatusBadRequest ||
		e.Error.Code != "resources_exceeded" || !strings.Contains(e.Error.Message, "1024") {
		t.Errorf("above the cap: %d %+v", code, e)
	}
}
