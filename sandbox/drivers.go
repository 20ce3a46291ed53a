package sandbox

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
)

// Config is what every driver may need from the gateway.
type Config struct {
	// DataDir is the gateway's data dir; drivers keep their state under it.
	DataDir string
	// SelfExe is the sandgate binary (default: os.Executable).
	SelfExe string
	Log     *slog.Logger
	// Limits are per-sandbox resource limits, for drivers that enforce them.
	Limits Limits
	// KeepOrphans, for the linux driver, leaves the sandboxes of a previous
	// run of the gateway alone at Open so that they can be re-adopted
	// (Linux.List, Linux.Adopt). By default Open reaps them: it kills their
	// init, removes their cgroups, mounts and directories.
	KeepOrphans bool
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

// withDefaults fills the zero fields of l with the defaults.
func (l Limits) withDefaults() Limits {
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

// Open returns the driver called name: "linux", "workdir", or "auto" for
// the best driver this host supports (linux where namespaces work, probed
// once here; otherwise workdir, with a warning that says why).
func Open(name string, cfg Config) (Driver, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	switch name {
	case "linux":
		return openLinux(cfg)
	case "auto":
		d, err := openLinux(cfg)
		if err == nil {
			return d, nil
		}
		cfg.Log.Warn("sandbox driver linux is unavailable on this host; falling back to workdir", "reason", err.Error())
		return openWorkdir(cfg)
	case "workdir":
		return openWorkdir(cfg)
	}
	return nil, fmt.Errorf("unknown sandbox driver %q (want auto, linux or workdir)", name)
}

func openWorkdir(cfg Config) (Driver, error) {
	cfg.Log.Warn("sandbox driver workdir: sessions are plain directories and processes run as the gateway's user; this does NOT isolate sessions from the host or from each other")
	return NewWorkdir(WorkdirConfig{Root: filepath.Join(cfg.DataDir, "sessions"), SelfExe: cfg.SelfExe})
}

// Reporter is implemented by drivers that can tell which limits they enforce
// on this host; /readyz and start-up logs show it.
type Reporter interface {
	Report() map[string]any
}

// ShortID is the short form of a session id: its hostname in a sandbox.
func ShortID(id string) string {
	s := strings.TrimPrefix(id, "sbx-")
	if len(s) > 12 {
		s = s[:12]
	}
	if s == "" {
		return "sandbox"
	}
	return s
}
