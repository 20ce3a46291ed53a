package main

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/sandgate/sandgate/sandbox"
)

// The start-up summary: a few lines an operator reads (driver and
// isolation, limits, seccomp), each a flat list of key=value pairs in
// text and JSON logs alike. /readyz keeps the driver's whole report.

// logSandboxSummary logs the driver's isolation, its limits and its
// seccomp filter, one line each.
func logSandboxSummary(log *slog.Logger, d sandbox.Driver, report map[string]any) {
	if d.Name() == "workdir" || report == nil {
		log.Info("sandbox", "driver", d.Name(), "isolation", "none")
		log.Warn("sandbox_limits", "enforced", "none", "unenforced", "memory,cpus,pids,disk")
	} else {
		var iso []string
		for _, k := range []string{"namespaces", "network", "user"} {
			if v, ok := report[k].(string); ok && v != "" {
				iso = append(iso, k+": "+v)
			}
		}
		log.Info("sandbox", "driver", d.Name(), "isolation", strings.Join(iso, "; "))
		logLimits(log, report)
	}
	sc := seccompStatus(d)
	if on, _ := sc["enabled"].(bool); !on {
		reason, _ := sc["reason"].(string)
		log.Warn("sandbox_seccomp", "filter", "off", "reason", reason)
		return
	}
	blocked, _ := sc["blocked"].([]string)
	userns := "refused"
	if ok, _ := sc["userns"].(bool); ok {
		userns = "allowed"
	}
	args := []any{"filter", "on", "arch", sc["arch"], "errno", sc["errno"], "blocked_syscalls", len(blocked),
		"user_namespaces", userns, "list", "GET /readyz"}
	if u, _ := sc["unfiltered"].([]string); len(u) > 0 {
		args = append(args, "unfiltered_sandboxes", len(u))
	}
	log.Info("sandbox_seccomp", args...)
}

// logLimits logs the linux driver's limits: their values, what enforces
// them, and those the host cannot enforce (a warning then).
func logLimits(log *slog.Logger, report map[string]any) {
	limits, _ := report["limits"].(map[string]any)
	names := make([]string, 0, len(limits))
	for n := range limits {
		names = append(names, n)
	}
	order := map[string]int{"memory": 0, "cpu": 1, "pids": 2, "tmp": 3, "workspace": 4}
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	var args []any
	var via, unenforced []string
	for _, n := range names {
		m, _ := limits[n].(map[string]any)
		key, val := n, ""
		switch {
		case m["bytes"] != nil:
			val = ibytes(toInt64(m["bytes"]))
		case m["cores"] != nil:
			key, val = "cpus", fmt.Sprint(m["cores"])
		case m["max"] != nil:
			val = fmt.Sprint(m["max"])
		}
		args = append(args, key, val)
		if ok, _ := m["enforced"].(bool); ok {
			if v, _ := m["via"].(string); v != "" && !contains(via, v) {
				via = append(via, v)
			}
		} else {
			reason, _ := m["reason"].(string)
			unenforced = append(unenforced, n+" ("+reason+")")
		}
	}
	args = append(args, "enforced_by", strings.Join(via, ", "))
	if len(unenforced) == 0 {
		log.Info("sandbox_limits", append(args, "unenforced", "none")...)
		return
	}
	log.Warn("sandbox_limits", append(args, "unenforced", strings.Join(unenforced, "; "))...)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case uint64:
		return int64(n)
	case float64:
		return int64(n)
	}
	return 0
}

// ibytes is n in binary units, as the size flags take them: 512MiB,
// 1.5GiB.
func ibytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	f, units := float64(n), []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	i := -1
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	s := fmt.Sprintf("%.1f", f)
	return strings.TrimSuffix(s, ".0") + units[i]
}
