//go:build linux

package initd

import (
	"fmt"
	"maps"
	"slices"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// The seccomp filter of every sandbox process.
//
// The init loads it on its spawner thread, after the root is built (that
// needs mount and pivot_root) and after no_new_privs and the capability
// drops, so every command, shell, SFTP server and kernel the init starts
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
// The list of blocked calls, and the filter's description for /readyz, are
// in package ctl (seccomp_linux.go), which the gateway imports too.

// cloneFlagsArg is the argument of clone(2) that holds its flags (the
// first one on every architecture the library has a table for).
const cloneFlagsArg = 0

// seccompPolicy is the filter for this host's architecture.
//
// Without allowUserNS, nested user namespaces are refused: unshare(2) and
// clone(2) with CLONE_NEWUSER in their flags answer EPERM (the library
// compares arguments; see the last group below). clone3(2) takes its
// flags in a struct in memory, which a seccomp filter cannot read, so
// clone3 answers ENOSYS as a whole:
// glibc (pthread_create, posix_spawn, fork) and Go fall back to clone(2),
// which the filter can judge. Docker's default profile does the same.
func seccompPolicy(allowUserNS bool) (*seccomp.Policy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	blocked := ctl.SeccompBlocked(info)
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
	// to nothing but the default. TestSeccompPolicy checks the program.
	if len(userNS) > 0 {
		groups = append(groups, seccomp.SyscallGroup{NamesWithCondtions: userNS, Action: seccomp.ActionAllow})
	}
	return &seccomp.Policy{DefaultAction: seccomp.ActionErrno, Syscalls: groups}, nil
}

// loadSeccomp installs the filter on the calling thread (and so on every
// process it forks from now on). The thread must be locked to its goroutine.
func loadSeccomp(allowUserNS bool) error {
	p, err := seccompPolicy(allowUserNS)
	if err != nil {
		return err
	}
	if err := seccomp.LoadFilter(seccomp.Filter{NoNewPrivs: true, Policy: *p}); err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	return nil
}
