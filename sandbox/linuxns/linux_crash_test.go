//go:build linux

package linuxns_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/tunnel"
)

// sandgateBinary returns the sandgate binary: $SANDGATE_BIN, or one built
// for this test.
func sandgateBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SANDGATE_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "sandgate")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/sandgate/sandgate/cmd/sandgate").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// gatewayProc is a `sandgate serve` run as a separate process.
type gatewayProc struct {
	*gwtest.Binary
	url string
}

func (g *gatewayProc) log() string { return g.Stderr.String() }

func startGateway(t *testing.T, bin, dataDir, apiKey string, args ...string) *gatewayProc {
	t.Helper()
	b := gwtest.StartBinary(t, bin, append([]string{"serve", "--sandbox", "linux", "--listen", "127.0.0.1:0",
		"--data-dir", dataDir, "--api-key", apiKey, "--log-level", "debug"}, args...)...)
	return &gatewayProc{Binary: b, url: b.URL}
}

// 11. kill -9 of the gateway with live sessions, then a restart. The
// sandboxes outlive the crash (their inits do not depend on the gateway
// process); the restarted gateway either re-adopts each one, usable with its
// files and background processes, or, where it does not keep sandboxes,
// reaps it at start. Either way no process, mount, loop device or cgroup
// of the old run is left over.
func TestLinuxGatewayCrashThenRestart(t *testing.T) {
	requireLinux(t)
	bin := sandgateBinary(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	const key = "crash-test-key"
	g := startGateway(t, bin, dataDir, key)

	type session struct {
		SessionID string `json:"sessionId"`
		Status    string `json:"status"`
		SSH       struct {
			HostKeys []string `json:"hostKeys"`
		} `json:"ssh"`
	}
	call := func(url, method string, out any) int {
		req, _ := http.NewRequest(method, url, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			_ = json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.StatusCode
	}
	var sessions []session
	var sandboxes []hostSandbox
	for range 5 {
		var sess session
		if code := call(g.url+"/v1/sessions", http.MethodPost, &sess); code != http.StatusCreated {
			t.Fatalf("create: %d\n%s", code, g.log())
		}
		c := dialSSH(t, g.url, key, sess.SessionID, sess.SSH.HostKeys)
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Run("echo kept > /workspace/kept; setsid nohup sleep 100010 >/dev/null 2>&1 & sleep 100011 >/dev/null 2>&1 &"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		sessions = append(sessions, sess)
		sandboxes = append(sandboxes, hostFromState(t, dataDir, sess.SessionID))
	}

	if err := g.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-g.Done
	for _, h := range sandboxes {
		if len(h.survivors()) < 3 {
			t.Fatalf("sandbox %s died with the gateway: %+v", h.id, h.survivors())
		}
	}

	g2 := startGateway(t, bin, dataDir, key)
	adopted := 0
	for i, sess := range sessions {
		var now session
		code := call(g2.url+"/v1/sessions/"+sess.SessionID, http.MethodGet, &now)
		if code == http.StatusOK && now.Status == "running" {
			adopted++
			c := dialSSH(t, g2.url, key, sess.SessionID, sess.SSH.HostKeys)
			s, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			out, err := s.Output("cat /workspace/kept; ps -eo args | grep -c '^sleep 10001[01]$'")
			s.Close()
			if err != nil || string(out) != "kept\n2\n" {
				t.Errorf("re-adopted session %s: %q %v", sess.SessionID, out, err)
			}
			continue
		}
		sandboxes[i].checkGone(t)
	}
	if reaped := len(sessions) - adopted; reaped > 0 {
		n := strings.Count(g2.log(), "msg=sandbox_reaped") + strings.Count(g2.log(), "orphans_removed="+strconv.Itoa(reaped))
		if n == 0 {
			t.Errorf("%d sandboxes were neither re-adopted nor reported reaped:\n%s", reaped, g2.log())
		}
	}
	t.Logf("after the crash: %d sandboxes re-adopted, %d reaped", adopted, len(sessions)-adopted)

	// The restarted gateway works and stops cleanly; one more, which does
	// not keep sandboxes on exit, takes every sandbox down.
	if code := call(g2.url+"/v1/sessions", http.MethodPost, nil); code != http.StatusCreated {
		t.Fatalf("create after restart: %d", code)
	}
	stopGateway(t, g2)
	stopGateway(t, startGateway(t, bin, dataDir, key, "--keep-sandboxes-on-exit=false"))
	for _, h := range sandboxes {
		h.checkGone(t)
	}
}

// stopGateway stops g with SIGTERM and waits for it to exit cleanly.
func stopGateway(t *testing.T, g *gatewayProc) {
	t.Helper()
	_ = g.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.Done:
	case <-time.After(30 * time.Second):
		t.Fatal("gateway did not stop on SIGTERM")
	}
	if !g.Cmd.ProcessState.Success() {
		t.Errorf("gateway exit: %v\n%s", g.Cmd.ProcessState, g.log())
	}
}

// hostFromState reads what the host needs to know of a sandbox of a
// separate gateway process from its state file.
func hostFromState(t *testing.T, dataDir, id string) hostSandbox {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "sandboxes", id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid     int `json:"pid"`
		UIDBase int `json:"uidBase"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", st.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return hostSandbox{id: id, dataDir: dataDir, initPID: st.Pid, pidNS: ns, hostUID: st.UIDBase + 1000}
}

// dialSSH opens an SSH client to session id of the gateway at apiURL,
// pinning its host keys.
func dialSSH(t *testing.T, apiURL, token, id string, hostKeys []string) *gossh.Client {
	t.Helper()
	var keys []gossh.PublicKey
	for _, line := range hostKeys {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	conn, err := (&tunnel.Dialer{APIURL: apiURL, Token: token, Timeout: 10 * time.Second}).Dial(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &gossh.ClientConfig{
		User: "sandbox",
		HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error {
			for _, k := range keys {
				if bytes.Equal(k.Marshal(), key.Marshal()) {
					return nil
				}
			}
			return fmt.Errorf("unknown host key")
		},
		Timeout: 10 * time.Second,
	}
	cc, chans, reqs, err := gossh.NewClientConn(conn, id, cfg)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	c := gossh.NewClient(cc, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c
}
