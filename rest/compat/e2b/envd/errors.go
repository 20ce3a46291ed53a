package envd

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// Errors are Connect errors with the codes envd answers, which the SDKs
// map to their exceptions (not_found: NotFoundException, or
// FileNotFoundException for a file; invalid_argument:
// InvalidArgumentException; already_exists: make_dir's False;
// resource_exhausted: RateLimitException; unavailable: the sandbox is not
// running). Each also carries sandgate's own stable code in the
// Sandgate-Code metadata (a response header or trailer).

// codeMeta is the metadata key of sandgate's code.
const codeMeta = "Sandgate-Code"

// rpcError is a Connect error of code with sandgate's reason and message.
func rpcError(code connect.Code, reason, msg string) *connect.Error {
	e := connect.NewError(code, errors.New(msg))
	if reason != "" {
		e.Meta().Set(codeMeta, reason)
	}
	return e
}

func invalid(reason, msg string) *connect.Error {
	return rpcError(connect.CodeInvalidArgument, reason, msg)
}

// toRPC turns an engine's failure into the Connect error a client gets:
// a file error by its kind, a gateway error (the data plane's are ones
// too) by its kind, anything else an internal error whose cause is
// logged, never told.
func (s *Server) toRPC(ctx context.Context, err error, what string) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	if errors.Is(err, context.Canceled) {
		return rpcError(connect.CodeCanceled, "canceled", "the request was canceled")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return rpcError(connect.CodeDeadlineExceeded, "timeout", "the request's deadline passed")
	}
	var fe *dataplane.Error
	if errors.As(err, &fe) {
		code, reason := fileCode(fe.Kind)
		if code != connect.CodeInternal {
			return rpcError(code, reason, fe.Msg)
		}
	}
	var ge *gateway.Error
	if errors.As(err, &ge) && ge.Code == "session_not_running" {
		// Unavailable with "was not found": E2B's SDKs raise their
		// SandboxNotRunningException.
		return rpcError(connect.CodeUnavailable, ge.Code, notRunning(callOf(ctx)))
	}
	if errors.As(err, &ge) && ge.Kind != gateway.KindInternal {
		return rpcError(gatewayCode(ge.Kind), ge.Code, ge.Message)
	}
	s.d.Log.ErrorContext(ctx, "envd_failed", "op", what, "err", err)
	return rpcError(connect.CodeInternal, "internal", what+" failed")
}

// fileCode is the Connect code and sandgate's code of a file error kind.
func fileCode(k dataplane.ErrKind) (connect.Code, string) {
	switch k {
	case dataplane.KindInvalid:
		return connect.CodeInvalidArgument, "invalid_path"
	case dataplane.KindNotFound:
		return connect.CodeNotFound, "file_not_found"
	case dataplane.KindNotDir:
		return connect.CodeInvalidArgument, "not_a_directory"
	case dataplane.KindIsDir:
		return connect.CodeInvalidArgument, "is_a_directory"
	case dataplane.KindNotRegular:
		return connect.CodeInvalidArgument, "not_a_regular_file"
	case dataplane.KindNotEmpty:
		return connect.CodeFailedPrecondition, "directory_not_empty"
	case dataplane.KindPermission:
		return connect.CodePermissionDenied, "permission_denied"
	case dataplane.KindTooLarge:
		return connect.CodeResourceExhausted, "file_too_large"
	case dataplane.KindDiskFull:
		return connect.CodeResourceExhausted, "disk_full"
	case dataplane.KindExists:
		return connect.CodeAlreadyExists, "file_exists"
	case dataplane.KindAborted:
		return connect.CodeAborted, "upload_incomplete"
	case dataplane.KindUnavailable:
		return connect.CodeUnavailable, "files_unavailable"
	case dataplane.KindBusy:
		return connect.CodeResourceExhausted, "too_many_file_transfers"
	}
	return connect.CodeInternal, "internal"
}

// gatewayCode is the Connect code of a gateway error kind.
func gatewayCode(k gateway.Kind) connect.Code {
	switch k {
	case gateway.KindInvalid, gateway.KindUnprocessable:
		return connect.CodeInvalidArgument
	case gateway.KindNotFound, gateway.KindGone:
		return connect.CodeNotFound
	case gateway.KindQuota, gateway.KindTooLarge, gateway.KindInsufficientStorage:
		return connect.CodeResourceExhausted
	case gateway.KindUnavailable, gateway.KindUpstream:
		return connect.CodeUnavailable
	case gateway.KindUnauthorized:
		return connect.CodeUnauthenticated
	case gateway.KindForbidden:
		return connect.CodePermissionDenied
	case gateway.KindConflict:
		return connect.CodeFailedPrecondition
	case gateway.KindUpstreamTimeout:
		return connect.CodeDeadlineExceeded
	}
	return connect.CodeInternal
}

// httpError is the body of an HTTP endpoint's failure, as envd answers
// it ({"code": 404, "message": "..."}: the SDKs read message), with
// sandgate's stable code beside it.
type httpError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
}

func writeHTTPError(w http.ResponseWriter, status int, reason, msg string) {
	b, _ := json.Marshal(httpError{Code: status, Message: msg, Reason: reason})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// httpStatus is the HTTP status of a Connect code, as the SDKs map
// statuses back (envd/api.py).
func httpStatus(c connect.Code) int {
	switch c {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		return http.StatusBadRequest
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusBadGateway
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeCanceled:
		return 499
	}
	return http.StatusInternalServerError
}

// writeFailure answers an HTTP endpoint's failure err.
func (s *Server) writeFailure(w http.ResponseWriter, r *http.Request, err error, what string) {
	ce := s.toRPC(r.Context(), err, what)
	status := httpStatus(ce.Code())
	// A full disk is 507 for the SDKs (NotEnoughSpaceException), too
	// large 413.
	switch ce.Meta().Get(codeMeta) {
	case "disk_full":
		status = http.StatusInsufficientStorage
	case "file_too_large":
		status = http.StatusRequestEntityTooLarge
	}
	writeHTTPError(w, status, ce.Meta().Get(codeMeta), ce.Message())
}
