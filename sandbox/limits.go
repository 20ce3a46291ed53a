package sandbox

import "log/slog"

// Config is what every driver may need from the gateway.
type Config struct {
	// DataDir is the gateway's data dir; drivers keep their state under it.
	DataDir string
	// SelfExe is the sandgate binary (default: os.Executable).
	SelfExe string
	Log     *slog.Logger
	// Limits are per-sandbox resource limits, for drivers that enforce them.
	Limits Limits
	// KeepOrphans, for the linuxns driver, leaves the sandboxes of a
	// previous run of the gateway alone at start so that they can be
	// re-adopted (Reattacher). By default the driver reaps them: it kills
	// their init, removes their cgroups, mounts and directories.
	KeepOrphans bool
	// AllowUserNS, for the linuxns driver, lets sandbox processes create
	// user namespaces (serve --sandbox-allow-userns); by default its
	// seccomp filter refuses them.
	AllowUserNS bool
	// Nofile is every sandbox process's RLIMIT_NOFILE, for drivers that
	// set it (linux): never the gateway's own, raised one. Zero fields get
	// DefaultNofileSoft and DefaultNofileHard.
	Nofile Nofile
	// Checkpoint, for the linuxns driver, builds sandboxes that CRIU can
	// checkpoint (serve --checkpoint): their init names no command's tree
	// by a UTS namespace of its own and holds nothing of the host that a
	// checkpoint cannot carry (docs/pause.md, "Fork").
	Checkpoint bool
	// CRIU is the criu binary checkpoints run ("": criu, looked up in
	// PATH).
	CRIU string
	// PauseFreeze keeps pauses a freeze under Checkpoint (serve
	// --pause-freeze): by default a checkpointable sandbox is paused by
	// a checkpoint to disk (docs/pause.md).
	PauseFreeze bool
	// EagerForks has a fork's restore copy its processes' memory in
	// before they run (serve --fork-eager), rather than on demand with
	// CRIU's lazy pages where the criu can (docs/fork.md): slower forks,
	// but a forked process that forks while its memory comes in shares
	// its pages with its children, as after a plain fork.
	EagerForks bool
}

// Nofile is an RLIMIT_NOFILE: Soft is what a process starts with, Hard is
// as far as it may raise it.
type Nofile struct{ Soft, Hard uint64 }

// The default RLIMIT_NOFILE of sandbox processes: the usual Linux login's.
const (
	DefaultNofileSoft = 1024
	DefaultNofileHard = 4096
)

// WithDefaults fills the zero fields of n, and keeps Soft at most Hard.
func (n Nofile) WithDefaults() Nofile {
	if n.Hard == 0 {
		n.Hard = max(DefaultNofileHard, n.Soft)
	}
	if n.Soft == 0 {
		n.Soft = min(DefaultNofileSoft, n.Hard)
	}
	n.Soft = min(n.Soft, n.Hard)
	return n
}

// Limits bound one sandbox. Zero values get each driver's defaults.
type Limits struct {
	MemoryBytes    int64   // memory cgroup limit (default 512 MiB)
	Pids           int64   // pids cgroup limit (default 256)
	CPUs           float64 // CPU quota in cores (default 1)
	TmpBytes       int64   // size of the private /tmp (default 256 MiB)
	WorkspaceBytes int64   // size of the workspace filesystem (default 1 GiB)
}

// Default limits, used for every zero field of Limits.
const (
	DefaultMemoryBytes    = 512 << 20
	DefaultPids           = 256
	DefaultCPUs           = 1.0
	DefaultTmpBytes       = 256 << 20
	DefaultWorkspaceBytes = 1 << 30
)

// WithDefaults fills the zero fields of l with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.Pids <= 0 {
		l.Pids = DefaultPids
	}
	if l.CPUs <= 0 {
		l.CPUs = DefaultCPUs
	}
	if l.TmpBytes <= 0 {
		l.TmpBytes = DefaultTmpBytes
	}
	if l.WorkspaceBytes <= 0 {
		l.WorkspaceBytes = DefaultWorkspaceBytes
	}
	return l
}

// Or returns l with each zero field taken from def: a session's own limits
// over the driver's.
func (l Limits) Or(def Limits) Limits {
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.Pids <= 0 {
		l.Pids = def.Pids
	}
	if l.CPUs <= 0 {
		l.CPUs = def.CPUs
	}
	if l.TmpBytes <= 0 {
		l.TmpBytes = def.TmpBytes
	}
	if l.WorkspaceBytes <= 0 {
		l.WorkspaceBytes = def.WorkspaceBytes
	}
	return l
}
