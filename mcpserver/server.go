// Package mcpserver is `sandgate mcp`: a Model Context Protocol server
// (stdio) whose tools drive a sandgate gateway's REST API: sessions,
// commands in a persistent shell, the Python kernel, files and background
// processes. It is a client of the gateway and imports none of its
// packages.
package mcpserver

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Defaults for Options' zero values.
const (
	DefaultOutputBytes   = 64 << 10  // per stream of a command, kernel call or process read
	DefaultReadFileBytes = 256 << 10 // per read_file call
	DefaultListEntries   = 1000      // per list_files call
	cleanupTimeout       = 30 * time.Second
)

// MaxMessageBytes bounds one JSON-RPC message from the MCP client: a
// longer one ends the connection (the SDK cannot answer it), so it is
// well above what the tools take (write_file's content: the gateway's
// --max-file-bytes, and under this in practice) and below what would let
// one message exhaust memory.
const MaxMessageBytes = 64 << 20

// Options configure a Server.
type Options struct {
	// Client reaches the gateway.
	Client *Client
	// Logger gets the server's own log lines (nil: discarded). Never
	// stdout: that is the MCP stream.
	Logger *slog.Logger
	// SDKLogger gets the MCP SDK's own log lines (nil: discarded).
	SDKLogger *slog.Logger
	// Attach is an existing session used as the default session; it is
	// never deleted by the server.
	Attach string
	// Version is reported to MCP clients.
	Version string
	// OutputBytes caps each output stream a tool returns (0: DefaultOutputBytes).
	OutputBytes int
	// ReadFileBytes caps what read_file returns at once (0: DefaultReadFileBytes).
	ReadFileBytes int
	// EgressDecisions offers decide_egress, which allows or denies a
	// connection an egressMode "ask" session parked. Off by default (the
	// tool is not listed): approvals exist so that a person decides, and
	// the MCP client is the model, which reads what the sandbox prints and
	// can be talked by the very code whose connection waits into letting
	// it out. list_egress_pending is offered either way.
	EgressDecisions bool
}

// Server is one MCP server over one connection: its default session
// belongs to that connection.
type Server struct {
	client   *Client
	log      *slog.Logger
	sess     *sessions
	mcp      *mcp.Server
	outBytes int
	readMax  int
	decide   bool // offer decide_egress (Options.EgressDecisions)
	// halt ends when Run's context does: the tools' calls end with it
	// (bind).
	halt    context.Context
	haltNow context.CancelFunc
}

// New builds the server and registers its tools.
func New(opts Options) *Server {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		client:   opts.Client,
		log:      log,
		sess:     newSessions(opts.Client, log, opts.Attach),
		outBytes: opts.OutputBytes,
		readMax:  opts.ReadFileBytes,
		decide:   opts.EgressDecisions,
	}
	s.halt, s.haltNow = context.WithCancel(context.Background())
	// A session the gateway says is gone (404, 410) is forgotten: the
	// next call without a session argument makes a fresh default one.
	s.client.onGone = s.sess.deleted
	if s.outBytes <= 0 {
		s.outBytes = DefaultOutputBytes
	}
	if s.readMax <= 0 {
		s.readMax = DefaultReadFileBytes
	}
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "sandgate", Version: version}, &mcp.ServerOptions{
		Logger:       opts.SDKLogger,
		Instructions: instructions,
	})
	s.addTools()
	return s
}

// MCP returns the underlying SDK server.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run serves one MCP connection over t until the client disconnects (or
// ctx ends), then deletes the sessions the connection owns: the default
// session it created and unnamed create_session sessions.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	stop := context.AfterFunc(ctx, s.haltNow)
	defer stop()
	runErr := s.mcp.Run(ctx, t)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := s.sess.closeAll(cctx); err != nil {
		s.log.Error("mcp_cleanup_failed", "err", err)
		if runErr == nil {
			runErr = fmt.Errorf("cleanup: %w", err)
		}
	}
	if runErr != nil && ctx.Err() != nil {
		return nil // asked to stop: not an error
	}
	return runErr
}

const instructions = `sandgate gives you an isolated Linux sandbox (a "session") to run commands, Python code and background processes in, and to read and write files.
You need not create a session: the first tool call without a "session" argument creates a default one, and it is deleted (with all its files and processes) when this MCP connection ends. Use create_session with a "name" for a session that must outlive the connection.
Files persist for the session's lifetime; run_command's shell keeps its working directory, exported variables and functions between calls; run_python keeps its variables and imports between calls.`
