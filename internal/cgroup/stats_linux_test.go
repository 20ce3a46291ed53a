//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
	"testing"
)

// writeFiles makes dir with the given files (name -> content).
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// ReadUsage on the file layouts of both cgroup versions (this host's real
// cgroups are read by cmd/sandgate's TestLinuxSessionStats; a v2 host's
// files are laid out here as the kernel documents them).
func TestReadUsage(t *testing.T) {
	t.Run("v1", func(t *testing.T) {
		root := t.TempDir()
		mem, pids, cpu, acct := filepath.Join(root, "memory/sandgate/s"), filepath.Join(root, "pids/sandgate/s"),
			filepath.Join(root, "cpu/sandgate/s"), filepath.Join(root, "cpuacct/sandgate/s")
		writeFiles(t, mem, map[string]string{"memory.usage_in_bytes": "1048576\n", "memory.max_usage_in_bytes": "2097152\n"})
		writeFiles(t, mem+"/procs", map[string]string{"memory.usage_in_bytes": "1\n"})
		writeFiles(t, pids, map[string]string{"pids.current": "7\n"})
		writeFiles(t, cpu, map[string]string{"cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n"})
		writeFiles(t, acct, map[string]string{"cpuacct.usage": "1500000000\n"})
		u := ReadUsage([]string{mem + "/procs", pids + "/procs", cpu + "/procs", acct + "/procs", mem, pids, cpu, acct})
		if u.MemoryBytes == nil || *u.MemoryBytes != 1<<20 || u.MemoryPeakBytes == nil || *u.MemoryPeakBytes != 2<<20 {
			t.Errorf("memory %v %v", u.MemoryBytes, u.MemoryPeakBytes)
		}
		if u.Pids == nil || *u.Pids != 7 || u.CPUSeconds == nil || *u.CPUSeconds != 1.5 {
			t.Errorf("pids %v cpu %v", u.Pids, u.CPUSeconds)
		}
	})
	t.Run("v2", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "sandgate/s")
		writeFiles(t, dir, map[string]string{
			"memory.current": "4096\n", "pids.current": "3\n",
			"cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		})
		u := ReadUsage([]string{dir})
		if u.MemoryBytes == nil || *u.MemoryBytes != 4096 || u.MemoryPeakBytes != nil {
			t.Errorf("memory %v, peak %v (no memory.peak: unknown)", u.MemoryBytes, u.MemoryPeakBytes)
		}
		if u.Pids == nil || *u.Pids != 3 || u.CPUSeconds == nil || *u.CPUSeconds != 2.5 {
			t.Errorf("pids %v cpu %v", u.Pids, u.CPUSeconds)
		}
	})
	t.Run("gone", func(t *testing.T) {
		if u := ReadUsage([]string{filepath.Join(t.TempDir(), "missing")}); u.MemoryBytes != nil || u.CPUSeconds != nil || u.Pids != nil {
			t.Errorf("usage of a missing cgroup: %+v", u)
		}
	})
}
