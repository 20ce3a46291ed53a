package main

import (
	"flag"

	"github.com/sandgate/sandgate/sandbox"
)

// registerSandboxFlags adds the per-sandbox limit flags to fs and returns
// the limits they fill in.
func registerSandboxFlags(fs *flag.FlagSet) *sandbox.Limits {
	l := &sandbox.Limits{}
	fs.Int64Var(&l.MemoryBytes, "sandbox-memory", 512<<20, "memory limit per sandbox, bytes")
	fs.Int64Var(&l.Pids, "sandbox-pids", 256, "process limit per sandbox")
	fs.Float64Var(&l.CPUs, "sandbox-cpus", 1, "CPU limit per sandbox, cores")
	fs.Int64Var(&l.TmpBytes, "sandbox-tmp-size", 256<<20, "size of each sandbox's /tmp, bytes")
	fs.Int64Var(&l.WorkspaceBytes, "sandbox-workspace-size", 1<<30, "size of each sandbox's workspace, bytes")
	return l
}
