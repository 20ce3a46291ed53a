package gateway

import (
	"errors"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// Error is a gateway error with a stable code for API clients.
type Error struct {
	Kind    Kind
	Code    string
	Message string
	// RetryAfter, when positive, is how long the client should wait
	// before it tries again (transports send it as Retry-After).
	RetryAfter time.Duration
	Err        error
}

// Kind classifies errors so transports can pick a status code.
type Kind int

// Error kinds.
const (
	KindInvalid Kind = iota + 1
	KindNotFound
	KindQuota
	KindUnavailable
	KindInternal
	KindUnauthorized
	KindConflict
	// KindUnprocessable is a well-formed request that contradicts an
	// earlier one (an idempotency key reused with another payload).
	KindUnprocessable
	// KindUpstream is a failure of a server the gateway depends on (an
	// image registry).
	KindUpstream
	// KindGone is a session that ended a short while ago (session_gone):
	// its tombstone tells when and why.
	KindGone
	// KindForbidden is an operation the caller may not do in the sandbox
	// (a file the sandbox's user may not touch).
	KindForbidden
	// KindTooLarge is a request over a size cap (a file over the
	// upload cap).
	KindTooLarge
	// KindInsufficientStorage is a sandbox whose filesystem is full.
	KindInsufficientStorage
	// KindUpstreamTimeout is a server the gateway relays to (a sandbox's
	// port) that did not answer in time.
	KindUpstreamTimeout
)

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Sentinel is an error condition callers test for with errors.Is. Its
// values are constants, so no importer can reassign or alter them; its
// value is the condition's API code. errors.As to a *Error yields a fresh
// copy of the condition's kind, code and message.
type Sentinel string

// Sentinel errors.
const (
	// ErrNotFound is returned for missing sessions and for sessions of
	// another tenant alike.
	ErrNotFound Sentinel = "not_found"
	// ErrUnauthorized is returned for every token that does not verify;
	// the reason is deliberately not told to the client.
	ErrUnauthorized Sentinel = "unauthorized"
)

func (s Sentinel) Error() string { return s.detail().Message }

// As lets errors.As find a *Error in s.
func (s Sentinel) As(target any) bool {
	p, ok := target.(**Error)
	if ok {
		*p = s.detail()
	}
	return ok
}

func (s Sentinel) detail() *Error {
	switch s {
	case ErrNotFound:
		return &Error{Kind: KindNotFound, Code: string(s), Message: "session not found"}
	case ErrUnauthorized:
		return &Error{Kind: KindUnauthorized, Code: string(s), Message: "missing or invalid bearer token"}
	}
	return &Error{Kind: KindInternal, Code: string(s), Message: string(s)}
}

// Invalid returns a KindInvalid error with the given code and message.
func Invalid(code, msg string) error {
	return &Error{Kind: KindInvalid, Code: code, Message: msg}
}

// OrInternal is err when it carries a *Error (errors.As), and otherwise
// err wrapped in an internal error whose message, for the client, is msg:
// what the transports answer for a failure they cannot explain.
func OrInternal(err error, msg string) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	if errors.Is(err, sandbox.ErrPaused) { // paused under the call (pause.go)
		return ErrPaused
	}
	return &Error{Kind: KindInternal, Code: "internal", Message: msg, Err: err}
}

// AsError extracts a *Error from err.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
