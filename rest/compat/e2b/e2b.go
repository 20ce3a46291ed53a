// Package e2b serves E2B's APIs, so that the e2b and e2b-code-interpreter
// SDKs (and what is built on them) run unchanged against sandgate, with
// three environment variables (docs/compat.md):
//
//	E2B_API_URL=<gateway>/compat/e2b
//	E2B_SANDBOX_URL=<gateway>/compat/e2b/sandbox
//	E2B_API_KEY=<a sandgate API key>
//
// /compat/e2b is E2B's control API (control.go): sandboxes are sessions,
// a template an image, a timeout the TTL, metadata the labels, pause and
// resume a stop and the next start. /compat/e2b/sandbox is the sandbox
// URL (router.go): every request names its sandbox in E2b-Sandbox-Id and
// its port in E2b-Sandbox-Port, and goes to envd (package envd, port
// 49983) or to the code interpreter (interp.go, port 49999).
//
// Authentication: the control API takes X-API-Key (any sandgate API key
// or token; the tenant is the key's). The sandbox URL takes the sandbox's
// access token (token.go), which every create and connect hands out
// (X-Access-Token, E2B-Traffic-Access-Token), or X-API-Key. Errors have
// E2B's shape: {"code": <status>, "message": ..., "error_code": <sandgate's code>}.
package e2b

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
)

// Prefixes of the two APIs.
const (
	// APIPrefix is E2B_API_URL's path.
	APIPrefix = "/compat/e2b"
	// SandboxPrefix is E2B_SANDBOX_URL's path.
	SandboxPrefix = "/compat/e2b/sandbox"
)

// Ports a sandbox URL request may name (E2b-Sandbox-Port).
const (
	EnvdPort        = 49983
	InterpreterPort = 49999
)

// EnvdVersion is the envd version sandboxes report: the SDKs use the
// features it implies; package envd says which it speaks.
const EnvdVersion = envd.Version

// Sessions is what the facade needs of the session manager: rest's
// Sessions, Stop (pause) and Owner (a sandbox URL request names its
// sandbox before its caller is known).
type Sessions interface {
	rest.Sessions
	rest.SessionStopper
	rest.SessionOwners
}

// Deps are what the facade serves from.
type Deps struct {
	Sessions Sessions
	Plane    *dataplane.Plane
	// Key derives the sandboxes' access tokens (the gateway's link key,
	// kept in its data dir, so that tokens outlive a restart); nil: a
	// random key, so tokens die with the process.
	Key []byte
	// ImageAliases are the image names --image-alias gives: a templateID
	// among them is the image; any other template gets the default image.
	ImageAliases []string
	Log          *slog.Logger
	// WriteStall ends an /execute answer whose client takes nothing of a
	// line for this long, interrupting its cell (0: a minute).
	WriteStall time.Duration
}

// api is the facade's state.
type api struct {
	d        Deps
	sealer   *e2bmeta.Sealer // the records' envVars (e2bmeta)
	envd     *envd.Server
	aliases  map[string]bool
	contexts contexts   // the code interpreter's contexts (interp.go)
	pauses   autoPauses // autoPause sandboxes' pending pauses (autopause.go)
}

// New returns the facade's two APIs (rest.Mount: served beside /v1,
// behind its audit and rate limit), for compat.New to add to the seeds'.
func New(d Deps) []rest.Mount {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.WriteStall <= 0 {
		d.WriteStall = time.Minute
	}
	if len(d.Key) == 0 {
		d.Key = make([]byte, 32)
		_, _ = rand.Read(d.Key)
	}
	sealer := e2bmeta.NewSealer(d.Key)
	a := &api{d: d, sealer: sealer, envd: envd.New(envd.Deps{Sessions: d.Sessions, Plane: d.Plane, Log: d.Log, Sealer: sealer}), aliases: map[string]bool{}}
	for _, n := range d.ImageAliases {
		a.aliases[n] = true
	}
	return []rest.Mount{
		{Prefix: SandboxPrefix, Handler: http.HandlerFunc(a.serveSandbox), Before: rest.APIKeyAsBearer, Credential: a.accessToken},
		{Prefix: APIPrefix, Handler: a.controlRouter(), Before: rest.APIKeyAsBearer},
	}
}

// principal is the authenticated caller of r.
func principal(r *http.Request) gateway.Principal {
	p, _ := gateway.PrincipalFrom(r.Context())
	return p
}

// e2bError is E2B's error body.
type e2bError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	// ErrorCode is sandgate's code for it (E2B's SDKs read it as the
	// machine-readable error_code).
	ErrorCode string `json:"error_code,omitempty"`
}

// writeError writes an error in E2B's shape.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	_ = rest.WriteJSON(w, status, e2bError{Code: status, Message: msg, ErrorCode: code})
}

// statusOf is the status /v1 answers a gateway error kind with.
var statusOf = map[gateway.Kind]int{
	gateway.KindInvalid:             http.StatusBadRequest,
	gateway.KindNotFound:            http.StatusNotFound,
	gateway.KindQuota:               http.StatusTooManyRequests,
	gateway.KindUnavailable:         http.StatusServiceUnavailable,
	gateway.KindUnauthorized:        http.StatusUnauthorized,
	gateway.KindConflict:            http.StatusConflict,
	gateway.KindUpstream:            http.StatusBadGateway,
	gateway.KindUnprocessable:       http.StatusUnprocessableEntity,
	gateway.KindGone:                http.StatusNotFound, // E2B's clients know no 410
	gateway.KindForbidden:           http.StatusForbidden,
	gateway.KindTooLarge:            http.StatusRequestEntityTooLarge,
	gateway.KindInsufficientStorage: http.StatusInsufficientStorage,
	gateway.KindUpstreamTimeout:     http.StatusGatewayTimeout,
}

// writeGatewayError answers a gateway error in E2B's shape, with /v1's
// status (a session that is gone is not found) and Retry-After.
func writeGatewayError(w http.ResponseWriter, err error) {
	ge, ok := errors.AsType[*gateway.Error](err)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	status, ok := statusOf[ge.Kind]
	if !ok {
		status = http.StatusInternalServerError
	}
	if ge.Kind == gateway.KindGone {
		ge = &gateway.Error{Kind: gateway.KindNotFound, Code: "not_found", Message: "sandbox not found"}
	}
	if ge.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((ge.RetryAfter+time.Second-1)/time.Second)))
	}
	writeError(w, status, ge.Code, ge.Message)
}

// writeJSON writes v as the JSON answer with status.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	return rest.WriteJSON(w, status, v)
}

// decodeBody reads r's JSON body into v (an empty body leaves v as it
// is), answering 400 itself when it is not JSON of v's shape.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body := http.MaxBytesReader(w, r.Body, rest.MaxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", "the request body is larger than 64 KiB")
			return false
		}
		writeError(w, http.StatusBadRequest, "invalid_json", "the request body is not valid JSON of the expected shape: "+err.Error())
		return false
	}
	return true
}

// hold makes s count as active until ctx ends (gateway.Session.Hold).
func hold(ctx context.Context, s *gateway.Session) {
	context.AfterFunc(ctx, s.Hold())
}
