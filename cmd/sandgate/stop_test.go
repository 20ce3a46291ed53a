package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// hostMatches lists the host's processes whose command line matches
// pattern (pgrep -f), both drivers' sandboxes' included.
func hostMatches(pattern string) string {
	out, _ := exec.Command("pgrep", "-af", pattern).Output()
	return strings.TrimSpace(string(out))
}

// stopSession stops session id and checks the answer.
func stopSession(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	var s fullSession
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/stop", nil, &s); code != http.StatusOK || s.Status != "stopped" {
		t.Fatalf("stop: %d %+v", code, s)
	}
}

// sessionStatus is session id's status as GET shows it.
func sessionStatus(t *testing.T, g *gatewayProc, id string) string {
	t.Helper()
	var s fullSession
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &s); code != http.StatusOK {
		t.Fatalf("get: %d", code)
	}
	return s.Status
}

// TestStopAndResume: POST /stop kills every process of a session and keeps
// its files; the next REST command or SSH exec starts it again; a stopped
// session stays stopped across a gateway restart, and resumes after it.
func TestStopAndResume(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "pgrep")
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--keep-sandboxes-on-exit=true", "--sandbox", driver)
			s := g.createSession(t)
			id := s.SessionID
			opts := append(g.sshOpts(t, s), id)
			sleeper := fmt.Sprintf("sleep 1000%d", time.Now().UnixNano()%100000)
			if _, e, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "echo kept > file.txt; nohup "+sleeper+" >/dev/null 2>&1 &")...); code != 0 {
				t.Fatalf("ssh: %d %s", code, e)
			}
			if hostMatches(sleeper) == "" {
				t.Fatal("the background sleep is not running")
			}

			stopSession(t, g, id)
			if left := hostMatches(sleeper); left != "" {
				t.Errorf("processes left after stop: %s", left)
			}
			if pids := sessionProcesses([]string{id}); len(pids) > 0 {
				t.Errorf("session processes left after stop: %v", pids)
			}
			if driver == "linux" {
				for _, pat := range []string{"/sys/fs/cgroup/sandgate/" + id, "/sys/fs/cgroup/*/sandgate/" + id} {
					if m, _ := filepath.Glob(pat); len(m) > 0 {
						t.Errorf("cgroups left after stop: %v", m)
					}
				}
			}
			if st := sessionStatus(t, g, id); st != "stopped" {
				t.Errorf("status %q after stop", st)
			}

			// A REST command starts it again, on the same files.
			if a := runREST(t, g, id, map[string]any{"command": "cat file.txt; ps -eo args | grep -c '^" + sleeper + "'"}); a.out() != "kept\n0\n" {
				t.Errorf("REST command after stop: %+v %q", a, a.out())
			}
			if st := sessionStatus(t, g, id); st != "running" {
				t.Errorf("status %q after a command", st)
			}

			// So does an SSH exec (through the CONNECT tunnel).
			stopSession(t, g, id)
			if out, e, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "cat file.txt")...); out != "kept\n" || code != 0 {
				t.Errorf("ssh after stop: %q %d %s", out, code, e)
			}
			if st := sessionStatus(t, g, id); st != "running" {
				t.Errorf("status %q after ssh", st)
			}

			// Stopped across a restart, and resumable after it.
			runREST(t, g, id, map[string]any{"command": "echo again >> file.txt"})
			stopSession(t, g, id)
			g2 := restartWith(t, g, syscall.SIGTERM, driver)
			if st := sessionStatus(t, g2, id); st != "stopped" {
				t.Fatalf("status %q after a restart, want stopped", st)
			}
			if a := runREST(t, g2, id, map[string]any{"command": "cat file.txt"}); a.out() != "kept\nagain\n" {
				t.Errorf("REST command after restart: %q", a.out())
			}
			if st := sessionStatus(t, g2, id); st != "running" {
				t.Errorf("status %q after resuming on the new gateway", st)
			}
		})
	}
}
