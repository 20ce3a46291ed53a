package dataplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// The data plane's client-facing failures are *gateway.Error, as the
// session manager's are: each error below turns into one under
// errors.As, with the code and message the API answers, and the one
// renderer of the transports (rest.WriteGatewayError) answers it.

// clientError is an error of the data plane (err: its text in logs, and
// what errors.Is finds) and api, what the client is told of it.
type clientError struct {
	err error
	api gateway.Error
}

func (e *clientError) Error() string { return e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// As lets errors.As find a *gateway.Error in e (a fresh copy).
func (e *clientError) As(target any) bool {
	p, ok := target.(**gateway.Error)
	if ok {
		c := e.api
		*p = &c
	}
	return ok
}

func newClientError(text string, kind gateway.Kind, code, msg string) *clientError {
	return &clientError{err: errors.New(text), api: gateway.Error{Kind: kind, Code: code, Message: msg}}
}

// refusal is err, a bound's refusal whose text names the bound, told to
// the client as a 429 with code and hint after err's text.
func refusal(err error, code, hint string) error {
	return &clientError{err: err, api: gateway.Error{Kind: gateway.KindQuota, Code: code, Message: err.Error() + hint}}
}

// sessionNotRunning is what the client is told of a session that ended.
const sessionNotRunning = "the session is not running; delete it"

// Failure is the client-facing form of err, a failure of a command or a
// kernel call: err itself when it carries a *gateway.Error,
// ErrSessionEnded for a sandbox that closed under the call, else an
// internal error telling the client msg.
func Failure(err error, msg string) error {
	if errors.Is(err, sandbox.ErrClosed) && !errors.Is(err, ErrSessionEnded) {
		return fmt.Errorf("%w: %w", ErrSessionEnded, err)
	}
	return gateway.OrInternal(err, msg)
}

// As lets errors.As find a *gateway.Error in a file operation's failure,
// with the code the API answers for its kind; an error of no kind the API
// names finds none.
func (e *Error) As(target any) bool {
	p, ok := target.(**gateway.Error)
	if !ok {
		return false
	}
	ge := &gateway.Error{Message: e.Msg, Err: e.Err}
	switch e.Kind {
	case KindInvalid:
		ge.Kind, ge.Code = gateway.KindInvalid, "invalid_path"
	case KindNotFound:
		ge.Kind, ge.Code = gateway.KindNotFound, "file_not_found"
	case KindNotDir:
		ge.Kind, ge.Code = gateway.KindConflict, "not_a_directory"
	case KindIsDir:
		ge.Kind, ge.Code = gateway.KindConflict, "is_a_directory"
	case KindNotRegular:
		ge.Kind, ge.Code = gateway.KindConflict, "not_a_regular_file"
	case KindNotEmpty:
		ge.Kind, ge.Code = gateway.KindConflict, "directory_not_empty"
	case KindPermission:
		ge.Kind, ge.Code = gateway.KindForbidden, "permission_denied"
	case KindTooLarge:
		ge.Kind, ge.Code = gateway.KindTooLarge, "file_too_large"
	case KindDiskFull:
		ge.Kind, ge.Code = gateway.KindInsufficientStorage, "disk_full"
	case KindAborted:
		ge.Kind, ge.Code = gateway.KindInvalid, "upload_incomplete"
	case KindUnavailable:
		ge.Kind, ge.Code = gateway.KindUnavailable, "files_unavailable"
	case KindBusy:
		ge.Kind, ge.Code, ge.RetryAfter = gateway.KindUnavailable, "too_many_file_transfers", time.Second
	default:
		return false
	}
	*p = ge
	return true
}

// As lets errors.As find a *gateway.Error in e: python_unavailable, with
// the reason.
func (e *KernelStartError) As(target any) bool {
	p, ok := target.(**gateway.Error)
	if ok {
		*p = &gateway.Error{Kind: gateway.KindInvalid, Code: "python_unavailable",
			Message: "python3 in this session's image could not run the kernel: " + e.Reason}
	}
	return ok
}

// KernelPausedMessage is the answer of a call on kernel name that a pause
// ended (409 session_paused): under serve --checkpoint the pause let go
// of the kernel under it (ErrKernelLetGo), its cell running on.
func KernelPausedMessage(name string) string {
	return fmt.Sprintf("the session was paused during the call: the code goes on in the sandbox, in kernel %q, which keeps its state; "+
		"the next call on that kernel resumes the session, waits for this code to end, and then sees what it set "+
		"(this call's output from the pause on is not kept)", name)
}

// ShellPausedMessage is the answer of a command of shell name that a
// pause ended (409 session_paused): it goes on in that shell when the
// session resumes.
func ShellPausedMessage(name string) string {
	return fmt.Sprintf("the session was paused during the call: the command goes on in the sandbox, in shell %q; "+
		"the next command in that shell resumes the session, waits for this one to end, and then finds the shell's state "+
		"(directory, exports) as it left it (this command's output from the pause on is not kept)", name)
}

// ErrKernelLetGo (errors.Is) is the answer of a kernel call whose kernel
// a pause by checkpoint let go of under it, and ErrShellLetGo of a
// shell's command: the code goes on in the sandbox, and the next call
// takes the kernel (the shell) back. Both are gateway.ErrPaused too.
var (
	ErrKernelLetGo = fmt.Errorf("the kernel was let go of for a pause by checkpoint during the call: %w", gateway.ErrPaused)
	ErrShellLetGo  = fmt.Errorf("the shell was let go of for a pause by checkpoint during the command: %w", gateway.ErrPaused)
)

// kernelLetGo is ErrKernelLetGo for kernel name, told to the client as
// 409 session_paused.
func kernelLetGo(name string) error {
	return &clientError{err: ErrKernelLetGo, api: gateway.Error{Kind: gateway.KindConflict, Code: "session_paused",
		Message: KernelPausedMessage(name)}}
}

// shellLetGo is ErrShellLetGo for shell name.
func shellLetGo(name string) error {
	return &clientError{err: ErrShellLetGo, api: gateway.Error{Kind: gateway.KindConflict, Code: "session_paused",
		Message: ShellPausedMessage(name)}}
}

// kernelWaitPaused is the answer of a call on kernel name that a pause
// by checkpoint ended while it waited for the cell an earlier pause let
// go of (syncTakenBack): 409 session_paused, as ErrKernelLetGo's, but
// this call's code was never sent: it did not run, and does not.
func kernelWaitPaused(name string) error {
	return &clientError{err: gateway.ErrPaused, api: gateway.Error{Kind: gateway.KindConflict, Code: "session_paused",
		Message: fmt.Sprintf("the session was paused while the call waited for the code an earlier pause interrupted in kernel %q: "+
			"this call's code did not run; call again (the next call resumes the session and waits for that code to end)", name)}}
}

// shellWaitPaused is kernelWaitPaused for a command of shell name.
func shellWaitPaused(name string) error {
	return &clientError{err: gateway.ErrPaused, api: gateway.Error{Kind: gateway.KindConflict, Code: "session_paused",
		Message: fmt.Sprintf("the session was paused while the command waited for the one an earlier pause interrupted in shell %q: "+
			"this command did not run; run it again (the next command resumes the session and waits for that one to end)", name)}}
}
