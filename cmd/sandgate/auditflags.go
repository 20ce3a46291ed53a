package main

import (
	"flag"
	"log/slog"
	"path/filepath"

	"github.com/sandgate/sandgate/audit"
)

// auditFlags are serve's audit log flags.
type auditFlags struct {
	path     string
	maxSize  int64
	maxFiles int
}

func (a *auditFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.path, "audit-log", "", "append the audit trail (REST calls, tunnels, SSH auth, commands, file operations, egress, session lifecycle) as JSON lines to this file (default: audit.log in the data dir; \"none\" turns it off)")
	a.maxSize = audit.DefaultMaxSize
	fs.Var((*sizeFlag)(&a.maxSize), "audit-max-size", "rotate the audit log past this size: bytes or a size such as 64MiB")
	fs.IntVar(&a.maxFiles, "audit-max-files", audit.DefaultMaxFiles, "audit log files kept, the current one included (PATH, PATH.1 ... PATH.N-1)")
}

// open opens the audit log, or returns nil when it is off.
func (a *auditFlags) open(dataDir string, log *slog.Logger, met audit.Metrics) (*audit.File, error) {
	if a.path == "none" {
		return nil, nil
	}
	path := a.path
	if path == "" {
		path = filepath.Join(dataDir, "audit.log")
	}
	f, err := audit.OpenFile(audit.FileConfig{Path: path, MaxSize: a.maxSize, MaxFiles: a.maxFiles, Log: log, Metrics: met})
	if err != nil {
		return nil, err
	}
	log.Info("audit_log", "path", path, "max_size", a.maxSize, "max_files", a.maxFiles)
	return f, nil
}
