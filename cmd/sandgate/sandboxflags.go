package main

import (
	"flag"

	"github.com/sandgate/sandgate/sandbox"
)

// registerSandboxFlags adds the per-sandbox limit flags to fs and returns
// the limits they fill in. The linux driver enforces them (and reports at
// start-up and in /readyz any it cannot enforce on the host); the workdir
// driver does not.
func registerSandboxFlags(fs *flag.FlagSet) *sandbox.Limits {
	l := &sandbox.Limits{}
	fs.Int64Var(&l.MemoryBytes, "sandbox-memory", sandbox.DefaultMemoryBytes, "memory limit per sandbox, bytes (cgroup)")
	fs.Int64Var(&l.Pids, "sandbox-pids", sandbox.DefaultPids, "process and thread limit per sandbox (cgroup)")
	fs.Float64Var(&l.CPUs, "sandbox-cpus", sandbox.DefaultCPUs, "CPU limit per sandbox, cores (cgroup)")
	fs.Int64Var(&l.TmpBytes, "sandbox-tmp-size", sandbox.DefaultTmpBytes, "size of each sandbox's /tmp, bytes (tmpfs, counts as memory)")
	fs.Int64Var(&l.WorkspaceBytes, "sandbox-workspace-size", sandbox.DefaultWorkspaceBytes, "size of each sandbox's /workspace filesystem, bytes")
	return l
}
