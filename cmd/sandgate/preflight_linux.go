package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
)

// The linux driver's privileges (docs/kubernetes.md, "Privileges"), checked
// before anything starts, so that a node agent missing one refuses to start
// with one line naming it and what grants it, instead of failing at the
// first sandbox or running sandboxes unconfined.

// requiredCaps are the capabilities the linux driver uses (the systemd
// unit's CapabilityBoundingSet, less NET_BIND_SERVICE, needed only for a
// --listen port below 1024, and SYS_RESOURCE, which only lets serve raise
// its descriptor limit past the hard limit it was given): namespaces,
// mounts and cgroups (SYS_ADMIN),
// uid/gid maps (SETUID, SETGID), image layers' and workspaces' owners
// (CHOWN, FOWNER, FSETID, DAC_OVERRIDE, DAC_READ_SEARCH), signalling and
// re-adopting sandbox processes (KILL, SYS_PTRACE) and pivot_root
// (SYS_CHROOT).
var requiredCaps = []struct {
	name string
	bit  uint
}{
	{"CAP_SYS_ADMIN", unix.CAP_SYS_ADMIN}, {"CAP_SETUID", unix.CAP_SETUID}, {"CAP_SETGID", unix.CAP_SETGID},
	{"CAP_CHOWN", unix.CAP_CHOWN}, {"CAP_FOWNER", unix.CAP_FOWNER}, {"CAP_FSETID", unix.CAP_FSETID},
	{"CAP_DAC_OVERRIDE", unix.CAP_DAC_OVERRIDE}, {"CAP_DAC_READ_SEARCH", unix.CAP_DAC_READ_SEARCH},
	{"CAP_KILL", unix.CAP_KILL}, {"CAP_SYS_PTRACE", unix.CAP_SYS_PTRACE},
	{"CAP_SYS_CHROOT", unix.CAP_SYS_CHROOT},
}

// namespaces are those every sandbox gets, each probed on its own so the
// refusal names the one that is denied.
var namespaces = []nsType{
	{"user", "user", unix.CLONE_NEWUSER}, {"mount", "mnt", unix.CLONE_NEWNS}, {"pid", "pid", unix.CLONE_NEWPID},
	{"network", "net", unix.CLONE_NEWNET}, {"ipc", "ipc", unix.CLONE_NEWIPC}, {"uts", "uts", unix.CLONE_NEWUTS},
	{"cgroup", "cgroup", unix.CLONE_NEWCGROUP},
}

// nsType is a namespace type: its name, its user.max_<sysctl>_namespaces
// limit, its clone flag.
type nsType struct {
	name, sysctl string
	flag         uintptr
}

// errNSLimit is clone's ENOSPC: a namespace count limit is reached.
var errNSLimit = errors.New("the kernel's limit on them, /proc/sys/user/max_*_namespaces, is 0 or reached")

// preflightCmd is the hidden command the namespace probes run: it exits 0
// at once, or with "mount", mounts a tmpfs in its own mount namespace.
const preflightCmd = "sandbox-preflight"

// checkLinuxPrivileges is the startup check of `serve --sandbox linux`: root,
// the capabilities, each namespace, a mount in a new mount namespace, and
// (requireLimits) writable cgroups for the memory, cpu and pids limits. It
// returns nil or an error of one line naming what is missing and what
// grants it.
func checkLinuxPrivileges(requireLimits bool) error {
	inKube := os.Getenv("KUBERNETES_SERVICE_HOST") != ""
	hint := func(kube, host string) string {
		if inKube {
			return "grant it with the Helm chart's " + kube
		}
		return host
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the linux sandbox driver needs root, and runs as uid %d: %s", os.Geteuid(),
			hint("nodeAgent securityContext (the chart runs the agent as uid 0; do not override runAsUser)",
				"run serve as root (dist/sandgate.service)"))
	}
	eff, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("read the process's capabilities: %w", err)
	}
	var missing []string
	for _, c := range requiredCaps {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the linux sandbox driver needs capabilities %s, missing from this process: %s", strings.Join(missing, ", "),
			hint("nodeAgent.privileged=true, or nodeAgent.capabilities with these",
				"keep them in the service's capability bounding set (dist/sandgate.service lists them), or run the container --privileged"))
	}
	var denied []string
	var firstErr error
	for _, ns := range namespaces {
		if err := runPreflight(ns.flag, "ns"); err != nil {
			denied = append(denied, ns.name)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if len(denied) > 0 && errors.Is(firstErr, errNSLimit) {
		return fmt.Errorf("the linux sandbox driver cannot create %s namespaces (%v): raise the node's sysctl user.max_%s_namespaces (no container setting grants it)",
			strings.Join(denied, ", "), firstErr, namespaces[slices.IndexFunc(namespaces, func(n nsType) bool { return n.name == denied[0] })].sysctl)
	}
	if len(denied) > 0 {
		return fmt.Errorf("the linux sandbox driver cannot create %s namespaces (%v): %s", strings.Join(denied, ", "), firstErr,
			hint("nodeAgent.privileged=true, or nodeAgent.seccompProfile type Unconfined (the runtime's default profile refuses unshare)",
				"allow unshare/clone of namespaces (seccomp: run the container --privileged or with seccomp=unconfined; user namespaces: sysctl user.max_user_namespaces > 0)"))
	}
	if err := runPreflight(unix.CLONE_NEWNS, "mount"); err != nil {
		return fmt.Errorf("the linux sandbox driver cannot mount in a new mount namespace (%v): %s", err,
			hint("nodeAgent.privileged=true, or nodeAgent.appArmorProfile type Unconfined (the runtime's default AppArmor profile refuses mount)",
				"lift the AppArmor or SELinux confinement that refuses mount (docker: --privileged or --security-opt apparmor=unconfined)"))
	}
	if requireLimits {
		plan := cgroup.Detect()
		var unenforced, reasons []string
		for _, c := range []string{"memory", "cpu", "pids"} {
			if why := plan.Missing(c); why != "" {
				unenforced = append(unenforced, c)
				reasons = append(reasons, why)
			}
		}
		if len(unenforced) > 0 {
			return fmt.Errorf("--sandbox-require-limits: the %s limits cannot be enforced (%s): %s", strings.Join(unenforced, ", "), reasons[0],
				hint("nodeAgent.privileged=true, or nodeAgent.hostCgroup=true (the node's /sys/fs/cgroup, writable)",
					"give serve a writable cgroup tree (/sys/fs/cgroup), or leave --sandbox-require-limits off to run sandboxes without these limits"))
		}
	}
	return nil
}

// effectiveCaps reads CapEff from /proc/self/status.
func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff line in /proc/self/status")
}

// runPreflight runs this binary's preflight command in new namespaces
// (flags), to see whether the kernel, seccomp and AppArmor allow them.
func runPreflight(flags uintptr, what string) error {
	cmd := exec.Command("/proc/self/exe", preflightCmd, what)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	// A new user namespace gets no id mappings: the probe only has to be
	// made and exit (its ids are the overflow ones). Mapping the host's
	// root would need CAP_SETFCAP, which the driver does not need and
	// dist/sandgate.service leaves out of the bounding set.
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.ENOSPC) { // clone's answer past a namespace count limit
			return errNSLimit
		}
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			if s := strings.TrimSpace(out.String()); s != "" {
				return errors.New(s)
			}
			return err
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return errors.New("the probe did not finish in 10s")
	}
}

// preflightMain is the hidden preflight command, run by runPreflight in
// new namespaces. With "mount" it makes its (new) mount namespace private
// and mounts a tmpfs on /tmp in it, which only it sees, then exits.
func preflightMain(args []string) int {
	if len(args) == 1 && args[0] == "mount" {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fmt.Fprintf(os.Stderr, "make / private: %v\n", err)
			return 1
		}
		if err := unix.Mount("sandgate-preflight", os.TempDir(), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=4k"); err != nil {
			fmt.Fprintf(os.Stderr, "mount tmpfs: %v\n", err)
			return 1
		}
	}
	return 0
}

// hostMemory is the host's memory in bytes (0: unknown), which sizes the
// auto warm pool (autoWarmPoolFor).
func hostMemory() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}
