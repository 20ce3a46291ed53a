package rest

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// DefaultKernel is the kernel a request that names none uses.
const DefaultKernel = "default"

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
		return DefaultKernel, true
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
	req.Timeout = defaultTimeout(cfg.MaxTimeout)
	if pr.Timeout != nil {
		t, ok := timeoutSeconds(*pr.Timeout, cfg.MaxTimeout)
		if !ok {
			return req, "invalid_timeout", fmt.Sprintf("timeout must be above 0 and at most %g seconds", cfg.MaxTimeout.Seconds())
		}
		req.Timeout = t
	}
	req.MaxOutputBytes = min(DefaultCommandOutput, cfg.MaxOutputBytes)
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
	if status, code, msg := DecodeJSON(w, r, &pr); status != 0 {
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
	// The kept output is charged to the command memory budget, as a
	// command's is, until the answer is written.
	release, err := a.dp.Budget.Acquire(r.Context(), s.Tenant, dataplane.CommandCost(req.MaxOutputBytes, false))
	if err != nil {
		if r.Context().Err() == nil {
			WriteGatewayError(w, err) // the budget's errors say 429 or 503
		}
		return
	}
	defer release()
	res, err := a.dp.Kernels.Run(r.Context(), s.ID, s, name, req)
	result := "ok"
	switch {
	case errors.Is(err, dataplane.ErrKernelLetGo):
		result = "paused" // its cell goes on in the sandbox
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
		err = dataplane.Failure(err, "the Python kernel could not be started")
		if ge, _ := gateway.AsError(err); ge.Kind == gateway.KindInternal && !errors.Is(err, context.Canceled) {
			a.cfg.Log.WarnContext(r.Context(), "python_failed", "session", s.ID, "kernel", name, "err", err)
		}
		WriteGatewayError(w, err)
		return
	}
	out := pythonResult{Kernel: name, Result: res.Result, Error: res.Error, DurationMs: res.Duration.Milliseconds(),
		Truncated: res.Truncated(), TimedOut: res.TimedOut, Interrupted: res.Interrupted,
		Restarted: res.Restarted, StateLost: res.StateLost}
	out.Stdout, out.StdoutBase64 = outputFields(res.Stdout)
	out.Stderr, out.StderrBase64 = outputFields(res.Stderr)
	_ = WriteJSON(w, http.StatusOK, out)
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
	if status, code, msg := DecodeJSON(w, r, &rr); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	name, ok := kernelName(w, rr.Kernel)
	if !ok {
		return
	}
	existed := a.dp.Kernels.Reset(s.ID, name)
	_ = WriteJSON(w, http.StatusOK, map[string]any{"kernel": name, "existed": existed})
}
