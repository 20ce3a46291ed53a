package rest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox"
)

// TestDataPlaneErrorsRender checks that the data plane's failures, each a
// *gateway.Error under errors.As, answer through the one renderer with
// the status, code, message and Retry-After the per-area mappers they
// replaced answered (issue 36).
func TestDataPlaneErrorsRender(t *testing.T) {
	for _, tc := range []struct {
		err         error
		status      int
		code, msg   string
		retryAfter  string
		description string
	}{
		{dataplane.ErrTooManyShells, 429, "too_many_shells", fmt.Sprintf("a session may have at most %d shells; delete one", dataplane.MaxShells), "", "shells"},
		{dataplane.ErrShellBusy, 429, "shell_busy", fmt.Sprintf("%d commands already wait for this shell", dataplane.MaxShellQueue), "", "shell queue"},
		{dataplane.ErrShellClosed, 409, "shell_closed", "the shell was deleted while the command waited for it", "", "shell closed"},
		{dataplane.ErrSessionEnded, 409, "session_not_running", "the session is not running; delete it", "", "session ended"},
		{dataplane.Failure(fmt.Errorf("start: %w", sandbox.ErrClosed), "the command could not be started"), 409, "session_not_running", "the session is not running; delete it", "", "sandbox closed"},
		{dataplane.Failure(errors.New("boom"), "the command could not be started"), 500, "internal", "the command could not be started", "", "unexplained"},
		{dataplane.ErrTenantBudget, 429, "too_many_commands", "the tenant's running commands hold all the output memory it may use; " +
			"retry when some end, or ask for a smaller maxOutputBytes", "1", "tenant budget"},
		{dataplane.ErrGatewayBudget, 503, "commands_unavailable", "running commands hold all the output memory of the gateway; retry when some end", "1", "gateway budget"},
		{&dataplane.KernelStartError{Reason: "too old"}, 400, "python_unavailable", "python3 in this session's image could not run the kernel: too old", "", "kernel start"},
		{dataplane.ErrPythonUnavailable, 400, "python_unavailable", "this session's image has no python3 on its PATH; use an image with Python", "", "no python"},
		{dataplane.ErrTooManyKernels, 429, "too_many_kernels", fmt.Sprintf("a session may have at most %d Python kernels", dataplane.MaxKernels), "", "kernels"},
		{dataplane.ErrKernelBusy, 429, "kernel_busy", fmt.Sprintf("%d calls already wait for this kernel", dataplane.MaxKernelQueue), "", "kernel queue"},
		{dataplane.ErrKernelClosed, 409, "kernel_reset", "the kernel was reset while the call waited for it", "", "kernel reset"},
		{dataplane.ErrProcessExited, 409, "process_exited", "the process has exited", "", "process exited"},
		{dataplane.ErrStdinClosed, 409, "stdin_closed", "the process's standard input was closed (eof)", "", "stdin closed"},
		{&dataplane.Error{Kind: dataplane.KindNotFound, Msg: "a: no such file"}, 404, "file_not_found", "a: no such file", "", "file not found"},
		{&dataplane.Error{Kind: dataplane.KindPermission, Msg: "a: denied"}, 403, "permission_denied", "a: denied", "", "permission"},
		{&dataplane.Error{Kind: dataplane.KindTooLarge, Msg: "a: too large"}, 413, "file_too_large", "a: too large", "", "too large"},
		{&dataplane.Error{Kind: dataplane.KindDiskFull, Msg: "a: full"}, 507, "disk_full", "a: full", "", "disk full"},
		{&dataplane.Error{Kind: dataplane.KindBusy, Msg: "busy"}, 503, "too_many_file_transfers", "busy", "1", "transfers"},
		{&dataplane.Error{Kind: dataplane.KindAborted, Msg: "cut"}, 400, "upload_incomplete", "cut", "", "aborted"},
	} {
		w := httptest.NewRecorder()
		rest.WriteGatewayError(w, fmt.Errorf("wrapped: %w", tc.err))
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v", tc.description, err)
		}
		if w.Code != tc.status || body.Error.Code != tc.code || body.Error.Message != tc.msg || w.Header().Get("Retry-After") != tc.retryAfter {
			t.Errorf("%s: %d %s %q (Retry-After %q), want %d %s %q (%q)", tc.description, w.Code, body.Error.Code, body.Error.Message,
				w.Header().Get("Retry-After"), tc.status, tc.code, tc.msg, tc.retryAfter)
		}
	}
	// An error of no kind the API names finds no answer of its own.
	if _, ok := gateway.AsError(&dataplane.Error{Kind: dataplane.KindExists, Msg: "taken"}); ok {
		t.Error("KindExists has an answer of its own")
	}
}
