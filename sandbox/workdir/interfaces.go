package workdir

import "github.com/sandgate/sandgate/sandbox"

// The optional interfaces of package sandbox that this driver implements,
// checked at compile time. It does not implement Reporter (it enforces no
// limit), Keeper (its processes end with the gateway), Ender (nothing ends
// a directory on its own), Freezer or WorkspaceHomer.
var (
	_ sandbox.Driver     = (*Driver)(nil)
	_ sandbox.Reattacher = (*Driver)(nil) // workdirs outlive the gateway (restart.go)

	_ sandbox.Sandbox        = (*workdirSandbox)(nil)
	_ sandbox.ProxyListener  = (*workdirSandbox)(nil) // a host loopback port
	_ sandbox.LoopbackDialer = (*workdirSandbox)(nil) // the host's loopback (loopback.go)
	_ sandbox.Detacher       = (*workdirSandbox)(nil) // restart.go
	_ sandbox.Stopper        = (*workdirSandbox)(nil) // kills the tagged processes, keeps the directory
	_ sandbox.Statser        = (*workdirSandbox)(nil) // disk use only (stats.go)
	_ sandbox.Halter         = (*workdirSandbox)(nil) // its processes end before its release

	_ sandbox.Process = (*hostProcess)(nil)
	_ sandbox.PIDer   = (*hostProcess)(nil)
)
