// Package envd serves E2B's envd API for one sandgate session: the Connect
// RPC services process.Process and filesystem.Filesystem, and the HTTP
// endpoints GET/POST /files and GET /health, as E2B's SDKs call them at
// the sandbox URL. The e2b package's router authenticates each request,
// resolves its session and hands it to Server.ServeSession.
//
// Everything runs on the engines /v1 runs on: a command is a background
// process of the data plane (dataplane.Processes: the session's history,
// audit, limits and tree kill, and /v1's /processes lists it), files go
// through the session's SFTP server (dataplane.Files), and a directory is
// watched by polling it over SFTP (watch.go): inotify in the sandbox is out
// of the gateway's reach.
//
// The messages are our own .proto files (proto/), written to match the e2b
// SDK's field for field (proto_test.go compares them with the SDK's
// descriptors); `make proto` regenerates gen/.
package envd

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem/filesystemconnect"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process/processconnect"
)

// Version is the envd version this package speaks, as the control API
// reports it (envdVersion) to the SDKs, which enable features by it: file
// uploads as application/octet-stream (0.5.7), CloseStdin (0.5.2),
// watch events with their entry (0.6.3), allow_network_mounts (0.6.4).
// File metadata (0.6.2, extended attributes) is refused: SFTP v3 has no
// extended attributes.
const Version = "0.6.4"

// Deps are the engines envd serves from: the ones /v1 serves from.
type Deps struct {
	// Sessions is the session manager.
	Sessions rest.Sessions
	// Plane is the data plane (commands, processes, files).
	Plane *dataplane.Plane
	Log   *slog.Logger
	// Watch bounds the directory watchers, Streams the streaming calls
	// (zero values: the defaults).
	Watch   WatchBounds
	Streams StreamBounds
	// Sealer opens the sandboxes' envVars (nil: a random key's, which
	// opens none).
	Sealer *e2bmeta.Sealer
}

// Server serves envd's API for sessions handed to it.
type Server struct {
	d       Deps
	mux     *http.ServeMux
	procs   *procService
	fs      *fsService
	watches *watchers
	streams *streams
}

// maxMessageBytes bounds one Connect message read (a request, or one
// message of StreamInput): input chunks and paths are small.
const maxMessageBytes = 4 << 20

// New returns a Server over d.
func New(d Deps) *Server {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Sealer == nil {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		d.Sealer = e2bmeta.NewSealer(key)
	}
	s := &Server{d: d, mux: http.NewServeMux()}
	s.watches = newWatchers(d.Watch.withDefaults())
	s.streams = newStreams(d.Streams)
	s.procs = &procService{s: s}
	s.fs = &fsService{s: s}
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessageBytes)}
	s.mux.Handle(processconnect.NewProcessHandler(s.procs, opts...))
	s.mux.Handle(filesystemconnect.NewFilesystemHandler(s.fs, opts...))
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.HandleFunc("GET /files", s.download)
	s.mux.HandleFunc("POST /files", s.upload)
	return s
}

// call is the session and principal of one request.
type call struct {
	sess *gateway.Session
	p    gateway.Principal
}

type callKey struct{}

// ServeSession serves one envd request for sess, already authenticated
// and resolved by the caller (the e2b router), whose principal is p.
// r.URL.Path is relative to the sandbox URL's root:
// /process.Process/Start, /filesystem.Filesystem/ListDir, /files, /health.
func (s *Server) ServeSession(w http.ResponseWriter, r *http.Request, sess *gateway.Session, p gateway.Principal) {
	ctx := context.WithValue(r.Context(), callKey{}, call{sess: sess, p: p})
	sw := stallFlusher{w, http.NewResponseController(w)}
	// The deadline stays on a kept-alive connection: clear it for the next.
	defer func() { _ = sw.rc.SetWriteDeadline(time.Time{}) }()
	s.mux.ServeHTTP(sw, r.WithContext(ctx))
}

// writeStall ends an answer whose client takes nothing of a write for
// this long (a stream's events, a download's bytes): the goroutine and
// the transfer it holds are freed.
const writeStall = time.Minute

// stallFlusher is the writer of every answer: each write and flush must
// be taken within writeStall; and it is an http.Flusher, which
// connect-go's streams look for by type assertion, through the writers
// the API's middleware wrapped it in (they unwrap for
// http.ResponseController).
type stallFlusher struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (f stallFlusher) Write(p []byte) (int, error) {
	_ = f.rc.SetWriteDeadline(time.Now().Add(writeStall))
	return f.ResponseWriter.Write(p)
}

func (f stallFlusher) Flush() {
	_ = f.rc.SetWriteDeadline(time.Now().Add(writeStall))
	_ = f.rc.Flush()
}

func (f stallFlusher) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// callOf is the session of a request ServeSession serves.
func callOf(ctx context.Context) call {
	c, _ := ctx.Value(callKey{}).(call)
	return c
}

// health answers GET /health as envd does: 204 while the sandbox runs.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	if c.sess == nil || c.sess.Status() != gateway.StatusRunning {
		writeHTTPError(w, http.StatusBadGateway, "session_not_running", notRunning(c))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// notRunning is what a call is told of its sandbox that stopped or
// ended: "was not found" is what the SDKs look for to raise
// SandboxNotRunningException.
func notRunning(c call) string {
	id := ""
	if c.sess != nil {
		id = c.sess.ID + " "
	}
	return "the sandbox " + id + "was not found running: it stopped or ended"
}

// keepaliveInterval is how often a stream sends a keepalive event: the
// client's Keepalive-Ping-Interval (seconds) within [1 s, 5 min], else
// 50 s (what the SDKs send).
func keepaliveInterval(h http.Header) time.Duration {
	const def, lo, hi = 50 * time.Second, time.Second, 5 * time.Minute
	var n int
	for _, c := range h.Get("Keepalive-Ping-Interval") {
		if c < '0' || c > '9' || n > 1e6 {
			return def
		}
		n = n*10 + int(c-'0')
	}
	if n == 0 {
		return def
	}
	return min(max(time.Duration(n)*time.Second, lo), hi)
}
