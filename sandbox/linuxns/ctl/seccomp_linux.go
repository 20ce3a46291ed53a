//go:build linux

package ctl

import (
	"fmt"

	"github.com/elastic/go-seccomp-bpf/arch"
)

// What the seccomp filter of every sandbox process refuses: the init
// builds the filter from this (initd/seccomp_linux.go, which says why), and
// the gateway describes it in /readyz (SeccompFor).

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

// SeccompBlocked returns the calls of blockedCalls that the architecture
// info has.
func SeccompBlocked(info *arch.Info) []string {
	var names []string
	for _, n := range blockedCalls {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	return names
}

// Seccomp describes the filter that sandboxes get on this host.
type Seccomp struct {
	// Arch is the ABI the filter is built for (x86_64, aarch64, ...).
	Arch string `json:"arch"`
	// Blocked lists what answers EPERM (or ENOSYS, where marked).
	Blocked []string `json:"blocked"`
	// UserNS says whether sandbox processes may create user namespaces.
	UserNS bool `json:"userns"`
}

// SeccompFor describes the filter an init builds on this host for a Spec
// with AllowUserNS allowUserNS, or says why none can be built.
func SeccompFor(allowUserNS bool) (Seccomp, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return Seccomp{}, fmt.Errorf("seccomp filter: %w", err)
	}
	s := Seccomp{Arch: info.Name, Blocked: SeccompBlocked(info), UserNS: allowUserNS}
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
