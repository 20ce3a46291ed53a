package rest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// Bounds of a process start, as SSH bounds a channel's environment.
const (
	maxProcessEnvVars  = 64
	maxProcessEnvBytes = 4096 // one variable, name and value
	maxProcessName     = 64
	maxProcessCwd      = 4096
)

// startProcessRequest is the body of POST .../processes.
type startProcessRequest struct {
	Command *string           `json:"command"`
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env"`
	Cwd     string            `json:"cwd"`
	Name    string            `json:"name"`
}

// processStarted is the answer to a start: the process, and the
// environment names that were not allowed and so not set.
type processStarted struct {
	dataplane.ProcessInfo
	EnvIgnored []string `json:"envIgnored,omitempty"`
}

func (a *api) processConfig() dataplane.ProcessConfig {
	return dataplane.ProcessConfig{StateDir: a.dp.Bounds.StateDir, TenantOutputBytes: a.dp.Bounds.MaxProcessOutputPerTenant, Log: a.cfg.Log}
}

func (a *api) startProcess(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	var req startProcessRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	sr, ignored, msg := a.checkStart(req)
	if msg != "" {
		WriteError(w, http.StatusBadRequest, "invalid_field", msg)
		return
	}
	info, err := a.dp.Processes.Start(r.Context(), s, a.processConfig(), sr)
	if err != nil {
		if _, told := gateway.AsError(err); !told {
			a.cfg.Log.ErrorContext(r.Context(), "process_start_failed", "session", s.ID, "err", err)
		}
		WriteGatewayError(w, gateway.OrInternal(err, "internal error"))
		return
	}
	_ = WriteJSON(w, http.StatusCreated, processStarted{ProcessInfo: info, EnvIgnored: ignored})
}

// checkStart validates a start request; msg says what is wrong with it.
func (a *api) checkStart(req startProcessRequest) (sr dataplane.StartRequest, ignored []string, msg string) {
	switch {
	case req.Command != nil && req.Argv != nil:
		return sr, nil, "give command or argv, not both"
	case req.Command == nil && req.Argv == nil:
		return sr, nil, "command or argv is required"
	case req.Command != nil && strings.TrimSpace(*req.Command) == "":
		return sr, nil, "command must not be empty"
	case req.Argv != nil && len(req.Argv) == 0:
		return sr, nil, "argv must not be empty"
	}
	if req.Command != nil {
		if strings.ContainsRune(*req.Command, 0) {
			return sr, nil, "command must not contain NUL"
		}
		sr.Command = *req.Command
	}
	for _, arg := range req.Argv {
		if strings.ContainsRune(arg, 0) {
			return sr, nil, "argv must not contain NUL"
		}
	}
	if req.Argv != nil && req.Argv[0] == "" {
		return sr, nil, "argv[0] must not be empty"
	}
	sr.Argv = req.Argv
	if len(req.Env) > maxProcessEnvVars {
		return sr, nil, fmt.Sprintf("env has more than %d variables", maxProcessEnvVars)
	}
	for name, value := range req.Env {
		if name == "" || strings.ContainsAny(name, "=\x00") || strings.ContainsRune(value, 0) {
			return sr, nil, fmt.Sprintf("env: %q is not a valid variable", name)
		}
		if len(name)+len(value) > maxProcessEnvBytes {
			return sr, nil, fmt.Sprintf("env: %s is longer than %d bytes", name, maxProcessEnvBytes)
		}
		if !gateway.EnvAllowed(name, a.dp.Bounds.EnvAllow) {
			ignored = append(ignored, name)
			continue
		}
		sr.Env = append(sr.Env, name+"="+value)
	}
	slices.Sort(ignored)
	slices.Sort(sr.Env)
	if len(req.Cwd) > maxProcessCwd || strings.ContainsRune(req.Cwd, 0) {
		return sr, nil, fmt.Sprintf("cwd must be a path of at most %d bytes without NUL", maxProcessCwd)
	}
	sr.Cwd = req.Cwd
	if len(req.Name) > maxProcessName || strings.IndexFunc(req.Name, func(c rune) bool { return !unicode.IsPrint(c) }) >= 0 {
		return sr, nil, fmt.Sprintf("name must be at most %d printable characters", maxProcessName)
	}
	sr.Name = req.Name
	return sr, ignored, ""
}

func (a *api) listProcesses(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	_ = WriteJSON(w, http.StatusOK, map[string]any{"processes": a.dp.Processes.List(s.ID)})
}

// process finds the request's process, answering 404/409 itself.
func (a *api) process(w http.ResponseWriter, r *http.Request) (*dataplane.Process, bool) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return nil, false
	}
	id := chi.URLParam(r, "pid")
	p, ok := a.dp.Processes.Get(s.ID, id)
	if !ok {
		WriteError(w, http.StatusNotFound, "process_not_found", "no process "+strconv.Quote(id)+" in this session")
		return nil, false
	}
	return p, true
}

func (a *api) getProcess(w http.ResponseWriter, r *http.Request) {
	p, ok := a.process(w, r)
	if !ok {
		return
	}
	_ = WriteJSON(w, http.StatusOK, p.Info())
}

// outputLine is one line of the output stream.
type outputLine struct {
	Offset       *int64 `json:"offset,omitempty"`
	Stdout       string `json:"stdout,omitempty"`
	Stderr       string `json:"stderr,omitempty"`
	StdoutBase64 string `json:"stdoutBase64,omitempty"`
	StderrBase64 string `json:"stderrBase64,omitempty"`
	DroppedBytes int64  `json:"droppedBytes,omitempty"`
	Truncated    string `json:"truncated,omitempty"`
	Done         *bool  `json:"done,omitempty"`
	ExitCode     *int   `json:"exitCode,omitempty"`
	ExitSignal   string `json:"exitSignal,omitempty"`
	NextOffset   *int64 `json:"nextOffset,omitempty"`
	// Error, on a last line with done false, says why the stream ended
	// early: session_paused when the session was paused under it (follow
	// again from nextOffset: that resumes it).
	Error *errorDetail `json:"error,omitempty"`
}

func (a *api) processOutput(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	off := int64(0)
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			WriteError(w, http.StatusBadRequest, "invalid_offset", "offset must be an integer (negative: that many bytes before the end)")
			return
		}
		off = n
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			WriteError(w, http.StatusBadRequest, "invalid_field", "follow must be true or false")
			return
		}
		follow = b
	}
	p, ok := a.process(w, r)
	if !ok {
		return
	}
	out := p.Output()
	if off < 0 {
		off = max(0, out.End()+off)
	}
	rd := out.NewReader(off)

	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil { // a follower learns at once that it is attached
		return
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	flush := func() error {
		if buf.Len() == 0 {
			return nil
		}
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		if err == nil {
			err = rc.Flush()
		}
		return err
	}
	ctx := pauseContext(r) // a pause ends the stream (dataSession), as the client leaving does
	for {
		// Send what is there before waiting for more.
		c, err := rd.Next(ctx, false)
		if errors.Is(err, io.EOF) && follow && !out.Closed() {
			if ferr := flush(); ferr != nil {
				return // the client is gone; the process goes on
			}
			c, err = rd.Next(ctx, true)
		}
		switch {
		case errors.Is(err, io.EOF):
			next := rd.Offset()
			line := outputLine{Done: new(bool), NextOffset: &next}
			if out.Closed() && next >= out.End() {
				info := p.Info()
				if info.Status != dataplane.StatusRunning {
					*line.Done = true
					line.ExitCode, line.ExitSignal = info.ExitCode, info.ExitSignal
				}
			}
			_ = enc.Encode(line)
			_ = flush()
			return
		case errors.Is(err, dataplane.ErrOutputGone):
			// The process's record was dropped (the session ended).
			next := rd.Offset()
			_ = enc.Encode(outputLine{Done: new(bool), NextOffset: &next})
			_ = flush()
			return
		case err != nil && gateway.PausedCause(ctx):
			// Paused under the stream (dataSession): it ends, saying so,
			// where a follower picks it up again.
			next := rd.Offset()
			noteErrorCode(w, gateway.ErrPaused.Code)
			_ = enc.Encode(outputLine{Done: new(bool), NextOffset: &next,
				Error: &errorDetail{Code: gateway.ErrPaused.Code, Message: gateway.ErrPaused.Message}})
			_ = flush()
			return
		case err != nil:
			if ctx.Err() == nil {
				a.cfg.Log.WarnContext(r.Context(), "process_output_failed", "err", err)
			}
			_ = flush()
			return
		}
		_ = enc.Encode(chunkLine(c))
		if buf.Len() >= 64<<10 {
			if err := flush(); err != nil {
				return
			}
		}
	}
}

// chunkLine renders a chunk: text as it is, other bytes in base64.
func chunkLine(c dataplane.Chunk) outputLine {
	off := c.Offset
	line := outputLine{Offset: &off}
	if c.Dropped > 0 {
		line.DroppedBytes = c.Dropped
		return line
	}
	if c.Truncated != "" {
		line.Truncated = c.Truncated
		return line
	}
	text := utf8.Valid(c.Data)
	switch {
	case c.Stream == dataplane.Stderr && text:
		line.Stderr = string(c.Data)
	case c.Stream == dataplane.Stderr:
		line.StderrBase64 = base64.StdEncoding.EncodeToString(c.Data)
	case text:
		line.Stdout = string(c.Data)
	default:
		line.StdoutBase64 = base64.StdEncoding.EncodeToString(c.Data)
	}
	return line
}

// stdinRequest is the body of POST .../stdin.
type stdinRequest struct {
	Data       *string `json:"data"`
	DataBase64 *string `json:"dataBase64"`
	EOF        bool    `json:"eof"`
}

func (a *api) processStdin(w http.ResponseWriter, r *http.Request) {
	p, ok := a.process(w, r)
	if !ok {
		return
	}
	var req stdinRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	var data []byte
	switch {
	case req.Data != nil && req.DataBase64 != nil:
		WriteError(w, http.StatusBadRequest, "invalid_field", "give data or dataBase64, not both")
		return
	case req.Data != nil:
		data = []byte(*req.Data)
	case req.DataBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.DataBase64)
		if err != nil {
			WriteError(w, http.StatusBadRequest, "invalid_field", "dataBase64 is not base64")
			return
		}
		data = b
	case !req.EOF:
		WriteError(w, http.StatusBadRequest, "invalid_field", "data, dataBase64 or eof is required")
		return
	}
	n, err := p.WriteStdin(r.Context(), data, req.EOF)
	if errors.Is(err, dataplane.ErrStdinBlocked) { // its answer says how much was written
		err = &gateway.Error{Kind: gateway.KindConflict, Code: "stdin_blocked", Err: err,
			Message: fmt.Sprintf("the process is not reading its standard input: %d of %d bytes were written", n, len(data))}
	}
	a.answerProcessCall(w, r, "process_stdin_failed", err)
}

// answerProcessCall answers a call to a process that returned err: 204,
// or err's *gateway.Error, or 500 (logged as event).
func (a *api) answerProcessCall(w http.ResponseWriter, r *http.Request, event string, err error) {
	if err == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if _, told := gateway.AsError(err); !told {
		a.cfg.Log.ErrorContext(r.Context(), event, "err", err)
	}
	WriteGatewayError(w, gateway.OrInternal(err, "internal error"))
}

// signalRequest is the body of POST .../signal.
type signalRequest struct {
	Signal string `json:"signal"`
}

func (a *api) processSignal(w http.ResponseWriter, r *http.Request) {
	p, ok := a.process(w, r)
	if !ok {
		return
	}
	var req signalRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	sig, ok := sandbox.ParseSignal(strings.TrimPrefix(req.Signal, "SIG"))
	if !ok {
		WriteError(w, http.StatusBadRequest, "invalid_signal",
			fmt.Sprintf("signal %q is not one of ABRT, ALRM, FPE, HUP, ILL, INT, KILL, PIPE, QUIT, SEGV, TERM, USR1, USR2", req.Signal))
		return
	}
	a.answerProcessCall(w, r, "process_signal_failed", p.Signal(sig))
}

// restoreProcesses takes back the background processes, shells and
// kernels a gateway before this one left (dataplane.Processes.Restore,
// Shells.Restore, Kernels.Restore): their sessions are the manager's,
// restored before the API starts.
func (a *api) restoreProcesses() {
	dir := a.dp.Bounds.StateDir
	if dir == "" {
		return
	}
	known, _ := a.cfg.Sessions.(interface{ Known(id string) bool })
	isKnown := func(id string) bool { return known == nil || known.Known(id) }
	lookup := func(id, tenant string) *gateway.Session {
		if !isKnown(id) {
			return nil // not this gateway's
		}
		s, err := a.cfg.Sessions.Get(context.Background(), gateway.Principal{Tenant: tenant}, id)
		if err != nil {
			return nil
		}
		return s
	}
	a.dp.Processes.Restore(a.processConfig(), isKnown, lookup)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !isKnown(id) {
			continue
		}
		if s := lookup(id, dataplane.RecordedTenant(dir, id)); s != nil && s.Live() {
			a.dp.Shells.Restore(id, s)
			a.dp.Kernels.Restore(id, s)
		}
	}
}
