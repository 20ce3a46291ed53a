package rest

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/sandbox"
)

// defaultKernel is the kernel a request that names none uses.
const defaultKernel = "default"

// pythonRequest is the body of POST /v1/sessions/{id}/python.
type pythonRequest struct {
	Code           *string  `json:"code"`
	Timeout        *float64 `json:"timeout"`
	Kernel         string   `json:"kernel"`
	MaxOutputBytes *int64   `json:"maxOutputBytes"`
}

// pythonResult is the answer of POST /v1/sessions/{id}/python.
type pythonResult struct {
	Kernel       string                 `json:"kernel"`
	Stdout       *string                `json:"stdout,omitempty"`
	Stderr       *string                `json:"stderr,omitempty"`
	StdoutBase64 *string                `json:"stdoutBase64,omitempty"`
	StderrBase64 *string                `json:"stderrBase64,omitempty"`
	Result       *string                `json:"result"`
	Error        *dataplane.PythonError `json:"error"`
	DurationMs   int64                  `json:"durationMs"`
	Truncated    bool                   `json:"truncated"`
	TimedOut     bool                   `json:"timedOut"`
	Interrupted  bool                   `json:"interrupted"`
	Restarted    bool                   `json:"restarted"`
	StateLost    bool                   `json:"stateLost"`
}

// pythonResetRequest is the body of POST /v1/sessions/{id}/python/reset.
type pythonResetRequest struct {
	Kernel string `json:"kernel"`
}

// kernelName checks a request's kernel name ("" is the default one),
// answering 400 itself for a bad one.
func kernelName(w http.ResponseWriter, name string) (string, bool) {
	if name == "" {
		return defaultKernel, true
	}
	if !dataplane.ValidKernelName(name) {
		WriteError(w, http.StatusBadRequest, "invalid_kernel_name", "a kernel name is 1 to 64 letters, digits, '_', '.' or '-'")
		return "", false
	}
	return name, true
}

// parse checks the request and turns it into a dataplane.PythonRequest;
// it returns a code and message for a bad one (a 400).
func (pr pythonRequest) parse(cfg DataPlane) (dataplane.PythonRequest, string, string) {
	var req dataplane.PythonRequest
	if pr.Code == nil {
		return req, "invalid_code", "give code: the Python source to run"
	}
	req.Code = *pr.Code
	req.Timeout = defaultCommandTimeout
	if pr.Timeout != nil {
		t, ok := timeoutSeconds(*pr.Timeout, cfg.MaxTimeout)
		if !ok {
			return req, "invalid_timeout", fmt.Sprintf("timeout must be above 0 and at most %g seconds", cfg.MaxTimeout.Seconds())
		}
		req.Timeout = t
	}
	req.MaxOutputBytes = min(defaultCommandOutput, cfg.MaxOutputBytes)
	if pr.MaxOutputBytes != nil {
		if *pr.MaxOutputBytes < 0 {
			return req, "invalid_max_output", "maxOutputBytes must not be negative"
		}
		req.MaxOutputBytes = min(*pr.MaxOutputBytes, cfg.MaxOutputBytes)
	}
	return req, "", ""
}

// runPython serves POST /v1/sessions/{id}/python: code run in the
// session's persistent kernel. A client that leaves interrupts its code
// as a timeout does.
func (a *api) runPython(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	var pr pythonRequest
	if status, code, msg := decodeJSON(w, r, &pr); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	name, ok := kernelName(w, pr.Kernel)
	if !ok {
		return
	}
	req, code, msg := pr.parse(a.dp.Bounds)
	if code != "" {
		WriteError(w, http.StatusBadRequest, code, msg)
		return
	}
	res, err := a.dp.Kernels.Run(r.Context(), s.ID, s, name, req)
	result := "ok"
	switch {
	case err != nil:
		result = "not_run"
	case res.TimedOut:
		result = "timed_out"
	case res.Error != nil:
		result = "error"
	}
	a.auditKernel(r, s, name, req.Code, res.Duration, result)
	if err != nil {
		if r.Context().Err() != nil {
			return // gone
		}
		a.writeKernelError(w, r, s.ID, name, err)
		return
	}
	out := pythonResult{Kernel: name, Result: res.Result, Error: res.Error, DurationMs: res.Duration.Milliseconds(),
		Truncated: res.Truncated(), TimedOut: res.TimedOut, Interrupted: res.Interrupted,
		Restarted: res.Restarted, StateLost: res.StateLost}
	out.Stdout, out.StdoutBase64 = outputFields(res.Stdout)
	out.Stderr, out.StderrBase64 = outputFields(res.Stderr)
	_ = writeJSON(w, http.StatusOK, out)
}

// writeKernelError answers a call that could not run.
func (a *api) writeKernelError(w http.ResponseWriter, r *http.Request, id, name string, err error) {
	var kse *dataplane.KernelStartError
	switch {
	case errors.As(err, &kse):
		WriteError(w, http.StatusBadRequest, "python_unavailable",
			"python3 in this session's image could not run the kernel: "+kse.Reason)
	case errors.Is(err, dataplane.ErrPythonUnavailable):
		WriteError(w, http.StatusBadRequest, "python_unavailable",
			"this session's image has no python3 on its PATH; use an image with Python")
	case errors.Is(err, dataplane.ErrTooManyKernels):
		WriteError(w, http.StatusTooManyRequests, "too_many_kernels",
			fmt.Sprintf("a session may have at most %d Python kernels", dataplane.MaxKernels))
	case errors.Is(err, dataplane.ErrKernelBusy):
		WriteError(w, http.StatusTooManyRequests, "kernel_busy",
			fmt.Sprintf("%d calls already wait for this kernel", dataplane.MaxKernelQueue))
	case errors.Is(err, dataplane.ErrKernelClosed):
		WriteError(w, http.StatusConflict, "kernel_reset", "the kernel was reset while the call waited for it")
	case errors.Is(err, dataplane.ErrSessionEnded), errors.Is(err, sandbox.ErrClosed):
		WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; delete it")
	default:
		if !errors.Is(err, context.Canceled) {
			a.cfg.Log.WarnContext(r.Context(), "python_failed", "session", id, "kernel", name, "err", err)
		}
		WriteError(w, http.StatusInternalServerError, "internal", "the Python kernel could not be started")
	}
}

// resetPython serves POST /v1/sessions/{id}/python/reset: the kernel's
// interpreter ends (code it runs is killed) and the next call starts a
// fresh one; files stay.
func (a *api) resetPython(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	var rr pythonResetRequest
	if status, code, msg := decodeJSON(w, r, &rr); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	name, ok := kernelName(w, rr.Kernel)
	if !ok {
		return
	}
	existed := a.dp.Kernels.Reset(s.ID, name)
	_ = writeJSON(w, http.StatusOK, map[string]any{"kernel": name, "existed": existed})
}
