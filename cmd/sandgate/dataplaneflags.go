package main

import (
	"context"
	"flag"
	"net"
	"path/filepath"
	"time"

	"github.com/sandgate/sandgate/rest"
)

// dataPlaneFlags are serve's bounds on the REST data plane.
type dataPlaneFlags struct {
	maxTimeout     time.Duration
	maxOutputBytes int64
	maxFetchBytes  int64
	maxFileBytes   int64
	stepTimeout    time.Duration
	// procOutputPerTenant bounds the output one tenant's background
	// processes keep on the host.
	procOutputPerTenant int64
}

func (d *dataPlaneFlags) register(fs *flag.FlagSet) {
	d.maxOutputBytes, d.maxFetchBytes, d.procOutputPerTenant = 16<<20, 50<<20, 2<<30
	fs.DurationVar(&d.maxTimeout, "max-command-timeout", time.Hour, "largest timeout a REST command may ask for")
	fs.Var((*sizeFlag)(&d.maxOutputBytes), "max-output-bytes", "largest maxOutputBytes (per stream) a REST command may ask for: bytes or a size such as 16MiB")
	fs.Var((*sizeFlag)(&d.maxFetchBytes), "max-fetch-bytes", "largest download of files/fetch; a larger one fails and is removed: bytes or a size such as 50MiB")
	fs.DurationVar(&d.stepTimeout, "step-timeout", 30*time.Second, "timeout of a step of the session-based-sandbox API (/compat/sbs); a step past it ends with exit code 124")
	fs.Var((*sizeFlag)(&d.procOutputPerTenant), "max-process-output-per-tenant", "output that one tenant's background processes keep on the host, over all its sessions (a running process counts 16MiB, a finished one what it keeps); a start past it is 429 process_output_limit: bytes or a size such as 2GiB")
	fs.Var((*sizeFlag)(&d.maxFileBytes), "max-file-bytes", "largest file a REST PUT may write (0: the workspace's free space): bytes or a size such as 1GiB")
}

// config is the REST data plane's configuration; egress dials fetches.
func (d *dataPlaneFlags) config(cfg *serveConfig, egress publicDialer) rest.DataPlane {
	dp := rest.DataPlane{
		MaxTimeout: d.maxTimeout, MaxOutputBytes: d.maxOutputBytes, MaxFetchBytes: d.maxFetchBytes,
		MaxFileBytes: d.maxFileBytes, StepTimeout: d.stepTimeout, EnvAllow: cfg.sshEnvAllow, StateDir: filepath.Join(cfg.dataDir, "dataplane"),
		MaxProcessOutputPerTenant: d.procOutputPerTenant,
	}
	if egress != nil {
		dp.DialPublic = egress.DialPublic
	}
	return dp
}

// publicDialer dials only public addresses (the egress proxy's rule).
type publicDialer interface {
	DialPublic(ctx context.Context, network, addr string) (net.Conn, error)
}
