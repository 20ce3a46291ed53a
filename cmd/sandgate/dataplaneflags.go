package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/rest"
)

// dataPlaneFlags are serve's bounds on the REST data plane.
type dataPlaneFlags struct {
	maxTimeout     time.Duration
	maxOutputBytes int64
	maxFetchBytes  int64
	maxFileBytes   int64
	stepTimeout    time.Duration
	// commandMemory and commandMemoryPerTenant bound the memory commands
	// keep for their answers (dataplane.Bounds.CommandMemory).
	commandMemory          int64
	commandMemoryPerTenant int64
	commandQueue           time.Duration
	// procOutputPerTenant bounds the output one tenant's background
	// processes keep on the host.
	procOutputPerTenant int64
	// Bounds on file transfers at once, and on link fetches a minute.
	maxTransfers, maxTransfersPerTenant, maxTransfersPerSession int
	linkFetchesPerLink, linkFetchesPerIP                        int
	trustedProxies                                              prefixListFlag
	uploadStall                                                 time.Duration
	commandShell                                                bool
}

// prefixListFlag is a repeatable flag of CIDR ranges (or single addresses).
type prefixListFlag []netip.Prefix

func (l *prefixListFlag) String() string {
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (l *prefixListFlag) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return fmt.Errorf("%q: want a CIDR range such as 10.0.0.0/8, or an address", item)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		*l = append(*l, p.Masked())
	}
	return nil
}

func (d *dataPlaneFlags) register(fs *flag.FlagSet) {
	d.maxOutputBytes, d.maxFetchBytes, d.procOutputPerTenant = 16<<20, 50<<20, 2<<30
	fs.DurationVar(&d.maxTimeout, "max-command-timeout", time.Hour, "largest timeout a REST command may ask for")
	fs.Var((*sizeFlag)(&d.maxOutputBytes), "max-output-bytes", "largest maxOutputBytes (per stream) a REST command may ask for: bytes or a size such as 16MiB")
	fs.Var((*sizeFlag)(&d.maxFetchBytes), "max-fetch-bytes", "largest download of files/fetch; a larger one fails and is removed: bytes or a size such as 50MiB")
	fs.DurationVar(&d.stepTimeout, "step-timeout", 30*time.Second, "timeout of a step of the session-based-sandbox API (/compat/sbs); a step past it ends with exit code 124")
	d.commandMemory, d.commandMemoryPerTenant = rest.DefaultCommandMemory, rest.DefaultCommandMemoryPerTenant
	fs.Var((*sizeFlag)(&d.commandMemory), "command-memory", "memory all running REST commands may keep for their answers, gateway-wide: each is charged twice its maxOutputBytes (both streams) until answered; past it a command waits --command-queue, then gets 503 commands_unavailable")
	fs.Var((*sizeFlag)(&d.commandMemoryPerTenant), "command-memory-per-tenant", "one tenant's share of --command-memory; past it a command waits --command-queue, then gets 429 too_many_commands")
	fs.DurationVar(&d.commandQueue, "command-queue", rest.DefaultCommandQueue, "how long a REST command waits for room in --command-memory before it is refused")
	fs.Var((*sizeFlag)(&d.procOutputPerTenant), "max-process-output-per-tenant", "output that one tenant's background processes keep on the host, over all its sessions (a running process counts 16MiB, a finished one what it keeps); a start past it is 429 process_output_limit: bytes or a size such as 2GiB")
	fs.Var((*sizeFlag)(&d.maxFileBytes), "max-file-bytes", "largest file a REST PUT may write (0: the workspace's free space): bytes or a size such as 1GiB")
	fs.IntVar(&d.maxTransfers, "max-file-transfers", dataplane.DefaultMaxStreams, "REST file downloads and uploads (GET/PUT /files, link fetches) open at once on this gateway; past it 503 too_many_file_transfers")
	fs.IntVar(&d.maxTransfersPerTenant, "max-file-transfers-per-tenant", dataplane.DefaultMaxStreamsPerTenant, "REST file downloads and uploads open at once per tenant")
	fs.IntVar(&d.maxTransfersPerSession, "max-file-transfers-per-session", dataplane.DefaultMaxStreamsPerSession, "REST file downloads and uploads open at once per session")
	fs.IntVar(&d.linkFetchesPerLink, "link-fetches-per-minute", rest.DefaultLinkFetchesPerLink, "fetches of one presigned file link per minute; past it 429 (0 disables)")
	fs.IntVar(&d.linkFetchesPerIP, "link-fetches-per-ip", rest.DefaultLinkFetchesPerIP, "presigned file link fetches per client address per minute; past it 429 (0 disables)")
	fs.DurationVar(&d.uploadStall, "upload-stall-timeout", rest.DefaultUploadStall, "a REST file upload (PUT .../files) whose client sends no byte for this long ends with 408 upload_stalled, freeing its transfer")
	fs.BoolVar(&d.commandShell, "command-shell", false, "run every REST command through the sandbox's shell; by default a plain list of words (no quote, $, glob, redirection, ;, |...) whose program bash would exec as it is runs without bash's start, with what bash would give it (SSH exec always runs the shell)")
	fs.Var(&d.trustedProxies, "trusted-proxy", "CIDR range of a reverse proxy in front of the gateway (repeatable; default none): a connection from one is counted for --link-fetches-per-ip under the rightmost X-Forwarded-For address outside these ranges")
}

// check refuses settings no request could run under: a step timeout of
// zero or less would end every /compat/sbs step at once.
func (d *dataPlaneFlags) check() error {
	if d.stepTimeout <= 0 {
		return fmt.Errorf("--step-timeout must be positive (the seed's SBS_STEP_TIMEOUT_SEC is at least 1 second), got %v", d.stepTimeout)
	}
	return nil
}

// config is the REST data plane's configuration; egress dials fetches.
func (d *dataPlaneFlags) config(cfg *serveConfig, egress publicDialer) rest.DataPlane {
	dp := rest.DataPlane{
		MaxTimeout: d.maxTimeout, MaxOutputBytes: d.maxOutputBytes, MaxFetchBytes: d.maxFetchBytes,
		MaxFileBytes: d.maxFileBytes, StepTimeout: d.stepTimeout,
		CommandMemory: d.commandMemory, CommandMemoryPerTenant: d.commandMemoryPerTenant, CommandQueue: d.commandQueue, EnvAllow: cfg.sshEnvAllow, StateDir: filepath.Join(cfg.dataDir, "dataplane"),
		MaxProcessOutputPerTenant: d.procOutputPerTenant,
	}
	dp.MaxFileStreams, dp.MaxFileStreamsPerTenant, dp.MaxFileStreamsPerSession = d.maxTransfers, d.maxTransfersPerTenant, d.maxTransfersPerSession
	dp.LinkFetchesPerLink, dp.LinkFetchesPerIP = unlimitedIfZero(d.linkFetchesPerLink), unlimitedIfZero(d.linkFetchesPerIP)
	dp.TrustedProxies, dp.UploadStall = d.trustedProxies, d.uploadStall
	dp.CommandShell = d.commandShell
	if egress != nil {
		dp.DialPublic = egress.DialPublic
	}
	return dp
}

// unlimitedIfZero maps a flag's 0 (disabled) to the config's -1.
func unlimitedIfZero(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// publicDialer dials only public addresses (the egress proxy's rule).
type publicDialer interface {
	DialPublic(ctx context.Context, network, addr string) (net.Conn, error)
}
