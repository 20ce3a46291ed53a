//go:build linux

package initd

import (
	"encoding/binary"
	"runtime"
	"slices"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// call is one system call as the filter sees it (struct seccomp_data).
type call struct {
	name  string
	nr    int    // used when name is ""
	arch  uint32 // AUDIT_ARCH_*; 0: the native one
	args  [6]uint64
	x32   bool
	allow bool // want SECCOMP_RET_ALLOW
	errno unix.Errno
}

// run evaluates the filter program on c the way the kernel does: each
// load is a native-endian 32-bit word of struct seccomp_data. (x/net/bpf's
// interpreter loads big-endian words, so each word is stored so.)
func run(t *testing.T, prog []bpf.Instruction, info *arch.Info, c call) uint32 {
	t.Helper()
	nr := c.nr
	if c.name != "" {
		n, ok := info.SyscallNames[c.name]
		if !ok {
			t.Fatalf("%s: not in the %s table", c.name, info.Name)
		}
		nr = n
	}
	if c.x32 {
		nr |= arch.X32.SeccompMask
	}
	a := c.arch
	if a == 0 {
		a = uint32(info.ID)
	}
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], uint32(nr))
	binary.BigEndian.PutUint32(data[4:], a)
	for i, v := range c.args {
		lo, hi := 16+8*i, 16+8*i+4
		if !littleEndian() {
			lo, hi = hi, lo
		}
		binary.BigEndian.PutUint32(data[lo:], uint32(v))
		binary.BigEndian.PutUint32(data[hi:], uint32(v>>32))
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

// TestSeccompPolicy runs the filter program the init loads on one system
// call after another, as the kernel would, and checks the answer: each
// blocked call EPERM, nested user namespaces EPERM (clone3 ENOSYS) unless
// allowed, other ABIs refused, and the rest allowed.
func TestSeccompPolicy(t *testing.T) {
	info, err := arch.GetInfo("")
	if err != nil {
		t.Skipf("no seccomp filter on this architecture: %v", err)
	}
	const (
		allow = unix.SECCOMP_RET_ALLOW
		errno = unix.SECCOMP_RET_ERRNO
	)
	foreign := uint32(unix.AUDIT_ARCH_I386)
	if info.ID != arch.X86_64.ID {
		foreign = unix.AUDIT_ARCH_X86_64
	}
	for _, allowUserNS := range []bool{false, true} {
		p, err := seccompPolicy(allowUserNS)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := p.Assemble()
		if err != nil {
			t.Fatal(err)
		}
		calls := []call{
			{name: "read", allow: true},
			{name: "execve", allow: true},
			{name: "ptrace", allow: true},
			{name: "adjtimex", allow: true},
			{name: "unshare", args: [6]uint64{unix.CLONE_NEWUTS | unix.CLONE_NEWNS}, allow: true},
			{name: "clone", args: [6]uint64{unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD)}, allow: true},
			{name: "clone", args: [6]uint64{unix.CLONE_NEWPID | unix.CLONE_NEWNET}, allow: true},
			// Flags whose value is some call's number (read is 0 on
			// x86_64): the library's program compares arguments and
			// numbers in the same register.
			{name: "clone", args: [6]uint64{0}, allow: true},
			{name: "unshare", args: [6]uint64{uint64(info.SyscallNames["clone"])}, allow: true},
			{name: "unshare", args: [6]uint64{unix.CLONE_NEWUSER | uint64(info.SyscallNames["clone"])}, allow: allowUserNS, errno: unix.EPERM},
			// The high half of a 64-bit argument: no CLONE_NEWUSER there.
			{name: "unshare", args: [6]uint64{unix.CLONE_NEWUSER << 32}, allow: true},
			{name: "unshare", args: [6]uint64{unix.CLONE_NEWUSER}, allow: allowUserNS, errno: unix.EPERM},
			{name: "unshare", args: [6]uint64{unix.CLONE_NEWUSER | unix.CLONE_NEWNS}, allow: allowUserNS, errno: unix.EPERM},
			{name: "clone", args: [6]uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, allow: allowUserNS, errno: unix.EPERM},
			{name: "clone3", allow: allowUserNS, errno: unix.ENOSYS},
			// Another ABI: the native table's numbers mean other calls
			// there, so everything through it is refused.
			{name: "read", arch: foreign, errno: unix.EPERM},
			{nr: 9999, errno: unix.EPERM},
		}
		if info.ID == arch.X86_64.ID {
			calls = append(calls, call{name: "read", x32: true, errno: unix.ENOSYS})
		}
		for _, n := range ctl.SeccompBlocked(info) {
			calls = append(calls, call{name: n, errno: unix.EPERM})
		}
		for _, n := range []string{"keyctl", "bpf", "mount", "umount2", "pivot_root", "reboot", "init_module", "fsopen", "move_mount", "open_tree", "io_uring_setup"} {
			if !slices.Contains(ctl.SeccompBlocked(info), n) {
				t.Errorf("%s is not blocked", n)
			}
		}
		for _, c := range calls {
			got := run(t, prog, info, c)
			want := uint32(allow)
			if !c.allow {
				want = errno | uint32(c.errno)
			}
			if got != want {
				t.Errorf("allowUserNS=%v: %s (nr %d, arch %#x, args %#x) -> %#x, want %#x", allowUserNS, c.name, c.nr, c.arch, c.args[0], got, want)
			}
		}
	}
}

// BenchmarkSeccompLoad is what the filter adds to a sandbox's start:
// building the program and loading it on a thread (each on a fresh
// thread, which ends with its goroutine).
func BenchmarkSeccompLoad(b *testing.B) {
	if _, err := arch.GetInfo(""); err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		errc := make(chan error)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends here
			errc <- loadSeccomp(false)
		}()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}
