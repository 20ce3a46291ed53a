package dataplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// TimeoutExitCode is a timed-out command's exit code, as timeout(1) gives.
const TimeoutExitCode = 124

// OutputGrace is how long output is still read after a command's first
// process has ended: what a background process keeps writing after that
// is not waited for (as over SSH).
const OutputGrace = 500 * time.Millisecond

// Session is what commands, shells and kernels need of a gateway
// session; *gateway.Session is one.
type Session interface {
	FileSession
	// Start starts a process as the session's (its environment), as the
	// options say: whether it resumes a stopped session, whether the
	// history lists it.
	Start(ctx context.Context, cmd sandbox.Cmd, o gateway.StartOptions) (sandbox.Process, error)
	// RecordCommand adds a command to the session's history.
	RecordCommand(ctx context.Context, r gateway.CommandRecord)
}

// FileSession is what file access needs of a session: its sandbox, to
// start the SFTP server in (as SSH starts one: a subsystem, never in the
// history), and its end.
type FileSession interface {
	// Sandbox is the session's sandbox (Session.Sandbox): its Start
	// resumes a stopped session; its optional interfaces are the
	// driver's (sandbox.As).
	Sandbox() sandbox.Sandbox
	// AddConn registers a function to call when the session ends.
	AddConn(closeFn func()) (remove func(), ok bool)
}

// startOwn are the options of a process whose commands the data plane
// records itself (RecordCommand): a REST command, which knows its timeout,
// and a shell's or a kernel's process, whose commands are recorded one by
// one.
var startOwn = gateway.StartOptions{Resume: true}

// Request is one command to run.
type Request struct {
	// Command is shell text; Argv, when set instead, is run without any
	// shell parsing.
	Command string
	Argv    []string
	// Stdin is the command's whole standard input (nil: empty).
	Stdin []byte
	// Env are variables for the command, already filtered.
	Env map[string]string
	// Cwd is where the command runs: relative to the workspace, or
	// absolute; "" is the sandbox's start directory (or, in a shell, the
	// shell's).
	Cwd string
	// Timeout bounds the command's run (queueing for a shell not counted).
	Timeout time.Duration
	// MaxOutputBytes bounds each stream's kept output.
	MaxOutputBytes int64
	// Buffers, when set, lends the buffers that keep the output; the
	// Result's Release gives them back.
	Buffers *BufferPool
	// Stream, when set, receives output as it arrives, never cutting a
	// UTF-8 character in two; calls may come from several goroutines,
	// in order for each stream. It gets at most MaxOutputBytes per stream.
	// What it gets is not kept too: the Result's Stdout and Stderr then
	// only say whether they were truncated.
	Stream func(stream string, data []byte)
	// NoDirect runs the command through the shell always: without it a
	// plain list of words (sandbox.DirectWords), or an Argv, may run
	// without the shell where the sandbox finds that bash would
	// exec it as it is (sandbox.DirectExec), which nothing but the
	// time taken tells apart.
	NoDirect bool
	// Started, when set, is called once, as soon as the command has
	// started (before any output), so that a streamed answer can begin.
	Started func()
	// HandedOff, when set, is called (by Run) with the background process
	// id a pause by checkpoint handed the command over as (see
	// ErrHandedOff): its caller's answer, which the pause ends, names it.
	HandedOff func(processID string)
}

// HandedOffError is Run's answer for a command that a pause by
// checkpoint handed to the session's background processes
// (gateway.HandoffEntry) as process ProcessID: it did not end, and runs
// on there (its output from then on, its exit); its answer ends with the
// call, as the pause ends it (session_paused).
type HandedOffError struct{ ProcessID string }

func (e *HandedOffError) Error() string {
	return "the command was handed over to the session's background processes as " + e.ProcessID
}

// handoffSession is a session whose commands under way a pause may hand
// over (gateway.Session).
type handoffSession interface {
	AddHandoff(e *gateway.HandoffEntry) (remove func(), ok bool)
}

// Result is how a command ended and what it wrote.
type Result struct {
	// ExitCode is nil when a signal ended the command (ExitSignal).
	ExitCode   *int
	ExitSignal string
	Stdout     Output
	Stderr     Output
	TimedOut   bool
	Duration   time.Duration
	// Cwd is the directory the command ran in (in a shell: the shell's
	// directory after it).
	Cwd string
	// StateLost (a shell's command) says that the command ran in a new
	// shell that replaced one that ended (a timeout, an exit, a gateway
	// restart that could not keep it): started from the saved state (the
	// directory, exported variables, functions, aliases), without the
	// plain variables and jobs of the one before.
	StateLost bool
	// Direct says that the command ran without the shell (see
	// Request.NoDirect), and StartTook is how long its start took (until
	// the sandbox said it runs).
	Direct    bool
	StartTook time.Duration
}

// Truncated reports whether either stream was cut.
func (r Result) Truncated() bool { return r.Stdout.Truncated || r.Stderr.Truncated }

// Release gives the buffers of r's output back to the request's Buffers
// (when it had one): r's Stdout and Stderr are invalid from then on, Text
// included. Without Release the buffers are garbage collected as usual.
func (r Result) Release() {
	for _, o := range []Output{r.Stdout, r.Stderr} {
		if o.c != nil {
			o.c.release()
		}
	}
}

// ErrInvalid marks an error in the request itself.
var ErrInvalid = errors.New("invalid command")

// text is the command as the history shows it.
func (req Request) text() string {
	if req.Argv != nil {
		return shellJoin(req.Argv, false)
	}
	return req.Command
}

// script is the shell text that runs req's command itself.
func (req Request) script(exec bool) string {
	if req.Argv != nil {
		return shellJoin(req.Argv, exec)
	}
	return req.Command
}

// shellJoin quotes argv into shell words, prefixed with exec when asked.
func shellJoin(argv []string, exec bool) string {
	var b strings.Builder
	if exec {
		b.WriteString("exec")
	}
	for i, a := range argv {
		if exec || i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Quote(a))
	}
	return b.String()
}

// Quote single-quotes s for a POSIX shell: no character inside is special.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// cdScript is the shell text that changes to cwd, relative paths being
// relative to the workspace ($HOME).
func cdScript(cwd string) string {
	if strings.HasPrefix(cwd, "/") {
		return "cd -- " + Quote(cwd)
	}
	return `cd -- "$HOME"/` + Quote(cwd)
}

// envList turns env into sorted KEY=VALUE pairs.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// newToken returns a random marker no command output holds by chance.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "__sandgate_" + hex.EncodeToString(b[:])
}

// Run runs req as a fresh process of s's sandbox, as an SSH exec does,
// and records it in the session's history when it ends. When ctx ends
// first the command is killed (the caller passes a context that does not
// end for a command that must outlive its client). On timeout, or when
// ctx ends, the command's whole process tree is killed; a command whose
// first process ended on its own has ended, and what it left running in
// the background was detached on purpose and stays (as over SSH).
func Run(ctx context.Context, s Session, req Request) (Result, error) {
	tok := newToken()
	// The first line of stderr is the token and the directory the command
	// runs in: nothing else has written there yet.
	var script strings.Builder
	if req.Cwd != "" {
		script.WriteString(cdScript(req.Cwd) + " || exit 1\n")
	}
	fmt.Fprintf(&script, "printf '%%s%%s\\n' %s \"$PWD\" >&2\n", tok)
	script.WriteString(req.script(true))
	cmd := sandbox.Cmd{Command: script.String(), Env: envList(req.Env)}
	switch {
	case req.NoDirect:
	case req.Argv != nil:
		if sandbox.DirectArgvOK(req.Argv) {
			cmd.Direct, cmd.DirectArgv = req.Argv, true
		}
	default:
		if words, ok := sandbox.DirectWords(req.Command); ok {
			// The sandbox may run it without the shell, as bash would.
			cmd.Direct = words
		} else if words, ok := sandbox.DirectBuiltinWords(req.Command); ok {
			// The sandbox may answer for it, as bash would end.
			cmd.Builtin = words
		}
	}
	if cmd.Direct != nil || cmd.Builtin != nil {
		cmd.DirectCwd = req.Cwd // the script's cd (cdScript)
	}
	began := time.Now()
	proc, err := s.Start(context.WithoutCancel(ctx), cmd, startOwn)
	if err != nil {
		return Result{}, fmt.Errorf("start command: %w", err)
	}
	startTook := time.Since(began)
	tokPrefix := []byte(tok)
	dpwd, direct := "", false
	if dp, ok := proc.(sandbox.DirectProcess); ok {
		dpwd, direct = dp.DirectPWD()
	}
	if direct {
		tokPrefix = nil // no shell wrote the token line: the sandbox said where it runs
	}
	if req.Started != nil {
		req.Started()
	}
	// A pause by checkpoint hands the command to the background
	// processes rather than hold the session (a freeze) on it.
	var handedID string
	handed := make(chan struct{})
	if hs, ok := s.(handoffSession); ok {
		e := &gateway.HandoffEntry{Command: req.text(), Source: "rest", StartedAt: began, Process: proc,
			Deadline: began.Add(req.Timeout), Begin: func() {},
			Done: func(id string) {
				if id == "" {
					return // not handed over: it runs on here (a next pause may try again)
				}
				handedID = id
				close(handed) // at most once: Done has an id at most once
				if req.HandedOff != nil {
					req.HandedOff(id)
				}
			}}
		if remove, ok := hs.AddHandoff(e); ok {
			defer remove()
		}
	}
	go func() {
		if len(req.Stdin) > 0 {
			_, _ = proc.Stdin().Write(req.Stdin)
		}
		_ = proc.Stdin().Close()
	}()

	stdout := newStreamReader("stdout", req, nil)
	stderr := newStreamReader("stderr", req, tokPrefix)
	outs := []*procio.Output{procio.NewOutput(proc.Stdout()), procio.NewOutput(proc.Stderr())}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); stdout.copyFrom(outs[0]) }()
	go func() { defer readers.Done(); stderr.copyFrom(outs[1]) }()

	type waited struct {
		exit sandbox.Exit
		err  error
	}
	done := make(chan waited, 1)
	go func() {
		exit, err := proc.Wait()
		done <- waited{exit, err}
	}()
	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	var w waited
	timedOut := false
	select {
	case w = <-done:
	case <-timer.C:
		timedOut = true
		proc.Kill()
		w = <-done
	case <-ctx.Done():
		proc.Kill()
		w = <-done
	}
	drain(&readers, outs...)
	if errors.Is(w.err, sandbox.ErrHandedOff) {
		select {
		case <-handed: // handedID is set
			return Result{}, &HandedOffError{ProcessID: handedID}
		case <-time.After(10 * time.Second):
			return Result{}, &HandedOffError{}
		}
	}

	res := Result{TimedOut: timedOut, Duration: time.Since(began), Cwd: stderr.prefix}
	res.StartTook, res.Direct = startTook, direct
	if direct {
		res.Cwd = dpwd
	}
	res.Stdout, res.Stderr = stdout.cap.output(), stderr.cap.output()
	rec := gateway.CommandRecord{Command: req.text(), Source: "rest", StartedAt: began.UTC(),
		DurationMs: res.Duration.Milliseconds(), TimedOut: timedOut, BytesOut: stdout.cap.total + stderr.cap.total}
	switch {
	case timedOut:
		code := TimeoutExitCode
		res.ExitCode = &code
	case w.err != nil:
		code := 255
		res.ExitCode = &code
	case w.exit.Signal != "":
		res.ExitSignal = w.exit.Signal
	default:
		code := w.exit.Code
		res.ExitCode = &code
	}
	rec.ExitCode, rec.ExitSignal = res.ExitCode, res.ExitSignal
	s.RecordCommand(ctx, rec)
	return res, nil
}

// drain waits for the readers of a command's output to reach the end
// of their streams, or for what procio.Drain grants them after the
// command ended (OutputGrace), and closes the streams.
func drain(readers *sync.WaitGroup, outs ...*procio.Output) {
	ended := make(chan struct{})
	go func() {
		readers.Wait()
		close(ended)
	}()
	procio.Drain(ended, OutputGrace, outs...)
}

// streamReader copies one stream of a command into its capture and its
// client, taking a first line that starts with prefixTok (the token, then
// a value) out of it first.
type streamReader struct {
	name      string
	cap       *capture
	send      func(stream string, data []byte)
	sent      int64
	limit     int64
	chunk     runeChunker
	prefixTok []byte
	prefix    string // the value after the token, once read
}

// newStreamReader returns the reader of stream name. Output sent as it
// arrives (req.Stream) is not kept as well: only counted.
func newStreamReader(name string, req Request, prefixTok []byte) *streamReader {
	c := newCapture(req.MaxOutputBytes)
	if req.Stream != nil {
		c = newCounter(req.MaxOutputBytes)
	}
	c.pool = req.Buffers
	return &streamReader{name: name, cap: c, send: req.Stream,
		limit: req.MaxOutputBytes, prefixTok: prefixTok}
}

func (r *streamReader) copyFrom(src io.Reader) {
	// Lent by the request's pool (the capture's): a fresh 32 KiB per
	// stream per command was a large allocation, zeroed page by page.
	buf := r.cap.pool.get(readBufSize)[:readBufSize]
	defer r.cap.pool.put(buf)
	var pending []byte // the start of the stream, while the prefix line is looked for
	looking := r.prefixTok != nil
	for {
		n, err := src.Read(buf)
		p := buf[:n]
		if looking && n > 0 {
			pending = append(pending, p...)
			p, pending, looking = r.takePrefix(pending)
		}
		if len(p) > 0 {
			r.write(p)
		}
		if err != nil {
			if len(pending) > 0 {
				r.write(pending)
			}
			r.flush()
			return
		}
	}
}

// readBufSize is the size of the buffer a stream is read with.
const readBufSize = 32 << 10

// maxBeforePrefix bounds what a stream may hold before its prefix line
// while that line is looked for.
const maxBeforePrefix = 64 << 10

// takePrefix looks for the prefix line in pending, the start of the
// stream: it returns what may be written now, what must wait for more,
// and whether the line is still looked for. Whole lines before it are
// the shell's own (a startup warning such as bash's about a locale it
// cannot set: nothing of the command's comes before the line) and pass
// through.
func (r *streamReader) takePrefix(pending []byte) (out, rest []byte, looking bool) {
	for {
		i := bytes.IndexByte(pending, '\n')
		switch {
		case bytes.HasPrefix(pending, r.prefixTok):
			if i < 0 {
				return out, pending, true
			}
			r.prefix = string(pending[len(r.prefixTok):i])
			return append(out, pending[i+1:]...), nil, false
		case len(pending) < len(r.prefixTok) && bytes.HasPrefix(r.prefixTok, pending):
			return out, pending, true // not enough yet
		case i < 0 && len(pending) < maxBeforePrefix:
			return out, pending, true
		case i < 0:
			return append(out, pending...), nil, false
		}
		out, pending = append(out, pending[:i+1]...), pending[i+1:]
	}
}

// write takes p into the capture and sends it to the client.
func (r *streamReader) write(p []byte) {
	r.cap.Write(p)
	if r.send == nil {
		return
	}
	if room := r.limit - r.sent; int64(len(p)) > room {
		p = p[:max(room, 0)]
	}
	r.sent += int64(len(p))
	if c := r.chunk.next(p); len(c) > 0 {
		r.send(r.name, c)
	}
}

func (r *streamReader) flush() {
	if r.send == nil {
		return
	}
	if c := r.chunk.flush(); len(c) > 0 {
		r.send(r.name, c)
	}
}

// runeChunker cuts a stream into chunks that never split a UTF-8
// character: an incomplete character at the end of a chunk is held back
// for the next.
type runeChunker struct {
	carry []byte
}

// next returns what of p (after what was held back) can be sent now.
func (r *runeChunker) next(p []byte) []byte {
	b := p // no copy unless something was held back
	if len(r.carry) > 0 {
		b = append(r.carry, p...)
	}
	r.carry = nil
	cut := trimCutEnd(b)
	if len(cut) < len(b) && validPrefix(b[len(cut):]) {
		r.carry = append([]byte(nil), b[len(cut):]...)
		return cut
	}
	return b
}

// flush returns what is held back, at the stream's end.
func (r *runeChunker) flush() []byte {
	b := r.carry
	r.carry = nil
	return b
}

// validPrefix reports whether b could start a valid UTF-8 character.
func validPrefix(b []byte) bool {
	if len(b) == 0 || len(b) >= utf8.UTFMax {
		return false
	}
	// Complete b with continuation bytes: valid if some completion is.
	for _, c := range []byte{0x80, 0x90, 0xA0, 0xBF} {
		full := append(append([]byte(nil), b...), c, c, c)
		if r, n := utf8.DecodeRune(full); r != utf8.RuneError || n > 1 {
			return true
		}
	}
	return false
}
