//go:build linux

package seccompprog

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
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

// TestPolicy runs the filter program the init loads (Program's bytes, as
// the spec carries them) on one system
// call after another, as the kernel would, and checks the answer: each
// blocked call EPERM, nested user namespaces EPERM (clone3 ENOSYS) unless
// allowed, other ABIs refused, and the rest allowed.
func TestPolicy(t *testing.T) {
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
		prog := decode(t, allowUserNS)
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
		for _, n := range Blocked(info) {
			calls = append(calls, call{name: n, errno: unix.EPERM})
		}
		for _, n := range []string{"keyctl", "bpf", "mount", "umount2", "pivot_root", "reboot", "init_module", "fsopen", "move_mount", "open_tree", "io_uring_setup"} {
			if !slices.Contains(Blocked(info), n) {
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

// decode is Program(allowUserNS) read back into instructions, as the
// kernel reads the bytes: native-endian struct sock_filter entries. It
// checks they are what the library assembled from Policy.
func decode(t *testing.T, allowUserNS bool) []bpf.Instruction {
	t.Helper()
	b, err := Program(allowUserNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%8 != 0 || len(b) == 0 || len(b)/8 > MaxInstructions {
		t.Fatalf("program of %d bytes", len(b))
	}
	raw := make([]bpf.RawInstruction, len(b)/8)
	for i := range raw {
		e := b[8*i:]
		raw[i] = bpf.RawInstruction{Op: binary.NativeEndian.Uint16(e), Jt: e[2], Jf: e[3], K: binary.NativeEndian.Uint32(e[4:])}
	}
	p, err := Policy(allowUserNS)
	if err != nil {
		t.Fatal(err)
	}
	insts, err := p.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	want, err := bpf.Assemble(insts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(raw, want) {
		t.Fatalf("Program's bytes are not Policy's program: %d instructions, want %d", len(raw), len(want))
	}
	got, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the program has instructions x/net/bpf cannot read")
	}
	return got
}
