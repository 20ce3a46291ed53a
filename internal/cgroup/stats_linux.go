//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Usage is what a sandbox's cgroups count now. Nil fields were not found
// (the controller is not used on this host, or the kernel lacks the file).
type Usage struct {
	MemoryBytes, MemoryPeakBytes *int64
	CPUSeconds                   *float64
	Pids                         *int64
}

// ReadUsage reads the counters of one sandbox's cgroups, dirs as
// Plan.DirsFor lists them. On v1 it reads the init's cgroups, whose
// counters include the commands' (procs) below them; on v2 the one cgroup.
// Each counter is taken from the first dir that has its file.
func ReadUsage(dirs []string) Usage {
	var u Usage
	for _, dir := range dirs {
		if filepath.Base(dir) == "procs" {
			continue // a v1 child: its parent counts it too
		}
		if u.MemoryBytes == nil {
			u.MemoryBytes = firstInt(dir, "memory.current", "memory.usage_in_bytes")
		}
		if u.MemoryPeakBytes == nil {
			u.MemoryPeakBytes = firstInt(dir, "memory.peak", "memory.max_usage_in_bytes")
		}
		if u.Pids == nil {
			u.Pids = firstInt(dir, "pids.current")
		}
		if u.CPUSeconds == nil {
			u.CPUSeconds = cpuSeconds(dir)
		}
	}
	return u
}

// firstInt is the integer in the first of files (in dir) that exists.
func firstInt(dir string, files ...string) *int64 {
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return &n
		}
	}
	return nil
}

// cpuSeconds is the CPU time of dir: cpuacct.usage (nanoseconds, v1) or
// cpu.stat's usage_usec (v2).
func cpuSeconds(dir string) *float64 {
	if ns := firstInt(dir, "cpuacct.usage"); ns != nil {
		s := float64(*ns) / 1e9
		return &s
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			if us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				s := float64(us) / 1e6
				return &s
			}
		}
	}
	return nil
}
