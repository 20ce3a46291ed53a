package rest

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// DataPlane bounds the REST data plane: commands, files and processes run
// in a session's sandbox over plain HTTP. Zero values get the defaults.
type DataPlane struct {
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
	// dataplane.ProcessConfig.TenantOutputBytes).
	MaxProcessOutputPerTenant int64
	// StepTimeout bounds a /compat/sbs step (default 30 s, the seed's).
	StepTimeout time.Duration
	// CommandMemory bounds, gateway-wide, the memory that running
	// commands may keep for their answers: each is charged both streams'
	// maxOutputBytes (dataplane.CommandCost) until its answer is written
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
	// at once (0: dataplane.Files' defaults, 256, 64 and 16).
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
}

// DefaultUploadStall is DataPlane.UploadStall's default.
const DefaultUploadStall = time.Minute

// Defaults of the bounds on commands' memory.
const (
	DefaultCommandMemory          = 256 << 20
	DefaultCommandMemoryPerTenant = 160 << 20
	DefaultCommandQueue           = 10 * time.Second
)

func (d DataPlane) withDefaults() DataPlane {
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

// dataPlane is the API's data-plane state, shared by every session.
type dataPlane struct {
	cfg    DataPlane
	shells *dataplane.Shells
	procs  *dataplane.Processes
	// budget bounds the memory of commands' answers, and buffers keeps
	// their buffers for reuse (commands.go).
	budget  *dataplane.OutputBudget
	buffers *dataplane.BufferPool
	// kernels are the sessions' Python kernels (python.go); a value, as
	// its zero value is ready to use and New need not make it.
	kernels dataplane.Kernels
	// files are the sessions' shared SFTP servers and the bounds on
	// transfers (files.go).
	files *dataplane.Files
}

// dataSession finds the running session of the request's {id} for a
// data-plane call, answering 404 (not the caller's) or 409 (not running)
// itself; the call counts as activity until it returns (Session.Hold).
func (a *api) dataSession(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	s, err := a.cfg.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		if compatRequest(r) {
			writeCompatError(w, err)
		} else {
			WriteGatewayError(w, err)
		}
		return nil, false
	}
	if !s.Live() {
		WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; delete it")
		return nil, false
	}
	context.AfterFunc(r.Context(), s.Hold()) // the server cancels it when the handler returns
	return s, true
}
