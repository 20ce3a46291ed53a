package sandbox

import (
	"fmt"
	"log/slog"
	"path/filepath"
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
}

// Limits bound one sandbox. Zero values get each driver's defaults.
type Limits struct {
	MemoryBytes    int64   // memory cgroup limit (default 512 MiB)
	Pids           int64   // pids cgroup limit (default 256)
	CPUs           float64 // CPU quota in cores (default 1)
	TmpBytes       int64   // size of the private /tmp
	WorkspaceBytes int64   // size of the workspace filesystem
}

// Open returns the driver called name: "workdir", or "auto" for the best
// driver this host supports.
func Open(name string, cfg Config) (Driver, error) {
	switch name {
	case "auto", "workdir":
		cfg.Log.Warn("sandbox driver workdir: sessions are plain directories and processes run as the gateway's user; this does NOT isolate sessions from the host or from each other")
		return NewWorkdir(WorkdirConfig{Root: filepath.Join(cfg.DataDir, "sessions"), SelfExe: cfg.SelfExe})
	}
	return nil, fmt.Errorf("unknown sandbox driver %q (want auto or workdir)", name)
}

// Reporter is implemented by drivers that can tell which limits they enforce
// on this host; /readyz and start-up logs show it.
type Reporter interface {
	Report() map[string]any
}
