package main

import (
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/sandbox"
)

// ptysPerSandbox is how many terminals one linux sandbox may hold at once
// (its devpts's max=, set by the init).
const ptysPerSandbox = 64

// hostPools are the host's kernel-wide pools that every sandbox draws on,
// as /proc/sys shows them; zero where unknown.
type hostPools struct {
	fileMax    int64 // fs.file-max: open files, host-wide
	ptyMax     int64 // kernel.pty.max: terminals, host-wide
	ptyReserve int64 // kernel.pty.reserve: of those, kept for the host's own
}

// readHostPools reads the pools from /proc/sys.
func readHostPools() hostPools {
	read := func(name string) int64 {
		b, err := os.ReadFile("/proc/sys/" + name)
		if err != nil {
			return 0
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0
		}
		return n
	}
	return hostPools{fileMax: read("fs/file-max"), ptyMax: read("kernel/pty/max"), ptyReserve: read("kernel/pty/reserve")}
}

// sandboxDemand is what the gateway's sandboxes may take of the host's
// pools at worst: every session at its bounds.
type sandboxDemand struct {
	maxSessions int
	maxPids     int64 // the most pids a session may have (--sandbox-max-pids)
	nofile      sandbox.Nofile
}

// warnHostPools warns, naming the knobs, where the sandboxes could take a
// host-wide pool from everyone on the host, the gateway included: open
// files (pids x nofile hard limit x sessions against fs.file-max, which
// they must stay well below: half) and terminals (64 per sandbox x
// sessions against kernel.pty.max less its reserve).
func warnHostPools(log *slog.Logger, p hostPools, d sandboxDemand) {
	sessions := int64(d.maxSessions)
	if p.fileMax > 0 && sessions > 0 {
		// Each process at the hard limit (the init's descriptors for its
		// commands are within this count).
		hard := d.nofile.Hard
		if files := mulSat(mulSat(sessions, d.maxPids), int64(min(hard, math.MaxInt64))); files > p.fileMax/2 {
			log.Warn("host_file_table",
				"hint", "sandboxes at their bounds could open more files than half the host's fs.file-max, and so exhaust the file table for every process on the host, the gateway included: lower --max-sessions, --sandbox-max-pids or --sandbox-nofile-hard, or raise fs.file-max (sysctl -w fs.file-max=N)",
				"fs_file_max", p.fileMax, "max_sessions", sessions, "max_pids", d.maxPids,
				"nofile_hard", hard, "worst_case_files", files)
		}
	}
	if p.ptyMax > 0 && sessions > 0 {
		if ptys := sessions * ptysPerSandbox; ptys > p.ptyMax-p.ptyReserve {
			log.Warn("host_pty_pool",
				"hint", "sandboxes at their bounds could open every terminal the host has (64 per sandbox): lower --max-sessions, or raise kernel.pty.max (sysctl -w kernel.pty.max=N)",
				"kernel_pty_max", p.ptyMax, "kernel_pty_reserve", p.ptyReserve, "max_sessions", sessions,
				"worst_case_ptys", ptys)
		}
	}
}

// mulSat is a*b for non-negative a and b, saturated at math.MaxInt64.
func mulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
