//go:build linux

package linuxns_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// seccompSandbox opens a linux driver with cfg (DataDir filled in) and
// creates one sandbox on it, destroyed when the test ends.
func seccompSandbox(t *testing.T, cfg sandbox.Config, id string) (*linuxns.Driver, sandbox.Sandbox) {
	t.Helper()
	cfg.DataDir = t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, cfg.DataDir) })
	d := openLinux(t, cfg)
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return d, sb
}

// requireTools skips (fails in CI) unless every tool runs in sb.
func requireTools(t *testing.T, sb sandbox.Sandbox, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		check := "command -v " + tool
		if strings.HasPrefix(tool, "python3 ") {
			check = tool
		}
		if _, _, e := runIn(t, sb, check+" >/dev/null 2>&1"); e.Code != 0 {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%q is not available in the sandbox (the host's /usr): CI must install it", tool)
			}
			t.Skipf("%q is not available in the sandbox", tool)
		}
	}
}

// syscallProbe is a python3 program (ctypes) that makes each system call
// of its input, one a line: a name, then the call's number and arguments
// (integers, or s:TEXT for a string). It prints the name and the errno (0:
// the call succeeded). A child made by clone exits at once.
const syscallProbe = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for line in sys.stdin:
    name, *args = line.split()
    conv = [ctypes.c_char_p(a[2:].encode()) if a.startswith("s:") else ctypes.c_long(int(a)) for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(*conv)
    if r == 0 and name.startswith("clone"):
        os._exit(0)
    print(name, ctypes.get_errno() if r == -1 else 0, flush=True)
`

// probeCall is one line of syscallProbe's input.
type probeCall struct {
	name string
	nr   uintptr
	args []string
	want unix.Errno
}

// runProbe runs calls through syscallProbe in sb and returns each call's
// errno by name.
func runProbe(t *testing.T, sb sandbox.Sandbox, calls []probeCall) map[string]unix.Errno {
	t.Helper()
	var in strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&in, "%s %d %s\n", c.name, c.nr, strings.Join(c.args, " "))
	}
	out, stderr, e := runIn(t, sb, "python3 -c '"+syscallProbe+"' <<'EOF'\n"+in.String()+"EOF")
	if e.Code != 0 {
		t.Fatalf("probe: %+v\n%s%s", e, out, stderr)
	}
	got := map[string]unix.Errno{}
	for line := range strings.Lines(out) {
		name, n, _ := strings.Cut(strings.TrimSpace(line), " ")
		errno, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("probe output %q", line)
		}
		got[name] = unix.Errno(errno)
	}
	return got
}

// TestLinuxSeccompBlocks: in a sandbox, every call the filter blocks
// answers EPERM (clone3 ENOSYS), nested user namespaces are refused, the
// i386 ABI is no way around it, and ptrace reaches the sandbox's own
// processes but no process outside. Arguments are chosen, where the
// kernel allows, so that the call would not fail with EPERM without the
// filter (a keyring id, EFAULT, ENOENT, ENOSPC...).
func TestLinuxSeccompBlocks(t *testing.T) {
	_, sb := seccompSandbox(t, sandbox.Config{}, "sbx-seccomp")
	requireTools(t, sb, "python3")

	out, _, _ := runIn(t, sb, "grep ^Seccomp /proc/self/status")
	if !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "Seccomp_filters:\t1") {
		t.Fatalf("a sandbox command is not under one seccomp filter:\n%s", out)
	}

	const bad = "1" // an address no call may read
	calls := []probeCall{
		{"keyctl", unix.SYS_KEYCTL, []string{"0", "-3", "1"}, unix.EPERM}, // KEYCTL_GET_KEYRING_ID of the session keyring
		{"add_key", unix.SYS_ADD_KEY, []string{"s:user", "s:sandgate", "s:x", "1", "-2"}, unix.EPERM},
		{"request_key", unix.SYS_REQUEST_KEY, []string{"s:user", "s:sandgate-none", "0", "0"}, unix.EPERM},
		{"bpf", unix.SYS_BPF, []string{"0", bad, "128"}, unix.EPERM},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, []string{bad, "0", "-1", "-1", "0"}, unix.EPERM},
		{"userfaultfd", unix.SYS_USERFAULTFD, []string{"1"}, unix.EPERM}, // UFFD_USER_MODE_ONLY
		{"kexec_load", unix.SYS_KEXEC_LOAD, []string{"0", "0", "0", "0"}, unix.EPERM},
		{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, []string{"-1", "-1", "0", "0", "0"}, unix.EPERM},
		{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, []string{"-1", bad, "0"}, unix.EPERM},
		{"init_module", unix.SYS_INIT_MODULE, []string{"0", "0", "s:"}, unix.EPERM},
		{"finit_module", unix.SYS_FINIT_MODULE, []string{"-1", "s:", "0"}, unix.EPERM},
		{"delete_module", unix.SYS_DELETE_MODULE, []string{"s:sandgate", "0"}, unix.EPERM},
		{"mount", unix.SYS_MOUNT, []string{bad, bad, bad, "0", "0"}, unix.EPERM},
		{"umount2", unix.SYS_UMOUNT2, []string{"s:/sandgate-none", "0"}, unix.EPERM},
		{"pivot_root", unix.SYS_PIVOT_ROOT, []string{"s:/", "s:/"}, unix.EPERM},
		{"swapon", unix.SYS_SWAPON, []string{"s:/sandgate-none", "0"}, unix.EPERM},
		{"swapoff", unix.SYS_SWAPOFF, []string{"s:/sandgate-none"}, unix.EPERM},
		{"reboot", unix.SYS_REBOOT, []string{"0", "0", "0", "0"}, unix.EPERM},
		{"settimeofday", unix.SYS_SETTIMEOFDAY, []string{"0", "0"}, unix.EPERM},
		{"clock_settime", unix.SYS_CLOCK_SETTIME, []string{"0", bad}, unix.EPERM},
		{"fsopen", unix.SYS_FSOPEN, []string{"s:tmpfs", "0"}, unix.EPERM},
		{"fsmount", unix.SYS_FSMOUNT, []string{"-1", "0", "0"}, unix.EPERM},
		{"move_mount", unix.SYS_MOVE_MOUNT, []string{"-1", "s:", "-1", "s:/", "0"}, unix.EPERM},
		{"open_tree", unix.SYS_OPEN_TREE, []string{"-100", "s:/", "0"}, unix.EPERM},
		{"mount_setattr", unix.SYS_MOUNT_SETATTR, []string{"-100", "s:/", "0", "0", "0"}, unix.EPERM},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, []string{"1", bad}, unix.EPERM},
		{"unshare_newuser", unix.SYS_UNSHARE, []string{strconv.Itoa(unix.CLONE_NEWUSER)}, unix.EPERM},
		{"clone_newuser", unix.SYS_CLONE, []string{strconv.Itoa(unix.CLONE_NEWUSER | int(unix.SIGCHLD)), "0", "0", "0", "0"}, unix.EPERM},
		{"clone3", unix.SYS_CLONE3, []string{"0", "0"}, unix.ENOSYS},
		// Allowed: a new UTS namespace needs CAP_SYS_ADMIN (EPERM from
		// the kernel), a plain fork works, and so does reading the clock.
		{"clone_fork", unix.SYS_CLONE, []string{strconv.Itoa(int(unix.SIGCHLD)), "0", "0", "0", "0"}, 0},
		{"getpid", unix.SYS_GETPID, nil, 0},
	}
	got := runProbe(t, sb, calls)
	for _, c := range calls {
		if e, ok := got[c.name]; !ok || e != c.want {
			t.Errorf("%s: errno %d (%v), want %d (%v)", c.name, e, e, c.want, c.want)
		}
	}

	t.Run("unshare -U", func(t *testing.T) {
		_, stderr, e := runIn(t, sb, "unshare -U true")
		if e.Code == 0 || !strings.Contains(stderr, "Operation not permitted") {
			t.Fatalf("unshare -U: %+v %q, want EPERM", e, stderr)
		}
	})

	t.Run("ptrace", func(t *testing.T) {
		host := exec.Command("sleep", "60")
		if err := host.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = host.Process.Kill(); _ = host.Wait() }()
		hostPID := host.Process.Pid
		// Inside: attach to one's own child, stop, detach. Outside: the
		// host's sleep, by its host pid, does not exist in the sandbox.
		script := `
import ctypes, os, sys, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
args = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
libc.ptrace.argtypes = args
pid = os.fork()
if pid == 0:
    time.sleep(30); os._exit(0)
r = libc.ptrace(16, pid, None, None)
print("inside", 0 if r == 0 else ctypes.get_errno())
if r == 0:
    _, st = os.waitpid(pid, 0)
    print("stopped", int(os.WIFSTOPPED(st)))
    libc.ptrace(17, pid, None, None)
os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
outside = int(sys.argv[1])
r = libc.ptrace(16, outside, None, None)
print("outside", 0 if r == 0 else ctypes.get_errno())
r = libc.ptrace(16, 1, None, None)
print("init", 0 if r == 0 else ctypes.get_errno())
`
		out, stderr, e := runIn(t, sb, "python3 -c '"+script+"' "+strconv.Itoa(hostPID))
		want := fmt.Sprintf("inside 0\nstopped 1\noutside %d\ninit %d\n", unix.ESRCH, unix.EPERM)
		if e.Code != 0 || out != want {
			t.Fatalf("ptrace: %+v\n%s%s\nwant:\n%s", e, out, stderr, want)
		}
		if _, _, e := runIn(t, sb, "command -v strace >/dev/null || exit 0; strace -f -o /dev/null sh -c true"); e.Code != 0 {
			t.Errorf("strace in the sandbox: %+v", e)
		}
	})

	// On x86_64 a 64-bit process can still make i386 system calls (int
	// 0x80), whose numbers differ: keyctl is 288 there.
	t.Run("i386 ABI", func(t *testing.T) {
		if runtime.GOARCH != "amd64" {
			t.Skip("x86_64 only")
		}
		requireTools(t, sb, "gcc")
		src := `#include <stdio.h>
int main(void) {
	long r;
	__asm__ volatile ("int $0x80" : "=a"(r) : "a"(288L), "b"(0L), "c"(-3L), "d"(1L) : "memory");
	printf("%ld\n", r);
	return 0;
}`
		out, stderr, e := runIn(t, sb, "cd /tmp && cat > i386.c <<'EOF'\n"+src+"\nEOF\ngcc -o i386 i386.c && ./i386")
		if e.Signal == "SEGV" {
			t.Skip("this kernel has no i386 ABI (ia32_emulation off)")
		}
		if e.Code != 0 || strings.TrimSpace(out) != strconv.Itoa(-int(unix.EPERM)) {
			t.Fatalf("keyctl through int 0x80: %+v %q %q, want %d", e, out, stderr, -int(unix.EPERM))
		}
	})
}

// TestLinuxSeccompAllowUserNS: with serve --sandbox-allow-userns a sandbox
// process may create a user namespace (and be root in it); the rest of the
// filter stays.
func TestLinuxSeccompAllowUserNS(t *testing.T) {
	d, sb := seccompSandbox(t, sandbox.Config{AllowUserNS: true}, "sbx-userns")
	if d.Seccomp()["userns"] != true {
		t.Errorf("report: %v", d.Seccomp())
	}
	out, stderr, e := runIn(t, sb, "unshare -U true && unshare -Ur id -u")
	if e.Code != 0 || out != "0\n" {
		t.Fatalf("unshare -U with user namespaces allowed: %+v %q %q", e, out, stderr)
	}
	requireTools(t, sb, "python3")
	calls := []probeCall{
		{"keyctl", unix.SYS_KEYCTL, []string{"0", "-3", "1"}, unix.EPERM},
		{"mount", unix.SYS_MOUNT, []string{"1", "1", "1", "0", "0"}, unix.EPERM},
		{"clone3", unix.SYS_CLONE3, []string{"0", "0"}, unix.EINVAL}, // a NULL struct of size 0
	}
	got := runProbe(t, sb, calls)
	for _, c := range calls {
		if got[c.name] != c.want {
			t.Errorf("%s: errno %d (%v), want %d (%v)", c.name, got[c.name], got[c.name], c.want, c.want)
		}
	}
}

// TestLinuxToolsUnderSeccomp: what an agent commonly runs works under the
// filter: a venv, pip installing a local wheel, git, gcc, node.
func TestLinuxToolsUnderSeccomp(t *testing.T) {
	_, sb := seccompSandbox(t, sandbox.Config{}, "sbx-tools")
	requireTools(t, sb, "python3", "python3 -c 'import ensurepip, venv'", "git", "gcc", "node")
	wheel := `
import base64, hashlib, zipfile
files = {
    "tinypkg/__init__.py": "VALUE = 42\n",
    "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
    "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: sandgate-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile("tinypkg-0.1-py3-none-any.whl", "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text)}")
    record.append("tinypkg-0.1.dist-info/RECORD,,")
    z.writestr("tinypkg-0.1.dist-info/RECORD", "\n".join(record) + "\n")
`
	tests := []struct{ name, cmd, want string }{
		{"python venv", "cd /workspace && python3 -m venv venv && venv/bin/python -c 'import sys; print(sys.prefix)'", "/workspace/venv\n"},
		{"pip install wheel", "cd /workspace && python3 -c '" + wheel + "' && venv/bin/pip install -q --no-index --disable-pip-version-check tinypkg-0.1-py3-none-any.whl && venv/bin/python -c 'import tinypkg; print(tinypkg.VALUE)'", "42\n"},
		{"git", "cd /workspace && git init -q repo && cd repo && echo hi > f && git add f && git -c user.name=t -c user.email=t@example.com commit -qm first && git log --format=%s", "first\n"},
		{"gcc", "cd /workspace && printf '#include <stdio.h>\\nint main(void){puts(\"hello\");return 0;}\\n' > h.c && gcc -o h h.c && ./h", "hello\n"},
		{"node", "node -e 'require(\"child_process\").execSync(\"true\"); console.log(6*7)'", "42\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, e := runIn(t, sb, tt.cmd)
			if e.Code != 0 || out != tt.want {
				t.Fatalf("%s: %+v\nstdout %q\nstderr %s", tt.cmd, e, out, stderr)
			}
		})
	}
}

// TestLinuxSeccompReportsAdoptedUnfiltered: a sandbox adopted from an
// init that predates the filter (its state says nothing of seccomp) is
// listed as unfiltered, with a warning, until it ends; one started under
// the filter is not.
func TestLinuxSeccompReportsAdoptedUnfiltered(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	old := openLinux(t, sandbox.Config{DataDir: dataDir})
	for _, id := range []string{"sbx-seccomp-old", "sbx-seccomp-new"} {
		sb, err := old.Create(context.Background(), sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = old.Remove(context.Background(), id) }) // when the test stops early
		if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// What a binary older than the filter wrote.
	statePath := filepath.Join(dataDir, "sandboxes", "sbx-seccomp-old", "state.json")
	b, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st["seccomp"] != true {
		t.Fatalf("a new sandbox's state does not record its filter: %s", b)
	}
	delete(st, "seccomp")
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(statePath, b, 0o600); err != nil {
		t.Fatal(err)
	}

	var logs lockedBuffer
	d := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	var adopted []sandbox.Sandbox
	for _, id := range []string{"sbx-seccomp-old", "sbx-seccomp-new"} {
		sb, err := d.Adopt(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		adopted = append(adopted, sb)
	}
	if got := d.Seccomp()["unfiltered"]; !slices.Equal(got.([]string), []string{"sbx-seccomp-old"}) {
		t.Fatalf("unfiltered = %v, want [sbx-seccomp-old]", got)
	}
	if !strings.Contains(logs.String(), "msg=sandbox_without_seccomp sandbox=sbx-seccomp-old") {
		t.Errorf("no warning: %s", logs.String())
	}
	for _, sb := range adopted {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := d.Seccomp()["unfiltered"]; len(got.([]string)) != 0 {
		t.Fatalf("unfiltered after the sandboxes ended = %v", got)
	}
}

// A spec without the filter's program fails the create (the init's
// spawner thread refuses to go on unfiltered), through the gateway's own
// fork and through the spawn server, and leaves nothing behind.
func TestLinuxSeccompNoProgramFailsClosed(t *testing.T) {
	requireLinux(t)
	for name, small := range map[string]bool{"forked": false, "spawned": true} {
		t.Run(name, func(t *testing.T) {
			dataDir := t.TempDir()
			var d *linuxns.Driver
			var err error
			if small {
				d, err = linuxns.NewWithInit(sandbox.Config{DataDir: dataDir}, smallInit(t))
			} else {
				d, err = linuxns.New(sandbox.Config{DataDir: dataDir})
			}
			if err != nil {
				t.Fatal(err)
			}
			d.DropSeccompProgram()
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-no-program"})
			if err == nil {
				out, _, _ := runIn(t, sb, "grep ^Seccomp /proc/self/status")
				_ = sb.Destroy(context.Background())
				t.Fatalf("a sandbox started without its seccomp program:\n%s", out)
			}
			if !strings.Contains(err.Error(), "seccomp") {
				t.Errorf("create without a program: %v, want an error naming the seccomp filter", err)
			}
			checkNoLeaks(t, dataDir)
		})
	}
}
