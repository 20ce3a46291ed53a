//go:build linux

package linuxns_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

var linuxAvailable struct {
	once sync.Once
	err  error
}

// requireLinux skips a test where the linux driver cannot run here (not
// root, no user namespaces), and fails it in CI, where it must run.
func requireLinux(t testing.TB) {
	t.Helper()
	linuxAvailable.once.Do(func() {
		if os.Geteuid() != 0 {
			linuxAvailable.err = errors.New("the linux driver needs root")
			return
		}
		dir, err := os.MkdirTemp("", "sandgate-probe-")
		if err != nil {
			linuxAvailable.err = err
			return
		}
		defer os.RemoveAll(dir)
		_, linuxAvailable.err = linuxns.New(sandbox.Config{DataDir: dir})
	})
	if err := linuxAvailable.err; err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the linux sandbox driver must work in CI: %v", err)
		}
		t.Skipf("linux sandbox driver unavailable: %v", err)
	}
}

// hostSandbox is what the host sees of a session's sandbox, recorded while
// it runs to check afterwards that nothing of it is left.
type hostSandbox struct {
	id      string
	dataDir string
	initPID int
	pidNS   string // the init's pid namespace, as readlink shows it
	hostUID int
	workdir string
}

// pinPidNS returns init's pid namespace as readlink shows it, and holds the
// namespace open until the test ends: its inode number cannot then be
// reused by another sandbox's namespace (other packages' tests make
// sandboxes meanwhile, in uid ranges that may equal this one's, as each
// driver numbers its own from the same base), so a process seen in it
// later is this sandbox's.
func pinPidNS(t *testing.T, init int) string {
	t.Helper()
	p := fmt.Sprintf("/proc/%d/ns/pid", init)
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("pid namespace of init %d: %v", init, err)
	}
	t.Cleanup(func() { f.Close() })
	ns, err := os.Readlink(p)
	if err != nil {
		t.Fatalf("pid namespace of init %d: %v", init, err)
	}
	return ns
}

// linuxStack starts an in-process gateway on the linux driver and, when
// the test ends and the gateway has destroyed every sandbox, checks that
// none left a process, mount, loop device, cgroup or directory.
func linuxStack(t *testing.T) *gwtest.Stack {
	t.Helper()
	requireLinux(t)
	var s *gwtest.Stack
	// Registered first, so it runs after the stack's own cleanup.
	t.Cleanup(func() {
		if s != nil {
			checkNoLeaks(t, s.DataDir)
		}
	})
	s = gwtest.Start(t, gwtest.Options{Driver: "linux"})
	return s
}

// unwrap is the driver's sandbox under a session's wrapper.
func unwrap(sb sandbox.Sandbox) sandbox.Sandbox {
	if u, ok := sb.(interface{ Unwrap() sandbox.Sandbox }); ok {
		return u.Unwrap()
	}
	return sb
}

// inspect returns the host's view of session id's sandbox.
func inspect(t *testing.T, s *gwtest.Stack, id string) hostSandbox {
	t.Helper()
	sess, err := s.Manager.Get(context.Background(), gateway.Principal{Tenant: "default"}, id)
	if err != nil {
		t.Fatalf("session %s: %v", id, err)
	}
	sb, ok := unwrap(sess.Sandbox()).(interface {
		InitPID() int
		HostUID() int
		Workdir() string
	})
	if !ok {
		t.Fatalf("session %s: sandbox %T is not a linux sandbox", id, sess.Sandbox())
	}
	ns := pinPidNS(t, sb.InitPID())
	return hostSandbox{id: id, dataDir: s.DataDir, initPID: sb.InitPID(), pidNS: ns, hostUID: sb.HostUID(), workdir: sb.Workdir()}
}

// hostProc is a process in the host's process table.
type hostProc struct {
	pid   int
	uid   int
	state string
	args  string
	pidNS string
}

func hostProcesses() []hostProc {
	var out []hostProc
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		status, err := os.ReadFile(filepath.Join(dir, "status"))
		if err != nil {
			continue
		}
		p := hostProc{pid: pid, uid: -1}
		for _, line := range strings.Split(string(status), "\n") {
			k, v, _ := strings.Cut(line, ":")
			f := strings.Fields(v)
			switch {
			case k == "State" && len(f) > 0:
				p.state = f[0]
			case k == "Uid" && len(f) > 0:
				p.uid, _ = strconv.Atoi(f[0])
			}
		}
		args, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		p.args = strings.TrimSpace(strings.ReplaceAll(string(args), "\x00", " "))
		p.pidNS, _ = os.Readlink(filepath.Join(dir, "ns", "pid"))
		out = append(out, p)
	}
	return out
}

// survivors lists the live (not zombie) host processes of sandbox h: in
// its pid namespace, as its init's or its user's host uid. (The test holds
// the namespace open, pinPidNS, so its inode number is not reused.)
func (h hostSandbox) survivors() []hostProc {
	var out []hostProc
	for _, p := range hostProcesses() {
		if p.state == "Z" || p.pidNS != h.pidNS {
			continue
		}
		if p.uid == h.hostUID || p.uid == h.hostUID-1000 {
			out = append(out, p)
		}
	}
	return out
}

// checkGone fails unless nothing of sandbox h is left on the host.
func (h hostSandbox) checkGone(t *testing.T) {
	t.Helper()
	if left := h.survivors(); len(left) > 0 {
		t.Errorf("sandbox %s: %d processes survived: %+v", h.id, len(left), left)
	}
	if _, err := os.Stat(filepath.Join(h.dataDir, "sandboxes", h.id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox %s: its directory is still there (%v)", h.id, err)
	}
	for _, c := range cgroupsOf(h.id) {
		t.Errorf("sandbox %s: cgroup %s is still there", h.id, c)
	}
}

// cgroupsOf lists the host cgroups named after sandbox id.
func cgroupsOf(id string) []string {
	v1, _ := filepath.Glob("/sys/fs/cgroup/*/sandgate/" + id)
	v2, _ := filepath.Glob("/sys/fs/cgroup/sandgate/" + id)
	return append(v1, v2...)
}

// checkNoLeaks fails if any mount, loop device, cgroup or directory of a
// sandbox under dataDir is left.
func checkNoLeaks(t *testing.T, dataDir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaks := leaksUnder(dataDir)
		if len(leaks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("leaks after the gateway stopped: %s", strings.Join(leaks, "; "))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func leaksUnder(dataDir string) []string {
	var leaks []string
	root := filepath.Join(dataDir, "sandboxes")
	mi, _ := os.ReadFile("/proc/thread-self/mountinfo")
	sc := bufio.NewScanner(bytes.NewReader(mi))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 && strings.HasPrefix(f[4], dataDir) {
			leaks = append(leaks, "mount "+f[4])
		}
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if f, _ := os.ReadFile(b); strings.HasPrefix(string(f), dataDir) {
			leaks = append(leaks, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(b)))+" on "+strings.TrimSpace(string(f)))
		}
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			leaks = append(leaks, "directory "+filepath.Join(root, e.Name()))
		}
		for _, c := range cgroupsOf(e.Name()) {
			leaks = append(leaks, "cgroup "+c)
		}
	}
	return leaks
}

// deleteSession deletes session id through the REST API.
func deleteSession(t *testing.T, s *gwtest.Stack, id string) {
	t.Helper()
	if code := s.Do(t, s.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete %s: status %d", id, code)
	}
}

// runIn runs command in sb directly through the driver API.
func runIn(t testing.TB, sb sandbox.Sandbox, command string) (stdout, stderr string, exit sandbox.Exit) {
	t.Helper()
	p, err := sb.Start(context.Background(), sandbox.Cmd{Command: command})
	if err != nil {
		t.Fatalf("start %q: %v", command, err)
	}
	p.Stdin().Close()
	var out, errb bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(&out, p.Stdout()) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&errb, p.Stderr()) }()
	exit, err = p.Wait()
	if err != nil {
		t.Fatalf("wait %q: %v", command, err)
	}
	wg.Wait()
	return out.String(), errb.String(), exit
}

// openLinux opens a linux driver on dataDir, skipping as requireLinux does.
func openLinux(t *testing.T, cfg sandbox.Config) *linuxns.Driver {
	t.Helper()
	requireLinux(t)
	d, err := linuxns.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func alive(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(st), ") Z ")
}

// openDriver opens the driver called name ("workdir" or "linux").
func openDriver(name string, cfg sandbox.Config) (sandbox.Driver, error) {
	if name == "workdir" {
		return workdir.New(workdir.Config{Root: filepath.Join(cfg.DataDir, "sessions")})
	}
	return linuxns.New(cfg)
}
