package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// sandboxFlags are the per-sandbox limits (the defaults of every session)
// and the caps on what a create may ask for.
type sandboxFlags struct {
	limits sandbox.Limits
	// max caps a session's resources; zero fields are 4 times the default.
	max sandbox.Limits
	// allowUserNS lets sandbox processes create user namespaces (linux).
	allowUserNS bool
	// nofile is every sandbox process's RLIMIT_NOFILE (linux).
	nofile sandbox.Nofile
	// warmPool is how many default-root sandboxes are kept built for
	// creates to claim (linux; gateway.Config.WarmPool); autoWarmPool
	// (-1): as many as the host's memory pays for (warmPoolFor).
	warmPool int
	// warmImageTTL, warmImages and warmMemory are the pools of the
	// images used lately (gateway.Config.WarmPoolImageTTL and friends).
	warmImageTTL time.Duration
	warmImages   int
	warmMemory   int64
	// teardownQueue is how many deleted sessions' sandboxes are released
	// in the background at once (gateway.Config.TeardownQueue).
	teardownQueue int
	// requireLimits refuses to start when the linux driver cannot
	// enforce the memory, cpu and pids limits (preflight_linux.go).
	requireLimits bool
	// serverTiming shows each step of a create, and of a fork, in its
	// Server-Timing header, and times commands (rest.Config.ServerTiming).
	serverTiming bool
	// checkpoint builds checkpointable sandboxes, which fork can copy
	// (linux; sandbox.Config.Checkpoint), with the criu binary at criu.
	checkpoint  bool
	criu        string
	pauseFreeze bool
	forkEager   bool
}

// registerSandboxFlags adds the per-sandbox limit flags to fs. The linux
// driver enforces the limits (and reports at start-up and in /readyz any it
// cannot enforce on the host); the workdir driver does not.
func registerSandboxFlags(fs *flag.FlagSet) *sandboxFlags {
	f := &sandboxFlags{limits: sandbox.Limits{
		MemoryBytes: sandbox.DefaultMemoryBytes, Pids: sandbox.DefaultPids, CPUs: sandbox.DefaultCPUs,
		TmpBytes: sandbox.DefaultTmpBytes, WorkspaceBytes: sandbox.DefaultWorkspaceBytes,
	}}
	l, m := &f.limits, &f.max
	fs.Var((*sizeFlag)(&l.MemoryBytes), "sandbox-memory", "default memory limit per sandbox (cgroup): bytes or a size such as 512MiB, 4GiB")
	fs.Int64Var(&l.Pids, "sandbox-pids", sandbox.DefaultPids, "default process and thread limit per sandbox (cgroup)")
	fs.Float64Var(&l.CPUs, "sandbox-cpus", sandbox.DefaultCPUs, "default CPU limit per sandbox, cores (cgroup)")
	fs.Var((*sizeFlag)(&l.TmpBytes), "sandbox-tmp-size", "size of each sandbox's /tmp (tmpfs, counts as memory): bytes or a size such as 256MiB")
	fs.Var((*sizeFlag)(&l.WorkspaceBytes), "sandbox-workspace-size", "size of each sandbox's /workspace filesystem: bytes or a size such as 1GiB")
	fs.Var((*sizeFlag)(&m.MemoryBytes), "sandbox-max-memory", "largest resources.memoryMiB a create may ask for: bytes or a size such as 2GiB (default 4 x --sandbox-memory)")
	fs.Int64Var(&m.Pids, "sandbox-max-pids", 0, "largest resources.pids a create may ask for (default 4 x --sandbox-pids)")
	fs.Float64Var(&m.CPUs, "sandbox-max-cpus", 0, "largest resources.cpus a create may ask for (default 4 x --sandbox-cpus)")
	fs.Uint64Var(&f.nofile.Soft, "sandbox-nofile", sandbox.DefaultNofileSoft, "open files per sandbox process (RLIMIT_NOFILE soft limit, linux driver)")
	fs.Uint64Var(&f.nofile.Hard, "sandbox-nofile-hard", sandbox.DefaultNofileHard, "open files a sandbox process may raise its limit to (RLIMIT_NOFILE hard limit, linux driver)")
	fs.BoolVar(&f.allowUserNS, "sandbox-allow-userns", false, "let sandbox processes create user namespaces (rootless containers, bwrap); by default the linux driver's seccomp filter refuses them with EPERM")
	fs.BoolVar(&f.requireLimits, "sandbox-require-limits", false, "with --sandbox linux, refuse to start when the memory, cpus and pids limits cannot be enforced (no writable cgroup for them) instead of running sandboxes without them; the Helm chart sets it")
	f.warmPool = autoWarmPool
	fs.Var((*poolSizeFlag)(&f.warmPool), "warm-pool", "how many sandboxes of the default image are kept built and idle for creates to claim, `N|auto` (linux driver; 0 disables; auto: four per GiB of the host's memory, 8 to 64)")
	fs.DurationVar(&f.warmImageTTL, "warm-pool-image-ttl", defaultWarmImageTTL, "with --warm-pool, an image a create used within this long keeps min(--warm-pool, 2) sandboxes of its own built and idle (0 disables)")
	fs.IntVar(&f.warmImages, "warm-pool-images", gateway.DefaultWarmPoolImages, "images with a warm pool of their own at once; the least recently used pool drains for a new one")
	f.warmMemory = gateway.DefaultWarmPoolMemory
	fs.Var((*sizeFlag)(&f.warmMemory), "warm-pool-memory", "memory the warm sandboxes may use in all (their cgroups' count) before the images' pools stop adding: bytes or a size such as 256MiB")
	fs.BoolVar(&f.serverTiming, "server-timing", false, "show each step of a create (warm pool claim, cgroups, init...) in the Server-Timing header of POST /v1/sessions, and of a fork (checkpoint, restores, images removed) in POST /v1/sessions/{id}/fork's; time a command's start and run, and say whether the shell ran it, in its JSON answer's; off: the totals only, as a create's steps tell a tenant whether other tenants emptied the warm pool")
	fs.IntVar(&f.teardownQueue, "teardown-queue", defaultTeardownQueue, "sandboxes of ended sessions released in the background at once: DELETE answers once the session is unreachable (0: DELETE waits for the release)")
	fs.BoolVar(&f.checkpoint, "checkpoint", false, "build sandboxes that CRIU can checkpoint, so that POST /v1/sessions/{id}/fork can copy a running session (linux driver; needs CRIU 4.x: --criu; docs/fork.md)")
	fs.StringVar(&f.criu, "criu", "criu", "the criu binary --checkpoint runs (4.x)")
	fs.BoolVar(&f.forkEager, "fork-eager", false, "with --checkpoint, a fork's restore copies all of its processes' memory in before they run, rather than on demand (CRIU lazy pages, with .ci/criu-patches 0006): forks take longer, but a forked process that forks while its memory is being copied does not give its children copies of their own of the pages not there yet (docs/fork.md)")
	fs.BoolVar(&f.pauseFreeze, "pause-freeze", false, "with --checkpoint, pause sessions by a freeze (fast to resume, memory kept) rather than a CRIU checkpoint to disk (memory freed, resume ~0.15-0.5 s; docs/pause.md)")
	fs.Var((*sizeFlag)(&m.WorkspaceBytes), "sandbox-max-disk", "largest resources.diskMiB a create may ask for: bytes or a size such as 4GiB (default 4 x --sandbox-workspace-size)")
	return f
}

// bounds are the flags as the gateway's resource defaults and caps, in
// MiB (sizes round down); a cap below its default is an error.
func (f *sandboxFlags) bounds() (gateway.ResourceBounds, error) {
	l, m := f.limits, f.max
	const mib = 1 << 20
	b := gateway.ResourceBounds{
		Default: gateway.Resources{MemoryMiB: l.MemoryBytes / mib, CPUs: l.CPUs, Pids: l.Pids, DiskMiB: l.WorkspaceBytes / mib},
		Max:     gateway.Resources{MemoryMiB: m.MemoryBytes / mib, CPUs: m.CPUs, Pids: m.Pids, DiskMiB: m.WorkspaceBytes / mib},
		// Until the driver is known (--sandbox auto may fall back to
		// workdir), a workspace is taken to have the default size:
		// forDriver says whether the driver sizes each session's.
		DiskFixed: true,
	}
	for _, c := range []struct {
		name      string
		def, max  float64
		given     bool
		defFlag   string
		minOfFlag float64
	}{
		{"--sandbox-max-memory", float64(l.MemoryBytes), float64(m.MemoryBytes), m.MemoryBytes != 0, "--sandbox-memory", gateway.MinMemoryMiB * mib},
		{"--sandbox-max-cpus", l.CPUs, m.CPUs, m.CPUs != 0, "--sandbox-cpus", gateway.MinCPUs},
		{"--sandbox-max-pids", float64(l.Pids), float64(m.Pids), m.Pids != 0, "--sandbox-pids", gateway.MinPids},
		{"--sandbox-max-disk", float64(l.WorkspaceBytes), float64(m.WorkspaceBytes), m.WorkspaceBytes != 0, "--sandbox-workspace-size", gateway.MinDiskMiB * mib},
	} {
		if c.def < c.minOfFlag {
			return b, fmt.Errorf("%s is below the smallest a session may have (%v)", c.defFlag, c.minOfFlag)
		}
		if c.given && c.max < c.def {
			return b, fmt.Errorf("%s is below %s", c.name, c.defFlag)
		}
	}
	if n := f.nofile; n.Soft < minNofile || n.Hard < n.Soft {
		return b, fmt.Errorf("--sandbox-nofile must be at least %d, and --sandbox-nofile-hard at least --sandbox-nofile (got %d and %d)", minNofile, n.Soft, n.Hard)
	}
	if (f.warmPool < 0 && f.warmPool != autoWarmPool) || f.warmPool > maxWarmPool {
		return b, fmt.Errorf("--warm-pool must be auto or between 0 and %d, got %d", maxWarmPool, f.warmPool)
	}
	if f.warmImageTTL < 0 || f.warmImages < 1 || f.warmImages > maxWarmPool || f.warmMemory < 0 {
		return b, fmt.Errorf("--warm-pool-image-ttl must not be negative, --warm-pool-images must be between 1 and %d, --warm-pool-memory not negative (got %v, %d, %d)",
			maxWarmPool, f.warmImageTTL, f.warmImages, f.warmMemory)
	}
	if f.teardownQueue < 0 || f.teardownQueue > maxTeardownQueue {
		return b, fmt.Errorf("--teardown-queue must be between 0 and %d, got %d", maxTeardownQueue, f.teardownQueue)
	}
	return b, nil
}

// defaultTeardownQueue and maxTeardownQueue are --teardown-queue's
// default and bound: each release under way holds a goroutine and the
// sandbox's host resources a little longer. The default is twice the
// largest warm pool, so that a burst that takes a whole pool and deletes
// each session defers every release until the burst pauses (a release
// starts at once past three quarters of the queue: with 64, the releases
// of a burst of 60 began 48 creates in, and its last creates' p99 went
// from 6-10 to 13-17 ms; bench/results/s56-pool.md).
const (
	defaultTeardownQueue = 128
	maxTeardownQueue     = 4096
)

// maxWarmPool bounds --warm-pool: each warm sandbox holds an idle init's
// memory, a uid range and a workspace, for no session.
const maxWarmPool = 64

// minNofile is the smallest --sandbox-nofile: a shell and its pipes.
const minNofile = 64

// workspaceSizer is a driver that gives each sandbox the workspace size
// its Spec.Limits asks (the linux driver; the workdir driver has no
// workspace size at all).
type workspaceSizer interface{ SizesWorkspaces() bool }

// forDriver returns b for driver d: a requested diskMiB is the session's
// workspace size where d sizes workspaces (DiskFixed false), and only
// checked against the cap where it does not.
func forDriver(b gateway.ResourceBounds, d sandbox.Driver) gateway.ResourceBounds {
	ws, ok := d.(workspaceSizer)
	b.DiskFixed = !ok || !ws.SizesWorkspaces()
	return b
}

// sizeFlag is a size in bytes, given as a number of bytes or with a
// binary unit suffix: B, KiB, MiB, GiB, TiB (case-insensitive).
type sizeFlag int64

func (s *sizeFlag) String() string {
	if s == nil {
		return "0"
	}
	return formatSize(int64(*s))
}

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"tib", 40}, {"gib", 30}, {"mib", 20}, {"kib", 10}, {"b", 0}}

// parseSize reads "4294967296", "4GiB", "512 MiB", "1.5GiB".
func parseSize(v string) (int64, error) {
	s := strings.ToLower(strings.TrimSpace(v))
	shift := uint(0)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, shift = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.shift
			break
		}
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || (shift > 0 && n > math.MaxInt64>>shift) {
			return 0, fmt.Errorf("size %q out of range", v)
		}
		return n << shift, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || shift == 0 || math.IsNaN(f) {
		return 0, errors.New("want bytes or a size such as 512MiB or 4GiB (units B, KiB, MiB, GiB, TiB)")
	}
	b := f * float64(uint64(1)<<shift)
	if b < 0 || b >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q out of range", v)
	}
	return int64(b), nil
}

// formatSize is n with the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range sizeUnits[:4] {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + map[uint]string{40: "TiB", 30: "GiB", 20: "MiB", 10: "KiB"}[u.shift]
		}
	}
	return strconv.FormatInt(n, 10)
}

// autoWarmPool is --warm-pool's default, auto: the pool holds
// warmPoolPerGiB sandboxes per GiB of the host's memory (rounded to whole
// GiB: a 16 GiB host's kernel reports a little less), at least
// minAutoWarmPool and at most maxWarmPool. A warm sandbox costs the host
// about 2 MiB (its idle init, its namespaces, mounts and loop device: 64
// took 112-136 MiB of MemAvailable on this 2-core host), so the pool takes
// under 1% of the memory, and a burst of creates up to its size finds
// sandboxes ready: issue 41's row 11e (a plain client, creates back to
// back, best of 3 runs of 60; 2 cores, quiet) gave p50 2.0 / p99 12.3 ms
// with 64 against 5.5 / 24.2 ms with 8 (bench/results/s56-pool.md). Past
// the pool, creates back to back are bound by the CPU a build and a
// teardown take (~25 ms a cycle on 2 cores), whatever its size.
const (
	autoWarmPool    = -1
	minAutoWarmPool = 8
	warmPoolPerGiB  = 4
)

// autoWarmPoolFor is the auto pool's size on a host with mem bytes of
// memory.
func autoWarmPoolFor(mem uint64) int {
	gib := (mem + 1<<29) >> 30
	return int(min(max(gib*warmPoolPerGiB, minAutoWarmPool), maxWarmPool))
}

// poolSizeFlag is --warm-pool: a number, or auto (autoWarmPool).
type poolSizeFlag int

func (p *poolSizeFlag) String() string {
	if p == nil || *p == autoWarmPool {
		return "auto"
	}
	return strconv.Itoa(int(*p))
}

func (p *poolSizeFlag) Set(v string) error {
	if strings.TrimSpace(v) == "auto" {
		*p = autoWarmPool
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return fmt.Errorf("want a number of sandboxes (0 disables) or auto, got %q", v)
	}
	*p = poolSizeFlag(n)
	return nil
}

// defaultWarmImageTTL is --warm-pool-image-ttl's default: an image in
// use keeps its pool through the pauses of an agent's work.
const defaultWarmImageTTL = 10 * time.Minute

// warmPoolFor is --warm-pool for driver d: the workdir driver's sandboxes
// are directories, quick to make, so it keeps none.
func (f *sandboxFlags) warmPoolFor(d sandbox.Driver) int {
	if d.Name() != "linux" {
		return 0
	}
	if f.warmPool == autoWarmPool {
		return autoWarmPoolFor(hostMemory())
	}
	return f.warmPool
}
