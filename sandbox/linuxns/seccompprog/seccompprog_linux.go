//go:build linux

// Package seccompprog is the seccomp filter of every linux sandbox, gateway
// side: what it blocks, its description for /readyz (Describe), and its
// program (Program), which the gateway assembles once and sends to each
// init in its spec (ctl.Spec.Seccomp). The init only loads the program, so
// neither this package nor the filter library is linked into it.
package seccompprog

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// What the seccomp filter of every sandbox process refuses: Policy builds
// the filter from this, and the gateway describes it in /readyz (Describe).

// blockedCalls answer EPERM in every sandbox. Names the host's
// architecture does not have (umount and stime are i386's, the module
// calls differ on arm64) are left out.
var blockedCalls = []string{
	// Kernel keyrings: not namespaced, a common kernel attack surface.
	"keyctl", "add_key", "request_key",
	// Kernel programs, tracing and memory tricks an agent never needs.
	"bpf", "perf_event_open", "userfaultfd",
	"kexec_load", "kexec_file_load", "open_by_handle_at",
	"init_module", "finit_module", "delete_module", "create_module", "query_module",
	// The host's mounts, swap, power and clock. adjtimex and clock_adjtime
	// stay allowed: with no mode bits they only read the clock's state
	// (ntp_gettime, chronyc), and setting it needs CAP_SYS_TIME in the
	// host's user namespace, which no sandbox process has.
	"mount", "umount", "umount2", "pivot_root", "swapon", "swapoff", "reboot",
	"settimeofday", "stime", "clock_settime",
	// The new mount API reaches what mount(2) does by other calls (inside a
	// nested user namespace, with --sandbox-allow-userns, it would mount).
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
	"open_tree_attr", "mount_setattr",
	// io_uring: a large, often-exploited kernel surface that also runs
	// calls outside this filter's sight; Docker's default profile refuses it.
	"io_uring_setup", "io_uring_enter", "io_uring_register",
}

// Blocked returns the calls of blockedCalls that the architecture
// info has.
func Blocked(info *arch.Info) []string {
	var names []string
	for _, n := range blockedCalls {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	return names
}

// Description describes the filter that sandboxes get on this host.
type Description struct {
	// Arch is the ABI the filter is built for (x86_64, aarch64, ...).
	Arch string `json:"arch"`
	// Blocked lists what answers EPERM (or ENOSYS, where marked).
	Blocked []string `json:"blocked"`
	// UserNS says whether sandbox processes may create user namespaces.
	UserNS bool `json:"userns"`
}

// Describe describes the filter Program builds on this host for
// allowUserNS, or says why none can be built.
func Describe(allowUserNS bool) (Description, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return Description{}, fmt.Errorf("seccomp filter: %w", err)
	}
	s := Description{Arch: info.Name, Blocked: Blocked(info), UserNS: allowUserNS}
	if !allowUserNS {
		s.Blocked = append(s.Blocked, "unshare(CLONE_NEWUSER)", "clone(CLONE_NEWUSER)", "clone3 (ENOSYS)")
	}
	s.Blocked = append(s.Blocked, "other ABIs")
	if info.ID == arch.X86_64.ID {
		// go-seccomp-bpf's program answers x32 ahead of every rule.
		s.Blocked = append(s.Blocked, "x32 ABI (ENOSYS)")
	}
	return s, nil
}

// The seccomp filter of every sandbox process.
//
// The init loads it on its spawner thread, after no_new_privs and the
// capability drops (the init's other threads build the root meanwhile,
// which needs mount and pivot_root), so every command, shell, SFTP server and kernel the init starts
// inherits it across fork and exec, and cannot remove it. The init's own
// other threads stay unfiltered: they run no sandbox code.
//
// What it blocks answers EPERM, never a kill, so that tools fall back as
// they do on a host that forbids the call. The kernel already refuses most
// of these calls to a process without capabilities; the filter removes
// their code from reach, and closes those that need no capability at all
// (the keyrings, userfaultfd, perf_event_open for one's own processes,
// nested user namespaces).
//
// ptrace is not filtered: the sandbox has its own pid namespace, so no
// process outside it has a pid a sandbox process could name, and tracing
// one's own processes (strace, gdb) keeps working.
//
// The filter is built for the host's native ABI, from the library's
// syscall table. Every native call in that table is allowed unless it is
// blocked; anything else answers EPERM: calls through another ABI (the i386
// one through int 0x80 on x86_64, AArch32 on arm64), which would otherwise
// pass a list of native numbers untouched, and native calls newer than the
// table. The library itself answers the x32 ABI with ENOSYS. On an
// architecture the library has no table for (only x86_64, arm64, i386 and
// arm have one), no filter can be built and no sandbox starts: the linux
// driver's start-up probe fails.
//
// The gateway assembles the program once (Program) and sends it to every
// init in its spec (ctl.Spec.Seccomp): the init only loads it
// (initd/seccomp_linux.go), and links none of this package.

// cloneFlagsArg is the argument of clone(2) that holds its flags (the
// first one on every architecture the library has a table for).
const cloneFlagsArg = 0

// Policy is the filter for this host's architecture.
//
// Without allowUserNS, nested user namespaces are refused: unshare(2) and
// clone(2) with CLONE_NEWUSER in their flags answer EPERM (the library
// compares arguments; see the last group below). clone3(2) takes its
// flags in a struct in memory, which a seccomp filter cannot read, so
// clone3 answers ENOSYS as a whole:
// glibc (pthread_create, posix_spawn, fork) and Go fall back to clone(2),
// which the filter can judge. Docker's default profile does the same.
func Policy(allowUserNS bool) (*seccomp.Policy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	blocked := Blocked(info)
	special := map[string]bool{}
	for _, n := range blocked {
		special[n] = true
	}
	groups := []seccomp.SyscallGroup{{Names: blocked, Action: seccomp.ActionErrno}}
	var userNS []seccomp.NameWithConditions
	if !allowUserNS {
		groups = append(groups, seccomp.SyscallGroup{Names: []string{"clone3"}, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)})
		special["clone3"] = true
		noNewUser := func(arg uint32) seccomp.ArgumentConditions {
			return seccomp.ArgumentConditions{{Argument: arg, Operation: seccomp.BitsNotSet, Value: unix.CLONE_NEWUSER}}
		}
		userNS = []seccomp.NameWithConditions{
			{Name: "unshare", Conditions: noNewUser(0)},
			{Name: "clone", Conditions: noNewUser(cloneFlagsArg)},
		}
		special["unshare"], special["clone"] = true, true
	}
	// Every other native call is allowed; the default (EPERM) is for the
	// rest: other ABIs and calls the table does not know (see above).
	var allowed []string
	for _, n := range slices.Sorted(maps.Keys(info.SyscallNames)) {
		if !special[n] {
			allowed = append(allowed, n)
		}
	}
	groups = append(groups, seccomp.SyscallGroup{Names: allowed, Action: seccomp.ActionAllow})
	// unshare and clone without CLONE_NEWUSER are allowed, with it they
	// fall to the default, EPERM. This group must stay last: once the
	// library's program has loaded an argument to compare, it goes on
	// comparing that argument, not the call's number, against what
	// follows (go-seccomp-bpf v1.6.0), so a condition that fails must lead
	// to nothing but the default. TestPolicy checks the program.
	if len(userNS) > 0 {
		groups = append(groups, seccomp.SyscallGroup{NamesWithCondtions: userNS, Action: seccomp.ActionAllow})
	}
	return &seccomp.Policy{DefaultAction: seccomp.ActionErrno, Syscalls: groups}, nil
}

// Program assembles Policy(allowUserNS) into the program seccomp(2)
// loads: struct sock_filter entries of 8 bytes each (code, jt, jf, k) in
// the host's byte order, as ctl.Spec.Seccomp carries it.
func Program(allowUserNS bool) ([]byte, error) {
	p, err := Policy(allowUserNS)
	if err != nil {
		return nil, err
	}
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	if len(raw) == 0 || len(raw) > MaxInstructions {
		return nil, fmt.Errorf("seccomp filter: %d instructions", len(raw))
	}
	b := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		b = binary.NativeEndian.AppendUint16(b, r.Op)
		b = append(b, r.Jt, r.Jf)
		b = binary.NativeEndian.AppendUint32(b, r.K)
	}
	return b, nil
}

// MaxInstructions is the kernel's limit on a classic BPF program
// (BPF_MAXINSNS).
const MaxInstructions = 4096
