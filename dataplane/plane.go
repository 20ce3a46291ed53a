package dataplane

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"time"
)

// Plane is the data plane's state, shared by every session and every API
// that serves it (the /v1 API and the seeds' compat APIs): the bounds, the
// sessions' named shells, background processes and Python kernels, their
// SFTP servers, and the memory budget of commands' answers. cmd/sandgate
// builds it (NewPlane) and hands it to the APIs; it holds no goroutine of
// its own, and the engines end with the sessions they run in; Close ends
// the file servers kept idle.
type Plane struct {
	Bounds    Bounds
	Shells    *Shells
	Processes *Processes
	Kernels   *Kernels
	// Files are the sessions' shared SFTP servers and the bounds on
	// transfers.
	Files *Files
	// Budget bounds the memory of commands' answers, and Buffers keeps
	// their buffers for reuse.
	Budget  *OutputBudget
	Buffers *BufferPool
}

// NewPlane returns the data plane of bounds b, its zero values given the
// defaults. With b.StateDir set, shells, kernels and processes keep their
// state there and uploads are journalled under it (Files.Journal).
func NewPlane(b Bounds) *Plane {
	b = b.withDefaults()
	p := &Plane{
		Bounds: b, Shells: &Shells{StateDir: b.StateDir}, Processes: &Processes{}, Kernels: &Kernels{StateDir: b.StateDir},
		Budget:  &OutputBudget{Total: b.CommandMemory, PerTenant: b.CommandMemoryPerTenant, Wait: b.CommandQueue},
		Buffers: &BufferPool{},
		Files: &Files{MaxStreams: b.MaxFileStreams, MaxStreamsPerTenant: b.MaxFileStreamsPerTenant,
			MaxStreamsPerSession: b.MaxFileStreamsPerSession},
	}
	if b.StateDir != "" {
		p.Files.Journal = filepath.Join(b.StateDir, ".uploads")
	}
	return p
}

// Close ends what the plane holds that outlives a request: the sessions'
// idle SFTP servers (Files.Close). cmd/sandgate calls it at shutdown,
// once the APIs have stopped serving. Shells, kernels and background
// processes run in the sessions' sandboxes and end with them.
func (p *Plane) Close() {
	p.Files.Close()
}

// Default bounds on link fetches, per minute (Bounds.LinkFetchesPerLink
// and LinkFetchesPerIP).
const (
	DefaultLinkFetchesPerLink = 60
	DefaultLinkFetchesPerIP   = 120
)

// Bounds bound the REST data plane: commands, files and processes run
// in a session's sandbox over plain HTTP. Zero values get the defaults.
type Bounds struct {
	// MaxTimeout caps a command's timeout (default 1h; the default
	// timeout is 60 s).
	MaxTimeout time.Duration
	// MaxOutputBytes caps a command's maxOutputBytes per stream (default
	// 16 MiB; the default is 1 MiB).
	MaxOutputBytes int64
	// MaxFetchBytes caps each download of files/fetch (default 50 MiB).
	MaxFetchBytes int64
	// MaxFileBytes caps a file written with PUT (0: the workspace's free
	// space is the only bound).
	MaxFileBytes int64
	// DialPublic dials for files/fetch, refusing what is not public
	// (the egress proxy's address rule); nil: fetch is unavailable.
	DialPublic func(ctx context.Context, network, addr string) (net.Conn, error)
	// EnvAllow are the environment names a client may set besides TERM,
	// LANG and LC_* (NAME or PREFIX*), as serve --ssh-env-allow says for
	// SSH.
	EnvAllow []string
	// StateDir is a gateway-owned directory for the data plane's files
	// (background processes' output); "" keeps nothing on disk.
	StateDir string
	// MaxProcessOutputPerTenant bounds the output that one tenant's
	// background processes keep, over all its sessions (default 2 GiB;
	// ProcessConfig.TenantOutputBytes).
	MaxProcessOutputPerTenant int64
	// StepTimeout bounds a /compat/sbs step (default 30 s, the seed's).
	StepTimeout time.Duration
	// CommandMemory bounds, gateway-wide, the memory that running
	// commands may keep for their answers: each is charged both streams'
	// maxOutputBytes (CommandCost) until its answer is written
	// (default DefaultCommandMemory).
	CommandMemory int64
	// CommandMemoryPerTenant bounds one tenant's share of it (default
	// DefaultCommandMemoryPerTenant: 64 commands of the default 1 MiB
	// per stream fit in it at once).
	CommandMemoryPerTenant int64
	// CommandQueue is how long a command waits for room in those bounds
	// before it is refused (default DefaultCommandQueue).
	CommandQueue time.Duration
	// MaxFileStreams, MaxFileStreamsPerTenant and MaxFileStreamsPerSession
	// bound the file transfers (GET and PUT of /files, link fetches) open
	// at once (0: Files' defaults, 256, 64 and 16).
	MaxFileStreams, MaxFileStreamsPerTenant, MaxFileStreamsPerSession int
	// LinkFetchesPerLink and LinkFetchesPerIP bound the fetches of
	// presigned links per minute, per link and per client address
	// (0: 60 and 120; -1: unlimited).
	LinkFetchesPerLink, LinkFetchesPerIP int
	// TrustedProxies are the reverse proxies (serve --trusted-proxy)
	// whose X-Forwarded-For names the client a link fetch is counted
	// against (none: the connection's address).
	TrustedProxies []netip.Prefix
	// UploadStall ends a PUT of a file whose client sends no byte for
	// this long (0: DefaultUploadStall).
	UploadStall time.Duration
	// CommandShell runs every command through the sandbox's shell
	// (Request.NoDirect; serve --command-shell): by default a plain list
	// of words that bash would exec as it is skips bash's start.
	CommandShell bool
}

// DefaultUploadStall is Bounds.UploadStall's default.
const DefaultUploadStall = time.Minute

// Defaults of the bounds on commands' memory.
const (
	DefaultCommandMemory          = 256 << 20
	DefaultCommandMemoryPerTenant = 160 << 20
	DefaultCommandQueue           = 10 * time.Second
)

func (d Bounds) withDefaults() Bounds {
	if d.MaxTimeout <= 0 {
		d.MaxTimeout = time.Hour
	}
	if d.MaxOutputBytes <= 0 {
		d.MaxOutputBytes = 16 << 20
	}
	if d.MaxFetchBytes <= 0 {
		d.MaxFetchBytes = 50 << 20
	}
	if d.UploadStall <= 0 {
		d.UploadStall = DefaultUploadStall
	}
	if d.StepTimeout <= 0 {
		d.StepTimeout = 30 * time.Second
	}
	if d.CommandMemory <= 0 {
		d.CommandMemory = DefaultCommandMemory
	}
	if d.CommandMemoryPerTenant <= 0 {
		d.CommandMemoryPerTenant = DefaultCommandMemoryPerTenant
	}
	if d.CommandQueue <= 0 {
		d.CommandQueue = DefaultCommandQueue
	}
	if d.LinkFetchesPerLink == 0 {
		d.LinkFetchesPerLink = DefaultLinkFetchesPerLink
	}
	if d.LinkFetchesPerIP == 0 {
		d.LinkFetchesPerIP = DefaultLinkFetchesPerIP
	}
	return d
}
