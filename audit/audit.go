// Package audit is the gateway's audit trail: one stream of events (REST
// calls, tunnels, SSH authentication, commands, file operations, egress
// decisions, session lifecycle) appended as JSON lines to a file that
// rotates by size (File), and read back newest first for a tenant (Query).
//
// It runs in the gateway process and imports nothing of sandgate: the
// packages that see events (gateway, rest, sshd) call an Auditor through
// optional config fields, the way they call their Metrics.
package audit

import (
	"context"
	"log/slog"
	"time"
)

// Auditor receives events. Record never fails and never blocks for long:
// a write error is the Auditor's to count and report, never the caller's.
// The event's Time, RequestID, Tenant and Auth are filled from ctx (see
// WithRequest) when the caller left them empty.
type Auditor interface {
	Record(ctx context.Context, e Event)
}

// Discard is an Auditor that keeps nothing (what a nil Auditor means).
var Discard Auditor = discard{}

type discard struct{}

func (discard) Record(context.Context, Event) {}

// Or returns a, or Discard when a is nil.
func Or(a Auditor) Auditor {
	if a == nil {
		return Discard
	}
	return a
}

// Event kinds.
const (
	KindREST        = "rest"         // a REST call (or CONNECT) ended
	KindTunnelOpen  = "tunnel.open"  // a CONNECT tunnel was established
	KindTunnelClose = "tunnel.close" // it ended (BytesIn, BytesOut)
	KindSSHAuth     = "ssh.auth"     // an SSH authentication attempt finished
	KindCommand     = "command"      // a command ended (Source says over what)
	KindFile        = "file"         // a file operation (SFTP or REST)
	KindEgress      = "egress"       // the egress proxy allowed or denied a connection
	KindSession     = "session"      // session lifecycle (Op: created, deleted, expired, failed, stopped)
	KindForward     = "forward"      // an ssh -L (direct-tcpip) channel ended or was refused (Host, Port, BytesIn, BytesOut)
)

// Event is one line of the audit log. Fields a kind does not use are
// left out of the JSON. Secrets never go in an event: no header, token,
// password or secret value is ever put in one; command text and paths are
// what the client sent.
type Event struct {
	// Seq orders events: it grows by one per event written, across
	// rotations and restarts. The Query cursor is built on it.
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"`
	Tenant    string    `json:"tenant,omitempty"`
	Auth      string    `json:"auth,omitempty"` // how the caller proved it: api_key, jwt; password, publickey, none over SSH
	Session   string    `json:"session,omitempty"`
	RequestID string    `json:"requestId,omitempty"`

	// REST calls.
	Method string `json:"method,omitempty"`
	Route  string `json:"route,omitempty"` // the route's pattern, never the URL (no ids of links, no query)
	Status int    `json:"status,omitempty"`

	// Commands: Source is ssh, shell (an interactive SSH shell), rest,
	// rest-shell (a persistent shell's command), kernel (a Python cell).
	Source   string `json:"source,omitempty"`
	Command  string `json:"command,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timedOut,omitempty"`
	// ProcessID is a background process's id (POST
	// /v1/sessions/{id}/processes), for the command it ran.
	ProcessID string `json:"processId,omitempty"`

	// File operations (Source sftp or rest) and session lifecycle.
	Op     string `json:"op,omitempty"`
	Path   string `json:"path,omitempty"`
	Target string `json:"target,omitempty"` // a rename's or symlink's second path
	Bytes  int64  `json:"bytes,omitempty"`

	// Tunnels and forwards.
	BytesIn  int64 `json:"bytesIn,omitempty"`  // from the client
	BytesOut int64 `json:"bytesOut,omitempty"` // to the client

	// Egress and forwards (the destination the client asked for).
	Host string `json:"host,omitempty"`
	Port int    `json:"port,omitempty"`
	Addr string `json:"addr,omitempty"`

	// Result is ok, or what went wrong (an error code or the SFTP status);
	// for egress allowed or denied.
	Result     string `json:"result,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Secret     string `json:"secret,omitempty"` // an egress tripwire's secret, by name
	By         string `json:"by,omitempty"`     // who deleted a session: its tenant
	DurationMs int64  `json:"durationMs,omitempty"`
	// Count is how many calls a summary event stands for (the
	// unauthenticated calls not recorded one by one).
	Count int64 `json:"count,omitempty"`
}

// MaxCommandBytes bounds the command text an event keeps (a Python cell
// can be long); longer text is cut and marked.
const MaxCommandBytes = 8 << 10

// Cut bounds s to MaxCommandBytes.
func Cut(s string) string {
	if len(s) <= MaxCommandBytes {
		return s
	}
	return s[:MaxCommandBytes] + "…[cut]"
}

// Request is who a request is from, carried in its context.
type Request struct {
	ID     string // the request id (X-Request-Id)
	Tenant string
	Auth   string
}

type requestKey struct{}

// WithRequest returns ctx carrying r: events recorded and lines logged
// (through LogHandler) with it name the request.
func WithRequest(ctx context.Context, r Request) context.Context {
	return context.WithValue(ctx, requestKey{}, r)
}

// RequestFrom returns the request ctx carries (zero outside one).
func RequestFrom(ctx context.Context) Request {
	r, _ := ctx.Value(requestKey{}).(Request)
	return r
}

// fill completes e from ctx.
func fill(ctx context.Context, e *Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	if ctx == nil {
		return
	}
	r := RequestFrom(ctx)
	if e.RequestID == "" {
		e.RequestID = r.ID
	}
	if e.Tenant == "" {
		e.Tenant = r.Tenant
	}
	if e.Auth == "" {
		e.Auth = r.Auth
	}
}

// LogHandler wraps h so that every line logged with a context that
// carries a request (WithRequest) has its id as request_id.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if id := RequestFrom(ctx).ID; id != "" {
			r = r.Clone()
			r.AddAttrs(slog.String("request_id", id))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{h.Handler.WithGroup(name)}
}
