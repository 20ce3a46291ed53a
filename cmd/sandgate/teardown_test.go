package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestAsyncTeardownLinux: with --teardown-queue, DELETE answers 204 and
// the session is gone at once (GET 410 session_gone, CONNECT refused,
// not listed); its sandbox's init, cgroups, mounts and directory are
// then released in the background, and a stop leaves nothing behind.
func TestAsyncTeardownLinux(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux", "--teardown-queue", "8")
	s := g.createSession(t)
	if a := runREST(t, g, s.SessionID, map[string]any{"command": "sleep 600 > /dev/null 2>&1 &"}); a.code() != 0 {
		t.Fatalf("background sleep: %+v", a)
	}
	dir := filepath.Join(g.DataDir, "sandboxes", s.SessionID)
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("state.json: %v %s", err, b)
	}
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	wantGone(t, g, s.SessionID, "deleted")
	if code, _ := connectStatus(t, g, s.SessionID); code == http.StatusOK {
		t.Fatal("CONNECT to a deleted session was accepted")
	}
	var list struct {
		Total int `json:"total"`
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions", nil, &list); code != 200 || list.Total != 0 {
		t.Fatalf("list after DELETE: %d, total %d", code, list.Total)
	}
	waitFor(t, time.Minute, "the sandbox to be released", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err) && syscall.Kill(st.Pid, 0) != nil && cgroupLimits(s.SessionID) == ""
	})
	if _, err := os.Stat("/proc/" + strconv.Itoa(st.Pid)); err == nil {
		t.Errorf("init %d still runs", st.Pid)
	}
	g.stop(t) // and no leftovers (assertNoLeftovers)
}
