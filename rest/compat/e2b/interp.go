package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// The code interpreter (E2B's port 49999, the e2b-code-interpreter SDK):
//
//	POST   /execute                 run code; the answer streams JSON lines
//	POST   /contexts                a new context (a kernel of its own)
//	GET    /contexts                the sandbox's contexts
//	DELETE /contexts/{id}           end one
//	POST   /contexts/{id}/restart   a fresh interpreter in its place
//
// A Python context is a named kernel of the data plane (the default one is
// /v1's default kernel, so /v1/sessions/{id}/python shares its state); a
// bash context is a named persistent shell. The kernel runs with its
// display hooks on (dataplane/kernel.py): a result carries the MIME types
// the value's _repr_*_ methods give, display() shows, and matplotlib's
// figures as image/png.

// Languages and the default contexts' names.
const (
	langPython = "python"
	langBash   = "bash"
	// defaultBashShell is the default bash context's shell.
	defaultBashShell = "e2b-bash"
	// maxContexts bounds a sandbox's contexts besides the two defaults
	// (a kernel each at most: dataplane.MaxKernels, the default's
	// included).
	maxContexts = dataplane.MaxKernels - 1
)

// codeContext is a context as E2B's API shows it.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// contexts are the contexts the sandboxes' callers made, per session id.
// They live in the gateway's memory: a restart forgets them (their
// kernels and shells stay the data plane's, which restores them).
type contexts struct {
	mu sync.Mutex
	m  map[string]*sessionContexts
}

// sessionContexts are one session's contexts, and what unregisters the
// function its end calls.
type sessionContexts struct {
	byID       map[string]codeContext
	unregister func()
}

// defaults are the contexts every sandbox has.
func defaultContexts() []codeContext {
	return []codeContext{
		{ID: rest.DefaultKernel, Language: langPython, Cwd: ""},
		{ID: defaultBashShell, Language: langBash, Cwd: ""},
	}
}

// get is session id's context cid.
func (c *contexts) get(id, cid string) (codeContext, bool) {
	for _, d := range defaultContexts() {
		if d.ID == cid {
			return d, true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc := c.m[id]; sc != nil {
		cc, ok := sc.byID[cid]
		return cc, ok
	}
	return codeContext{}, false
}

// list is session id's contexts, the defaults first.
func (c *contexts) list(id string) []codeContext {
	out := defaultContexts()
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc := c.m[id]; sc != nil {
		for _, cc := range sc.byID {
			out = append(out, cc)
		}
	}
	return out
}

// add adds cc to session s's contexts, or reports false when it has
// maxContexts or has ended. The session's end, or its stop (its kernels
// die with its processes), forgets them (gateway.Session.AddConn).
func (c *contexts) add(s *gateway.Session, cc codeContext) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*sessionContexts{}
	}
	sc := c.m[s.ID]
	if sc == nil {
		unregister, ok := s.AddConn(func() { c.forget(s.ID) })
		if !ok {
			return false
		}
		sc = &sessionContexts{byID: map[string]codeContext{}, unregister: unregister}
		c.m[s.ID] = sc
	}
	if len(sc.byID) >= maxContexts {
		return false
	}
	sc.byID[cc.ID] = cc
	return true
}

// remove removes session id's context cid.
func (c *contexts) remove(id, cid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc := c.m[id]; sc != nil {
		delete(sc.byID, cid)
		if len(sc.byID) == 0 {
			sc.unregister()
			delete(c.m, id)
		}
	}
}

// forget drops every context of session id (it ended, or stopped: its
// kernels died).
func (c *contexts) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc := c.m[id]; sc != nil {
		sc.unregister()
		delete(c.m, id)
	}
}

// serveInterpreter serves one code interpreter request for s.
func (a *api) serveInterpreter(w http.ResponseWriter, r *http.Request, s *gateway.Session) {
	rt := chi.NewRouter()
	rt.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "unknown_endpoint", "no such code interpreter endpoint: "+r.Method+" "+r.URL.Path)
	})
	rt.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method "+r.Method+" not allowed here")
	})
	rt.Get("/health", func(w http.ResponseWriter, r *http.Request) {
		_ = writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	rt.Post("/execute", func(w http.ResponseWriter, r *http.Request) { a.execute(w, r, s) })
	rt.Post("/contexts", func(w http.ResponseWriter, r *http.Request) { a.createContext(w, r, s) })
	rt.Get("/contexts", func(w http.ResponseWriter, r *http.Request) { _ = writeJSON(w, http.StatusOK, a.contexts.list(s.ID)) })
	rt.Delete("/contexts/{cid}", func(w http.ResponseWriter, r *http.Request) { a.deleteContext(w, r, s) })
	rt.Post("/contexts/{cid}/restart", func(w http.ResponseWriter, r *http.Request) { a.restartContext(w, r, s) })
	rt.ServeHTTP(w, r)
}

// language is E2B's language name as one of ours, or "".
func language(l string) string {
	switch strings.ToLower(l) {
	case "", "python", "python3", "py":
		return langPython
	case "bash", "sh", "shell":
		return langBash
	}
	return ""
}

// unsupportedLanguage answers a language sandgate has no kernel for.
func unsupportedLanguage(w http.ResponseWriter, l string) {
	writeError(w, http.StatusBadRequest, "unsupported_language",
		fmt.Sprintf("language %q is not supported: sandgate's code interpreter runs python and bash", l))
}

// createContext serves POST /contexts: a context of its own kernel (or
// shell), starting in cwd.
func (a *api) createContext(w http.ResponseWriter, r *http.Request, s *gateway.Session) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	lang := language(body.Language)
	if lang == "" {
		unsupportedLanguage(w, body.Language)
		return
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cc := codeContext{ID: "ctx-" + hex.EncodeToString(b[:]), Language: lang, Cwd: body.Cwd}
	if !a.contexts.add(s, cc) {
		writeError(w, http.StatusTooManyRequests, "too_many_contexts",
			fmt.Sprintf("a sandbox may have at most %d contexts besides the default ones; delete one", maxContexts))
		return
	}
	if body.Cwd != "" {
		// Start there: the context's first call, which also starts its
		// kernel or shell (a directory that does not exist fails here).
		var err error
		if lang == langPython {
			err = a.pythonSetup(r.Context(), s, cc.ID, fmt.Sprintf("import os as _sg_os\n_sg_os.chdir(%s)\ndel _sg_os", pyString(body.Cwd)))
		} else {
			err = a.bashSetup(r.Context(), s, cc.ID, "cd -- "+dataplane.Quote(body.Cwd))
		}
		if err != nil {
			a.dropContext(s, cc)
			writeError(w, http.StatusBadRequest, "invalid_cwd", fmt.Sprintf("cannot start the context in %q: %v", body.Cwd, err))
			return
		}
	}
	_ = writeJSON(w, http.StatusOK, cc)
}

// pyString is s as a Python string literal (JSON's escapes are Python's).
func pyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// setupTimeout bounds a context's setup calls.
const setupTimeout = 30 * time.Second

// pythonSetup runs code in the context's kernel, failing on its error.
func (a *api) pythonSetup(ctx context.Context, s *gateway.Session, kernel, code string) error {
	res, err := a.d.Plane.Kernels.Run(ctx, s.ID, s, kernel, dataplane.PythonRequest{Code: code, Timeout: setupTimeout, MaxOutputBytes: 64 << 10})
	if err != nil {
		return err
	}
	if res.Error != nil {
		return fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	return nil
}

// bashSetup runs command in the context's shell, failing on its status.
func (a *api) bashSetup(ctx context.Context, s *gateway.Session, shell, command string) error {
	res, err := a.d.Plane.Shells.Run(ctx, s.ID, s, shell, dataplane.Request{Command: command, Timeout: setupTimeout, MaxOutputBytes: 64 << 10})
	if err != nil {
		return err
	}
	defer res.Release()
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return fmt.Errorf("%s", strings.TrimSpace(res.Stderr.Text))
	}
	return nil
}

// dropContext ends cc's kernel or shell and forgets it.
func (a *api) dropContext(s *gateway.Session, cc codeContext) {
	a.contexts.remove(s.ID, cc.ID)
	if cc.Language == langPython {
		a.d.Plane.Kernels.Reset(s.ID, cc.ID)
	} else {
		_ = a.d.Plane.Shells.Delete(s.ID, cc.ID)
	}
}

// deleteContext serves DELETE /contexts/{cid}.
func (a *api) deleteContext(w http.ResponseWriter, r *http.Request, s *gateway.Session) {
	cc, ok := a.contexts.get(s.ID, chi.URLParam(r, "cid"))
	if !ok {
		writeError(w, http.StatusNotFound, "context_not_found", fmt.Sprintf("no context %q in this sandbox", chi.URLParam(r, "cid")))
		return
	}
	for _, d := range defaultContexts() {
		if d.ID == cc.ID {
			writeError(w, http.StatusBadRequest, "default_context",
				fmt.Sprintf("context %q is a default one, which cannot be deleted; restart it instead", cc.ID))
			return
		}
	}
	a.dropContext(s, cc)
	w.WriteHeader(http.StatusNoContent)
}

// restartContext serves POST /contexts/{cid}/restart: its kernel (or
// shell) ends, and the next call starts a fresh one, in its cwd.
func (a *api) restartContext(w http.ResponseWriter, r *http.Request, s *gateway.Session) {
	cc, ok := a.contexts.get(s.ID, chi.URLParam(r, "cid"))
	if !ok {
		writeError(w, http.StatusNotFound, "context_not_found", fmt.Sprintf("no context %q in this sandbox", chi.URLParam(r, "cid")))
		return
	}
	if cc.Language == langPython {
		a.d.Plane.Kernels.Reset(s.ID, cc.ID)
	} else {
		_ = a.d.Plane.Shells.Delete(s.ID, cc.ID)
	}
	if cc.Cwd != "" {
		var err error
		if cc.Language == langPython {
			err = a.pythonSetup(r.Context(), s, cc.ID, fmt.Sprintf("import os as _sg_os\n_sg_os.chdir(%s)\ndel _sg_os", pyString(cc.Cwd)))
		} else {
			err = a.bashSetup(r.Context(), s, cc.ID, "cd -- "+dataplane.Quote(cc.Cwd))
		}
		if err != nil {
			writeError(w, http.StatusConflict, "invalid_cwd", fmt.Sprintf("the context restarted, but not in %q: %v", cc.Cwd, err))
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// executeBody is /execute's body.
type executeBody struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execution streams /execute's answer: one JSON object a line, flushed.
// Each line must be taken by the client within stall: a client that stops
// reading fails the answer, which cancels the call's context (cancel), so
// that its cell is interrupted and the kernel (or shell) and the Budget
// slot are freed; the lines after that are dropped.
type execution struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	stall   time.Duration
	cancel  context.CancelFunc
	failed  bool
	limit   int64     // output forwarded per stream, at most
	sent    [2]int64  // stdout, stderr forwarded
	noted   [2]bool   // the cut was said
	partial [2][]byte // the start of a character the next piece ends
}

// start answers 200 at once, as E2B's server does: a cell that runs long
// without output keeps no client (or proxy) waiting for the headers.
func (e *execution) start() {
	e.w.Header().Set("Content-Type", "application/x-ndjson")
	e.w.Header().Set("Cache-Control", "no-store")
	e.w.WriteHeader(http.StatusOK)
	_ = e.rc.SetWriteDeadline(time.Now().Add(e.stall))
	if e.rc.Flush() != nil {
		e.fail()
	}
}

// line writes one line of the answer, within stall.
func (e *execution) line(v map[string]any) {
	if e.failed {
		return
	}
	_ = e.rc.SetWriteDeadline(time.Now().Add(e.stall))
	if e.enc.Encode(v) != nil || e.rc.Flush() != nil {
		e.fail()
	}
}

// fail gives up the answer: its client is gone or takes nothing.
func (e *execution) fail() {
	e.failed = true
	e.cancel()
}

// end is the answer's last line.
func (e *execution) end() {
	e.line(map[string]any{"type": "end_of_execution"})
}

// output forwards a piece of stdout or stderr, up to the limit.
func (e *execution) output(stderr bool, data []byte) {
	i, kind := 0, "stdout"
	if stderr {
		i, kind = 1, "stderr"
	}
	if e.sent[i] >= e.limit {
		if !e.noted[i] {
			e.noted[i] = true
			e.line(map[string]any{"type": "stderr", "text": fmt.Sprintf("\n[sandgate: %s cut at %d bytes]\n", kind, e.limit), "timestamp": now()})
		}
		return
	}
	if room := e.limit - e.sent[i]; int64(len(data)) > room {
		data = data[:room]
	}
	e.sent[i] += int64(len(data))
	data = append(e.partial[i], data...)
	cut := len(data)
	for k := 1; k < utf8.UTFMax && k <= len(data); k++ { // an incomplete last character waits
		if b := data[len(data)-k]; utf8.RuneStart(b) {
			if !utf8.FullRune(data[len(data)-k:]) {
				cut = len(data) - k
			}
			break
		}
	}
	e.partial[i] = append([]byte(nil), data[cut:]...)
	if cut > 0 {
		e.line(map[string]any{"type": kind, "text": strings.ToValidUTF8(string(data[:cut]), "\uFFFD"), "timestamp": now()})
	}
}

// now is a line's timestamp, as E2B's server writes it.
func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// mimeFields are the Result fields E2B's SDKs read, by MIME type.
var mimeFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
}

// result is a display as E2B's result line: the known MIME types in
// their fields, the others under extra.
func result(d dataplane.Display) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": d.Main}
	extra := map[string]any{}
	for mime, v := range d.Data {
		if f, ok := mimeFields[mime]; ok {
			out[f] = v
		} else {
			extra[mime] = v
		}
	}
	if len(extra) > 0 {
		out["extra"] = extra
	}
	return out
}

// execute serves POST /execute: the code runs in its context's kernel
// (or shell); stdout, stderr, results and the error stream back as they
// come.
func (a *api) execute(w http.ResponseWriter, r *http.Request, s *gateway.Session) {
	var body executeBody
	if !decodeBody(w, r, &body) {
		return
	}
	cc := defaultContexts()[0]
	switch {
	case body.ContextID != nil && *body.ContextID != "":
		var ok bool
		if cc, ok = a.contexts.get(s.ID, *body.ContextID); !ok {
			writeError(w, http.StatusNotFound, "context_not_found", fmt.Sprintf("no context %q in this sandbox", *body.ContextID))
			return
		}
	case body.Language != nil:
		switch language(*body.Language) {
		case langPython:
		case langBash:
			cc = defaultContexts()[1]
		default:
			unsupportedLanguage(w, *body.Language)
			return
		}
	}
	for k := range body.EnvVars {
		if !envNameRE.MatchString(k) {
			writeError(w, http.StatusBadRequest, "invalid_env", fmt.Sprintf("env_vars: %q is not a valid environment variable name", k))
			return
		}
	}
	maxOut := min(rest.DefaultCommandOutput, a.d.Plane.Bounds.MaxOutputBytes)
	release, err := a.d.Plane.Budget.Acquire(r.Context(), s.Tenant, dataplane.CommandCost(maxOut, false))
	if err != nil {
		if r.Context().Err() == nil {
			writeGatewayError(w, err)
		}
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	r = r.WithContext(ctx)
	ex := &execution{w: w, rc: http.NewResponseController(w), limit: maxOut, stall: a.d.WriteStall, cancel: cancel}
	// The deadline stays on a kept-alive connection: clear it for the next.
	defer func() { _ = ex.rc.SetWriteDeadline(time.Time{}) }()
	ex.enc = json.NewEncoder(w)
	ex.enc.SetEscapeHTML(false)
	ex.start()
	if cc.Language == langBash {
		a.executeBash(r, s, cc, body, ex, maxOut)
		return
	}
	a.executePython(r, s, cc, body, ex, maxOut)
}

// executePython runs body's code in cc's kernel. The env_vars hold for
// this call: the kernel sets them for its cell and puts them back after
// it, in the same turn. The create's envVars, as every process of the
// sandbox has them, are set once per interpreter (a restarted one gets
// them again).
func (a *api) executePython(r *http.Request, s *gateway.Session, cc codeContext, body executeBody, ex *execution, maxOut int64) {
	ctx := r.Context()
	var base map[string]string
	if rec, ok := a.sealer.Of(s); ok {
		base = rec.EnvVars
	}
	req := dataplane.PythonRequest{Code: body.Code, Timeout: a.d.Plane.Bounds.MaxTimeout, MaxOutputBytes: maxOut, Display: true,
		Env: body.EnvVars, BaseEnv: base,
		OnOutput: ex.output,
		OnDisplay: func(d dataplane.Display) {
			ex.line(result(d))
		},
	}
	res, err := a.d.Plane.Kernels.Run(ctx, s.ID, s, cc.ID, req)
	if err != nil {
		if ctx.Err() == nil {
			a.kernelFailed(ex, r, s, err)
		}
		return
	}
	if res.Result != nil && !hasMain(res.Displays) {
		ex.line(map[string]any{"type": "result", "text": *res.Result, "is_main_result": true})
	}
	if e := res.Error; e != nil {
		ex.line(map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback})
	}
	ex.end()
}

// hasMain reports whether ds has the last expression's value.
func hasMain(ds []dataplane.Display) bool {
	for _, d := range ds {
		if d.Main {
			return true
		}
	}
	return false
}

// kernelFailed ends the answer of a call whose kernel (or shell) could not
// run the code (no python3, too many kernels, a busy one) with an error
// line named by sandgate's code for it.
func (a *api) kernelFailed(ex *execution, r *http.Request, s *gateway.Session, err error) {
	ge, ok := errors.AsType[*gateway.Error](err)
	if !ok {
		a.d.Log.WarnContext(r.Context(), "e2b_execute_failed", "session", s.ID, "err", err)
		ge, _ = errors.AsType[*gateway.Error](dataplane.Failure(err, "the code interpreter could not run the code"))
	}
	name, msg := "internal", "the code interpreter could not run the code"
	if ge != nil {
		name, msg = ge.Code, ge.Message
	}
	ex.line(map[string]any{"type": "error", "name": name, "value": msg, "traceback": ""})
	ex.end()
}

// executeBash runs body's code in cc's shell; a status other than 0 is
// the execution's error.
func (a *api) executeBash(r *http.Request, s *gateway.Session, cc codeContext, body executeBody, ex *execution, maxOut int64) {
	env := map[string]string{}
	if rec, ok := a.sealer.Of(s); ok {
		maps.Copy(env, rec.EnvVars) // the create's, under the call's own
	}
	maps.Copy(env, body.EnvVars)
	req := dataplane.Request{Command: body.Code, Env: env, Timeout: a.d.Plane.Bounds.MaxTimeout, MaxOutputBytes: maxOut,
		Stream: func(stream string, data []byte) { ex.output(stream == "stderr", data) }}
	var mu sync.Mutex // Stream may be called from two goroutines
	stream := req.Stream
	req.Stream = func(st string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		stream(st, data)
	}
	res, err := a.d.Plane.Shells.Run(r.Context(), s.ID, s, cc.ID, req)
	if err != nil {
		if r.Context().Err() == nil {
			mu.Lock()
			defer mu.Unlock()
			a.kernelFailed(ex, r, s, err)
		}
		return
	}
	defer res.Release()
	mu.Lock()
	defer mu.Unlock()
	switch {
	case res.TimedOut:
		ex.line(map[string]any{"type": "error", "name": "TimeoutError", "value": "the command timed out", "traceback": ""})
	case res.ExitCode == nil:
		ex.line(map[string]any{"type": "error", "name": "CommandExitError", "value": "killed by signal " + res.ExitSignal, "traceback": ""})
	case *res.ExitCode != 0:
		ex.line(map[string]any{"type": "error", "name": "CommandExitError", "value": fmt.Sprintf("exit status %d", *res.ExitCode), "traceback": ""})
	}
	ex.end()
}
