package rest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// Command defaults: a command's timeout and maxOutputBytes (per stream)
// when the request gives none (the compat APIs use them too).
const (
	DefaultCommandTimeout = 60 * time.Second
	DefaultCommandOutput  = 1 << 20
	ndjsonType            = "application/x-ndjson"
)

// commandRequest is the body of POST /v1/sessions/{id}/commands.
type commandRequest struct {
	Command        *string           `json:"command"`
	Argv           []string          `json:"argv"`
	Stdin          *string           `json:"stdin"`
	StdinBase64    *string           `json:"stdinBase64"`
	Env            map[string]string `json:"env"`
	Cwd            string            `json:"cwd"`
	Timeout        *float64          `json:"timeout"`
	MaxOutputBytes *int64            `json:"maxOutputBytes"`
	Shell          string            `json:"shell"`
	Background     bool              `json:"background"`
}

// commandResult is the answer of a command (the last line of a stream).
type commandResult struct {
	ExitCode     *int    `json:"exitCode"`
	ExitSignal   *string `json:"exitSignal"`
	Stdout       *string `json:"stdout,omitempty"`
	Stderr       *string `json:"stderr,omitempty"`
	StdoutBase64 *string `json:"stdoutBase64,omitempty"`
	StderrBase64 *string `json:"stderrBase64,omitempty"`
	Truncated    bool    `json:"truncated"`
	TimedOut     bool    `json:"timedOut"`
	DurationMs   int64   `json:"durationMs"`
	Cwd          string  `json:"cwd"`
	// StateLost: the shell's command ran in a new shell, started from the
	// saved state, that replaced one that ended (dataplane.Result).
	StateLost bool `json:"stateLost,omitempty"`
}

// parse checks the request and turns it into a dataplane.Request; it
// returns a status, code and message for a bad one.
func (cr commandRequest) parse(cfg DataPlane) (dataplane.Request, int, string, string) {
	var req dataplane.Request
	bad := func(code, msg string) (dataplane.Request, int, string, string) {
		return req, http.StatusBadRequest, code, msg
	}
	switch {
	case cr.Command != nil && cr.Argv != nil:
		return bad("invalid_command", "give either command or argv, not both")
	case cr.Command == nil && cr.Argv == nil:
		return bad("invalid_command", "give command (shell text) or argv (an array of words)")
	case cr.Command != nil && strings.TrimSpace(*cr.Command) == "":
		return bad("invalid_command", "command is empty")
	case cr.Argv != nil && (len(cr.Argv) == 0 || cr.Argv[0] == ""):
		return bad("invalid_command", "argv must hold at least a program name")
	}
	for _, s := range append([]string{deref(cr.Command), cr.Cwd}, cr.Argv...) {
		if strings.ContainsRune(s, 0) {
			return bad("invalid_command", "command, argv and cwd may not hold NUL characters")
		}
	}
	if cr.Command != nil {
		req.Command = *cr.Command
	}
	req.Argv = cr.Argv
	req.NoDirect = cfg.CommandShell
	switch {
	case cr.Stdin != nil && cr.StdinBase64 != nil:
		return bad("invalid_stdin", "give either stdin or stdinBase64, not both")
	case cr.Stdin != nil:
		req.Stdin = []byte(*cr.Stdin)
	case cr.StdinBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*cr.StdinBase64)
		if err != nil {
			return bad("invalid_stdin", "stdinBase64 is not valid base64")
		}
		req.Stdin = b
	}
	var refused []string
	for k, v := range cr.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || !gateway.EnvAllowed(k, cfg.EnvAllow) {
			refused = append(refused, strconv.Quote(k))
		}
	}
	if len(refused) > 0 {
		sort.Strings(refused)
		return bad("env_not_allowed", "these environment variables may not be set: "+strings.Join(refused, ", ")+
			" (allowed: TERM, LANG, LC_* and the gateway's allow-list)")
	}
	req.Env = cr.Env
	req.Cwd = cr.Cwd
	req.Timeout = defaultTimeout(cfg.MaxTimeout)
	if cr.Timeout != nil {
		t, ok := timeoutSeconds(*cr.Timeout, cfg.MaxTimeout)
		if !ok {
			return bad("invalid_timeout", fmt.Sprintf("timeout must be above 0 and at most %g seconds", cfg.MaxTimeout.Seconds()))
		}
		req.Timeout = t
	}
	req.MaxOutputBytes = min(DefaultCommandOutput, cfg.MaxOutputBytes)
	if cr.MaxOutputBytes != nil {
		if *cr.MaxOutputBytes < 0 {
			return bad("invalid_max_output", "maxOutputBytes must not be negative")
		}
		req.MaxOutputBytes = min(*cr.MaxOutputBytes, cfg.MaxOutputBytes)
	}
	if cr.Shell != "" && !dataplane.ValidShellName(cr.Shell) {
		return bad("invalid_shell_name", "a shell name is 1 to 64 letters, digits, '_', '.' or '-'")
	}
	return req, 0, "", ""
}

// defaultTimeout is the timeout of a command or kernel call whose request
// gives none: DefaultCommandTimeout, or the gateway's maximum
// (--max-command-timeout) when that is lower.
func defaultTimeout(max time.Duration) time.Duration {
	if max > 0 && max < DefaultCommandTimeout {
		return max
	}
	return DefaultCommandTimeout
}

// timeoutSeconds turns a request's timeout in seconds into a duration; ok
// is false for one not above 0 or above max. The bound is checked in
// seconds, before the conversion, which wraps past 292 years.
func timeoutSeconds(v float64, max time.Duration) (d time.Duration, ok bool) {
	if !(v > 0) || v > max.Seconds() {
		return 0, false
	}
	return time.Duration(v * float64(time.Second)), true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// runCommand serves POST /v1/sessions/{id}/commands.
func (a *api) runCommand(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	var cr commandRequest
	if status, code, msg := DecodeJSON(w, r, &cr); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	req, status, code, msg := cr.parse(a.dp.Bounds)
	if status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	ndjson := wantsNDJSON(r)
	// The command's memory is charged from before it starts until both
	// it has ended and its answer is written or abandoned.
	release, err := a.dp.Budget.Acquire(pauseContext(r), s.Tenant, dataplane.CommandCost(req.MaxOutputBytes, ndjson))
	if err != nil {
		if !pausedAnswer(w, r) && r.Context().Err() == nil {
			WriteGatewayError(w, err) // the budget's errors say 429 or 503
		}
		return
	}
	var owners atomic.Int32 // the command and its answer
	owners.Store(2)
	done1 := func() {
		if owners.Add(-1) == 0 {
			release()
		}
	}
	defer done1()
	// The command runs on a context of its own, which ends with it: a
	// client that leaves kills it (cancel below, when the handler sees it
	// go), unless it runs in the background.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	req.Buffers = a.dp.Buffers
	// A pause by checkpoint hands a command under way to the background
	// processes (dataplane.HandedOffError): the pause's answer names it.
	var handedID atomic.Pointer[string]
	var sent atomic.Bool // the command was sent to its shell (req.Started, below)
	req.HandedOff = func(id string) { handedID.Store(&id) }
	pausedErr := func() *gateway.Error {
		if p := handedID.Load(); p != nil {
			e := *gateway.ErrPaused
			e.Message = "the session was paused during the call: the command goes on in the sandbox as background process " +
				*p + " (GET /v1/sessions/" + s.ID + "/processes/" + *p + "); call again to resume the session"
			return &e
		}
		if cr.Shell != "" && sent.Load() {
			// It goes on in its shell, at the resume (a freeze), or in
			// the bash the pause let go of (a checkpoint: its answer may
			// be dataplane.ErrShellLetGo's, the same). One not yet sent
			// to its shell may not run at all (a checkpoint ends a
			// command that waits for the one an earlier pause let go
			// of): the answer does not say it goes on.
			e := *gateway.ErrPaused
			e.Message = dataplane.ShellPausedMessage(cr.Shell)
			return &e
		}
		return gateway.ErrPaused
	}

	var stream *ndjsonWriter
	if ndjson {
		stream = &ndjsonWriter{w: w, rc: http.NewResponseController(w)}
		req.Stream = stream.output
		// The answer's headers go as soon as the command runs: a client
		// waiting for them (with its timeout) must not wait for the
		// command's first output, which a quiet command may never write.
		req.Started = stream.begin
	}
	begin := req.Started
	req.Started = func() {
		sent.Store(true)
		if begin != nil {
			begin()
		}
	}
	type outcome struct {
		res dataplane.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		defer done1()
		defer cancel() // released when the command ends, not the request
		var o outcome
		if cr.Shell != "" {
			o.res, o.err = a.dp.Shells.Run(ctx, s.ID, s, cr.Shell, req)
		} else {
			o.res, o.err = dataplane.Run(ctx, s, req)
		}
		var ho *dataplane.HandedOffError
		if o.err != nil && !errors.Is(o.err, context.Canceled) && !errors.Is(o.err, gateway.ErrPaused) && !errors.As(o.err, &ho) {
			a.cfg.Log.WarnContext(r.Context(), "command_failed", "session", s.ID, "shell", cr.Shell, "err", o.err)
		}
		done <- o
	}()
	// The client leaves (r's own Done: what derives from it may hear of
	// it only once the handler has returned), or a pause ends the call.
	o, why := awaitCommand(done, eitherDone(r.Context().Done(), pauseContext(r).Done()), a.cfg.Stopping)
	stopping := false
	switch why {
	case commandGone:
		// Gone: a foreground command is killed here, by the handler itself,
		// not by a context.AfterFunc on r.Context(): that may not have run
		// yet when its Done channel is seen closed (the context closes it
		// before it cancels what derives from it), and the handler's
		// return stopping it then left the command running. A background
		// command carries on alone, its end in the history.
		if gateway.PausedCause(pauseContext(r)) && r.Context().Err() == nil {
			// The session was paused under the call (dataSession): the
			// answer ends, saying why, but the command is left to go on
			// when the session resumes (a shell or a kernel keeps its
			// state), its end in the history, as a background one's. It
			// is not waited for: it cannot end while the session is
			// paused.
			answerPaused(w, stream, pausedErr())
			return
		}
		if !cr.Background {
			cancel()
		}
		if stream != nil {
			stream.stop()
		}
		return
	case commandStopped:
		// The gateway's drain is over and the command still runs: it is
		// ended (the gateway's end would end it), and answered with what
		// it wrote.
		a.cfg.Log.InfoContext(r.Context(), "command_ended_by_shutdown", "session", s.ID, "shell", cr.Shell)
		cancel()
		o, stopping = <-done, true
	}
	if stopping {
		noteErrorCode(w, "shutting_down")
		detail := errorDetail{Code: "shutting_down", Message: "the gateway is shutting down: the command was ended"}
		if stream != nil {
			stream.final(map[string]any{"error": detail})
			return
		}
		ans := shutdownAnswer{Error: detail}
		if o.err == nil {
			ans.commandResult = resultBody(o.res, false)
		}
		_ = writeAnswer(w, http.StatusServiceUnavailable, ans, o.res.Stdout, o.res.Stderr)
		o.res.Release()
		return
	}
	if errors.Is(o.err, dataplane.ErrShellLetGo) {
		// Let go of by a pause (its answer came before the pause ended
		// the call): answered as the pause's end answers it.
		answerPaused(w, stream, pausedErr())
		return
	}
	if ho := (*dataplane.HandedOffError)(nil); errors.As(o.err, &ho) {
		// Handed over by a pause (its answer came before the pause ended
		// the call): answered as the pause's end would answer it.
		answerPaused(w, stream, pausedErr())
		return
	}
	if o.err != nil {
		if stream != nil && stream.started() {
			stream.final(map[string]any{"error": errorDetail{Code: "internal", Message: "the command could not run"}})
			return
		}
		WriteGatewayError(w, dataplane.Failure(o.err, "the command could not be started"))
		return
	}
	if stream != nil {
		stream.final(resultBody(o.res, false))
		return
	}
	if a.cfg.ServerTiming && cr.Shell == "" {
		w.Header().Set("Server-Timing", commandTiming(o.res))
	}
	_ = writeAnswer(w, http.StatusOK, resultBody(o.res, false), o.res.Stdout, o.res.Stderr)
	o.res.Release() // written: the buffers serve the next command
}

// commandTiming renders a command's Server-Timing header (serve
// --server-timing): its start (until the sandbox said it runs), its run
// (from then until its end and its output's), and whether the shell ran
// it ("shell") or the sandbox exec'd its words as bash would have
// ("direct").
func commandTiming(res dataplane.Result) string {
	how := "shell"
	if res.Direct {
		how = "direct"
	}
	return fmt.Sprintf("start;dur=%.3f, run;dur=%.3f, exec;desc=%s",
		float64(res.StartTook.Microseconds())/1000, float64((res.Duration-res.StartTook).Microseconds())/1000, how)
}

// eitherDone is closed once a or b is (both close when the request ends).
func eitherDone(a, b <-chan struct{}) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		select {
		case <-a:
		case <-b:
		}
		close(ch)
	}()
	return ch
}

// Why awaitCommand returned.
const (
	commandEnded   = iota // the command ended: its outcome is given
	commandGone           // the client left
	commandStopped        // the gateway's drain ended first
)

// awaitCommand waits for a command's outcome on done, the client's leaving
// (gone) or the end of the gateway's drain (stop). A command that has
// already ended when the stop is seen is answered as ended, never as
// shut down: select alone picks at random among ready cases.
func awaitCommand[T any](done <-chan T, gone, stop <-chan struct{}) (T, int) {
	var v T
	select {
	case v = <-done:
		return v, commandEnded
	case <-gone:
		return v, commandGone
	case <-stop:
		select {
		case v = <-done:
			return v, commandEnded
		default:
			return v, commandStopped
		}
	}
}

// shutdownAnswer is a command's answer when the gateway's shutdown ended
// it: the error, and the command's result with the output it wrote.
type shutdownAnswer struct {
	Error errorDetail `json:"error"`
	commandResult
}

// resultBody renders r; withOutput false leaves the output out (it was
// streamed).
func resultBody(r dataplane.Result, withOutput bool) commandResult {
	out := commandResult{ExitCode: r.ExitCode, Truncated: r.Truncated(), TimedOut: r.TimedOut,
		DurationMs: r.Duration.Milliseconds(), Cwd: r.Cwd, StateLost: r.StateLost}
	if r.ExitSignal != "" {
		out.ExitSignal = &r.ExitSignal
	}
	if withOutput {
		out.Stdout, out.StdoutBase64 = outputFields(r.Stdout)
		out.Stderr, out.StderrBase64 = outputFields(r.Stderr)
	}
	return out
}

// outputFields renders o as a pair of JSON fields, for small outputs
// (python.go); a command's answer encodes them from their bytes
// (writeAnswer).
func outputFields(o dataplane.Output) (text, b64 *string) {
	if o.IsBase64 {
		s := base64.StdEncoding.EncodeToString(o.Bytes())
		return nil, &s
	}
	return &o.Text, nil
}

// wantsNDJSON reports whether the client asked for a stream.
func wantsNDJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == ndjsonType {
			return true
		}
	}
	return false
}

// ndjsonWriter streams a command's output as JSON lines, one object per
// chunk, flushed at once.
type ndjsonWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	mu      sync.Mutex
	bw      *bufio.Writer // once began
	began   bool
	stopped bool
}

func (n *ndjsonWriter) started() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.began
}

// stop makes later writes no-ops (the handler has returned).
func (n *ndjsonWriter) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = true
}

func (n *ndjsonWriter) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	n.line(func(bw *bufio.Writer) { bw.Write(b) })
}

// begin sends the stream's headers, and flushes them to the client, if
// they have not gone yet.
func (n *ndjsonWriter) begin() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped || n.began {
		return
	}
	n.start()
	_ = n.rc.Flush()
}

// start writes the headers (n.mu held).
func (n *ndjsonWriter) start() {
	n.began = true
	n.w.Header().Set("Content-Type", ndjsonType)
	n.w.Header().Set("Cache-Control", "no-store")
	n.w.Header().Set("X-Content-Type-Options", "nosniff")
	n.w.WriteHeader(http.StatusOK)
	n.bw = bufio.NewWriterSize(n.w, answerChunk)
}

// line writes one line, which enc writes into bw, and flushes it to the
// client.
func (n *ndjsonWriter) line(enc func(bw *bufio.Writer)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	if !n.began {
		n.start()
	}
	enc(n.bw)
	n.bw.WriteByte('\n')
	if err := n.bw.Flush(); err != nil {
		return
	}
	_ = n.rc.Flush()
}

// output sends one chunk of stream ("stdout" or "stderr"): its UTF-8
// text as text, and each run of bytes that are not as base64. The lines
// are encoded from data as they are written, with no copy.
func (n *ndjsonWriter) output(stream string, data []byte) {
	for len(data) > 0 {
		i := 0 // the length of the valid text at the start of data
		for i < len(data) {
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			i += size
		}
		if i > 0 {
			text := data[:i]
			n.line(func(bw *bufio.Writer) {
				bw.WriteString(`{"` + stream + `":`)
				writeJSONString(bw, text)
				bw.WriteByte('}')
			})
			data = data[i:]
			continue
		}
		j := 1 // the length of the invalid bytes at the start of data
		for j < len(data) {
			if r, size := utf8.DecodeRune(data[j:]); r != utf8.RuneError || size > 1 {
				break
			}
			j++
		}
		bin := data[:j]
		n.line(func(bw *bufio.Writer) {
			bw.WriteString(`{"` + stream + `Base64":"`)
			enc := base64.NewEncoder(base64.StdEncoding, bw)
			_, _ = enc.Write(bin)
			_ = enc.Close()
			bw.WriteString(`"}`)
		})
		data = data[j:]
	}
}

// final sends the last line and ends the stream.
func (n *ndjsonWriter) final(v any) {
	n.write(v)
	n.stop()
}

// listCommands serves GET /v1/sessions/{id}/commands: the session's
// history, most recent last.
func (a *api) listCommands(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	limit := gateway.MaxHistory
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > gateway.MaxHistory {
			WriteError(w, http.StatusBadRequest, "invalid_limit", fmt.Sprintf("limit must be an integer between 1 and %d", gateway.MaxHistory))
			return
		}
		limit = n
	}
	h := s.History()
	if len(h) > limit {
		h = h[len(h)-limit:]
	}
	if h == nil {
		h = []gateway.CommandRecord{}
	}
	_ = WriteJSON(w, http.StatusOK, map[string]any{"commands": h})
}

// deleteShell serves DELETE /v1/sessions/{id}/shells/{name}.
func (a *api) deleteShell(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	name := chi.URLParam(r, "name")
	if err := a.dp.Shells.Delete(s.ID, name); err != nil {
		WriteError(w, http.StatusNotFound, "shell_not_found", "the session has no shell of that name")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// answerPaused answers a command the session's pause ended or handed over
// with pe (session_paused): as a stream's last line when the stream has
// begun, else as the answer.
func answerPaused(w http.ResponseWriter, stream *ndjsonWriter, pe *gateway.Error) {
	if stream != nil && stream.started() {
		noteErrorCode(w, pe.Code)
		stream.final(map[string]any{"error": errorDetail{Code: pe.Code, Message: pe.Message}})
		return
	}
	if stream != nil {
		stream.stop()
	}
	WriteGatewayError(w, pe)
}
