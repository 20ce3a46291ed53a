package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// openDriver returns the sandbox driver called name: "linux", "workdir",
// or "auto" for the best driver this host supports (linux where namespaces
// work, probed once here; otherwise workdir, with a warning that says why).
func openDriver(name string, cfg sandbox.Config) (sandbox.Driver, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	switch name {
	case "linux":
		d, err := linuxns.New(cfg)
		if err != nil {
			return nil, err
		}
		return d, nil
	case "auto":
		d, err := linuxns.New(cfg)
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

func openWorkdir(cfg sandbox.Config) (sandbox.Driver, error) {
	cfg.Log.Warn("sandbox driver workdir: sessions are plain directories and processes run as the gateway's user; this does NOT isolate sessions from the host or from each other")
	d, err := workdir.New(workdir.Config{Root: filepath.Join(cfg.DataDir, "sessions"), SelfExe: cfg.SelfExe})
	if err != nil {
		return nil, err
	}
	return d, nil
}
