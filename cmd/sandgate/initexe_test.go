package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/internal/readyfile"
)

// The small init's memfd is exec'd by every sandbox of the host: nobody,
// root on the host included, can change its bytes (its seals), and no
// process of a sandbox holds it open (it is close-on-exec in the gateway,
// and the init's /proc/self/exe is all that names it).
func TestLinuxSmallInitCannotBeWritten(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	g.requireSmallInit(t)
	id := g.createSession(t).SessionID
	pid := g.initPid(t, id)
	exe := fmt.Sprintf("/proc/%d/exe", pid)
	if f, err := os.OpenFile(exe, os.O_RDWR, 0); err == nil {
		t.Logf("opened %s for writing", exe)
		mustNotChange(t, f)
	} else {
		// A file being executed cannot be opened for writing (ETXTBSY).
		t.Logf("open %s for writing: %v", exe, err)
	}
	// A command runs, and neither it nor the init holds the memfd.
	var a struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": "ls -l /proc/self/fd/ /proc/1/fd/ 2>&1; echo $$"}, &a); code != http.StatusOK || a.ExitCode != 0 {
		t.Fatalf("command: %d %+v", code, a)
	}
	if strings.Contains(a.Stdout, "memfd") {
		t.Errorf("a sandbox command sees the init's memfd:\n%s", a.Stdout)
	}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); strings.Contains(l, "memfd:") {
			t.Errorf("the init holds %s (%s)", l, fd)
		}
	}
	// With no sandbox running it, the gateway's memfd would open for
	// writing (to root on the host), but the spawn server runs it for as
	// long as the gateway does (ETXTBSY); either way its seals refuse
	// every change.
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	fds, _ = filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", g.cmd.Process.Pid))
	opened := false
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); strings.HasPrefix(l, "/memfd:sandgate-init") {
			f, err := os.OpenFile(fd, os.O_RDWR, 0)
			if errors.Is(err, syscall.ETXTBSY) {
				opened = true
				mustBeSealed(t, fd)
				continue
			}
			if err != nil {
				t.Fatalf("open the gateway's %s (%s) for writing: %v", l, fd, err)
			}
			opened = true
			mustNotChange(t, f)
		}
	}
	if !opened {
		t.Errorf("the gateway holds no memfd of the small init")
	}
}

// mustBeSealed checks that the memfd at path carries every seal that
// refuses a change (initexe.Open), through a read-only descriptor.
func mustBeSealed(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&want != want {
		t.Errorf("the small init's seals are %#x (%v), want %#x", seals, err, want)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_EXEC); err == nil {
		t.Errorf("changed the small init's seals through %s", path)
	}
}

// mustNotChange tries every way to change the file f is open on (for
// writing), and fails t for each that works.
func mustNotChange(t *testing.T, f *os.File) {
	t.Helper()
	defer f.Close()
	if _, err := f.WriteAt([]byte("\x7fELF"), 0); err == nil {
		t.Errorf("wrote the small init through %s", f.Name())
	}
	if _, err := f.WriteAt([]byte("x"), 1<<30); err == nil {
		t.Errorf("grew the small init through %s", f.Name())
	}
	if err := f.Truncate(0); err == nil {
		t.Errorf("truncated the small init through %s", f.Name())
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err == nil {
		t.Errorf("punched a hole in the small init through %s", f.Name())
	}
	if b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		unix.Munmap(b)
		t.Errorf("mapped the small init writable through %s", f.Name())
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_EXEC); err == nil {
		t.Errorf("changed the small init's seals through %s", f.Name())
	}
}

// A host where memfds cannot be exec'd (vm.memfd_noexec=2, which Linux
// keeps per pid namespace: the gateway runs in one of its own here) still
// runs sandboxes, on the gateway's own binary: /readyz says init "self",
// the log says why, and commands and SFTP (the file API) work.
func TestLinuxInitFallsBackWithoutMemfdExec(t *testing.T) {
	requireLinuxDriver(t)
	// A kernel feature, not a tool CI could install: older kernels skip
	// (sandbox/linuxns's TestLinuxSmallInitFailingProbeFallsBack covers
	// the fallback there).
	if _, err := os.Stat("/proc/sys/vm/memfd_noexec"); err != nil {
		t.Skipf("this kernel has no vm.memfd_noexec (Linux 6.3): %v", err)
	}
	g := &gatewayProc{DataDir: t.TempDir(), Token: "test-token"}
	ready := filepath.Join(t.TempDir(), "ready")
	args := []string{"-c", `mount --make-rprivate / && mount -t proc proc /proc && echo 2 > /proc/sys/vm/memfd_noexec && exec "$0" "$@"`, sandgateBin,
		"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", "linux", "--keep-sandboxes-on-exit=false",
		"--api-key", g.Token, "--warm-pool=0", "--teardown-queue=0", "--ready-file", ready}
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = gwtest.CleanEnv()
	g.stdout, g.stderr = &gwtest.Buffer{}, &gwtest.Buffer{}
	cmd.Stdout, cmd.Stderr = g.stdout, g.stderr
	// Its own pid namespace, of which the gateway is the init, with its
	// own /proc: the sysctl applies to it and its sandboxes only.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	g.cmd, g.done = cmd, done
	t.Cleanup(func() {
		g.stop(t)
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, err := readyfile.Wait(ctx, ready, done)
	if err != nil {
		t.Fatalf("sandgate serve did not get ready: %v\nstderr:\n%s", err, g.stderr.String())
	}
	g.URL = url
	var r struct {
		Limits struct {
			Init string `json:"init"`
		} `json:"limits"`
	}
	if code := g.api(t, http.MethodGet, "/readyz", nil, &r); code != http.StatusOK || r.Limits.Init != "self" {
		t.Errorf("readyz: %d, init %q, want self", code, r.Limits.Init)
	}
	if logs := g.stderr.String(); !strings.Contains(logs, "embedded small init cannot be used") {
		t.Errorf("no warning that the small init cannot be used:\n%s", logs)
	}
	id := g.createSession(t).SessionID
	var a struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": "echo hi > f.txt && cat f.txt"}, &a); code != http.StatusOK || a.ExitCode != 0 || a.Stdout != "hi\n" {
		t.Fatalf("command: %d %+v", code, a)
	}
	// The init's pid is in the gateway's pid namespace: read its /proc.
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/root/proc/%d/exe", cmd.Process.Pid, g.initPid(t, id))); err != nil || strings.Contains(exe, "memfd") {
		t.Errorf("the init runs %q (%v), want the gateway's own binary", exe, err)
	}
	if res, b := restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/files?path=f.txt", nil); res.StatusCode != http.StatusOK || string(b) != "hi\n" {
		t.Errorf("GET file: %d %q", res.StatusCode, b)
	}
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
}
