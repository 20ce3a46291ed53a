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
	cfg.Log.Warn("NO ISOLATION: sandbox driver workdir: sessions are plain directories and processes run as the gateway's user, with the host's files and network; nothing enforces memory, cpus, pids or disk limits; session answers say \"isolation\": \"none\"; run as root with --sandbox linux to isolate")
	d, err := workdir.New(workdir.Config{Root: filepath.Join(cfg.DataDir, "sessions"), SelfExe: cfg.SelfExe})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// isolation is what session answers say of the driver's isolation: "none"
// for workdir (and every limit unenforced), else "" with the limits the
// host cannot enforce (the linux driver's report), as the API names them.
func isolation(d sandbox.Driver) (string, []string) {
	if d.Name() == "workdir" {
		return "none", []string{"memoryMiB", "cpus", "pids", "diskMiB"}
	}
	r, ok := d.(sandbox.Reporter)
	if !ok {
		return "", nil
	}
	names, _ := r.Report()["unenforced"].([]string)
	api := map[string]string{"memory": "memoryMiB", "cpu": "cpus", "pids": "pids"}
	var out []string
	for _, n := range names {
		if a, ok := api[n]; ok {
			out = append(out, a)
		}
	}
	return "", out
}
