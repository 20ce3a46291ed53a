package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// smapsKB reads the fields of /proc/<pid>/smaps_rollup, in KiB.
func smapsKB(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatalf("smaps of %d: %v", pid, err)
	}
	out := map[string]int64{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			out[k], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	return out
}

// initPid is the pid of session id's init, from the linux driver's state.
func (g *gatewayProc) initPid(t *testing.T, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.DataDir, "sandboxes", id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("state of %s: %q: %v", id, b, err)
	}
	return st.Pid
}

// requireSmallInit skips (fails in CI) unless the binary under test
// carries the small embedded init, as make build makes it (a plain go
// build does not: sandboxes then run the gateway's own binary).
func (g *gatewayProc) requireSmallInit(t *testing.T) {
	t.Helper()
	var r struct {
		Limits struct {
			Init string `json:"init"`
		} `json:"limits"`
	}
	if code := g.api(t, http.MethodGet, "/readyz", nil, &r); code != http.StatusOK {
		t.Fatalf("readyz: %d", code)
	}
	if r.Limits.Init == "embedded" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("the binary under test (%s) runs sandboxes on its own binary (readyz init %q): CI must test the binary make build makes", sandgateBin, r.Limits.Init)
	}
	t.Skipf("%s was built without the small init (readyz init %q): set SANDGATE_BIN to a make build", sandgateBin, r.Limits.Init)
}

// TestLinuxIdleInitMemory is issue 41's density item, measured in bytes:
// an idle sandbox's init is the small embedded binary, exec'd from its
// memfd, and owns (anonymous PSS: heap, stacks, written data) under 3 MiB
// once set up and after a command. The gateway's own binary as the init
// owned 6-8 MiB (its 300 package inits' heap), 27 MB RSS.
func TestLinuxIdleInitMemory(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	g.requireSmallInit(t)
	const maxAnonKB = 3 << 10
	for range 4 {
		id := g.createSession(t).SessionID
		var a struct {
			ExitCode int `json:"exitCode"`
		}
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": "true"}, &a); code != http.StatusOK || a.ExitCode != 0 {
			t.Fatalf("command in %s: %d %+v", id, code, a)
		}
		pid := g.initPid(t, id)
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || !strings.HasPrefix(exe, "/memfd:sandgate-init") {
			t.Errorf("init of %s runs %q (%v), want the embedded init's memfd", id, exe, err)
		}
		if f, err := os.Open(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
			seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
			f.Close()
			if want := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; err != nil || seals&want != want {
				t.Errorf("the init's memfd has seals %#x (%v), want %#x", seals, err, want)
			}
		} else {
			t.Errorf("the init's binary: %v", err)
		}
		m := smapsKB(t, pid)
		t.Logf("init of %s: Pss %d KiB (anon %d, shmem %d), Rss %d KiB", id, m["Pss"], m["Pss_Anon"], m["Pss_Shmem"], m["Rss"])
		if m["Pss_Anon"] > maxAnonKB {
			t.Errorf("init of %s owns %d KiB of anonymous memory, want at most %d KiB", id, m["Pss_Anon"], maxAnonKB)
		}
	}
}

// smallInitUsage is what cmd/sandgate-init says when run by hand: a binary
// that contains it embeds the small init.
const smallInitUsage = "sandgate-init: the sandbox side of sandgate"
