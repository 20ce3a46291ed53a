package linuxns

import "github.com/sandgate/sandgate/sandbox"

// The optional interfaces of package sandbox that this driver implements,
// checked at compile time. Each caller finds them with a type assertion
// (sandbox.As behind the gateway's wrapper); none is part of
// sandbox.Sandbox, as each has callers that work without it.
var (
	_ sandbox.Driver     = (*Driver)(nil)
	_ sandbox.Reporter   = (*Driver)(nil) // limits enforced on this host: logged, /readyz
	_ sandbox.Reattacher = (*Driver)(nil) // sandboxes outlive the gateway

	_ sandbox.Sandbox        = (*linuxSandbox)(nil)
	_ sandbox.ProxyListener  = (*linuxSandbox)(nil) // egress proxy inside its network namespace
	_ sandbox.TransparentNet = (*linuxSandbox)(nil) // every TCP connection and DNS, to the egress proxy
	_ sandbox.LoopbackDialer = (*linuxSandbox)(nil) // ssh -L and previews
	_ sandbox.Detacher       = (*linuxSandbox)(nil) // --keep-sandboxes-on-exit
	_ sandbox.Keeper         = (*linuxSandbox)(nil) // Cmd.Keep across gateway restarts
	_ sandbox.Ender          = (*linuxSandbox)(nil) // its init may die
	_ sandbox.Stopper        = (*linuxSandbox)(nil) // stop and resume (stop_linux.go)
	_ sandbox.Pauser         = (*linuxSandbox)(nil) // pause in place (pause_linux.go)
	_ sandbox.Freezer        = (*linuxSandbox)(nil) // snapshots (freeze_linux.go)
	_ sandbox.Checkpointer   = (*linuxSandbox)(nil) // fork (checkpoint_linux.go, with Config.Checkpoint)
	_ sandbox.WorkspaceHomer = (*linuxSandbox)(nil) // an image's /workspace is home/
	_ sandbox.Statser        = (*linuxSandbox)(nil) // cgroups and statfs (stats_linux.go)

	_ sandbox.Process   = (*initProcess)(nil)
	_ sandbox.PIDer     = (*initProcess)(nil)
	_ sandbox.KeepLater = (*initProcess)(nil) // a pause by checkpoint keeps an SSH exec (keepas_linux.go)
)
