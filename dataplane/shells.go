package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// Shell limits.
const (
	// MaxShells caps a session's persistent shells.
	MaxShells = 16
	// MaxShellQueue caps the requests waiting for one shell.
	MaxShellQueue = 32
)

// Shell errors.
var (
	ErrTooManyShells error = newClientError("too many shells in this session", gateway.KindQuota, "too_many_shells",
		fmt.Sprintf("a session may have at most %d shells; delete one", MaxShells))
	ErrShellBusy error = newClientError("too many commands wait for this shell", gateway.KindQuota, "shell_busy",
		fmt.Sprintf("%d commands already wait for this shell", MaxShellQueue))
	ErrNoShell           = errors.New("no such shell")
	ErrShellClosed error = newClientError("the shell was closed", gateway.KindConflict, "shell_closed",
		"the shell was deleted while the command waited for it")
	// ErrSessionEnded: the session ended (shells and processes alike).
	ErrSessionEnded error = newClientError("the session has ended", gateway.KindConflict, "session_not_running", sessionNotRunning)
)

var shellNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// ValidShellName reports whether name may name a shell.
func ValidShellName(name string) bool { return shellNameRE.MatchString(name) }

// Shells holds every session's persistent named shells. Its zero value is
// ready to use.
//
// With StateDir, a shell outlives the gateway: a file
// <StateDir>/<session>/shell-<name> names its saved state in the sandbox
// and, where the sandbox keeps processes (sandbox.Keeper), its bash,
// which the next gateway takes back with everything (plain variables and
// jobs too). A shell that cannot be taken back is started again from its
// saved state, as after a timeout, and its first answer says stateLost.
type Shells struct {
	// StateDir is where shells are recorded ("": nowhere; a restart
	// forgets them).
	StateDir string

	reg registry[*shell]
}

// Run runs req in the session's shell name, starting the shell if it has
// none of that name yet. Commands of one shell run one at a time, in the
// order they came; a request waits at most until ctx ends.
func (sh *Shells) Run(ctx context.Context, id string, s Session, name string, req Request) (Result, error) {
	x, err := sh.get(id, s, name)
	if err != nil {
		return Result{}, err
	}
	return x.run(ctx, req)
}

// Restore registers the shells an earlier gateway recorded for session
// id (s), so that a delete reaches them before any command does; each is
// taken back at its first command.
func (sh *Shells) Restore(id string, s Session) {
	for _, name := range recorded(sh.StateDir, id, "shell-") {
		if ValidShellName(name) {
			_, _ = sh.get(id, s, name)
		}
	}
}

// Fork gives session dst (s), a fork of session src, the shells src has
// recorded: dst's sandbox holds copies of src's bash processes, kept under
// the same keys, and their saved state; each is taken back at its first
// command, its cd, exports and variables included.
func (sh *Shells) Fork(src, dst string, s Session) {
	for _, name := range forkRecords(sh.StateDir, src, dst, "shell-") {
		if ValidShellName(name) {
			_, _ = sh.get(dst, s, name)
		}
	}
}

// Delete ends the session's shell name, killing a command it runs.
func (sh *Shells) Delete(id, name string) error {
	x, ok := sh.reg.take(id, name)
	if !ok {
		return ErrNoShell
	}
	x.close()
	return nil
}

// get returns the session's shell name, making it if needed.
func (sh *Shells) get(id string, s Session, name string) (*shell, error) {
	return sh.reg.get(id, s, name, MaxShells, ErrTooManyShells, func() *shell {
		x := &shell{name: name, s: s, turn: make(chan struct{}, 1), closed: make(chan struct{}),
			state: shellStatePrefix + newToken()[len("__sandgate_"):]}
		if sh.StateDir != "" && sandbox.ValidID(id) {
			x.dir = filepath.Join(sh.StateDir, id)
			x.record = filepath.Join(x.dir, "shell-"+name)
			x.loadRecord()
		}
		if oc, ok := s.(checkpointNotifier); ok {
			x.offCheckpoint = oc.OnCheckpoint(x.letGo)
		}
		return x
	})
}

func (x *shell) setUnregister(remove func()) { x.unregister = remove }

// letGo lets go of the shell's bash before a checkpoint (kernel.letGo):
// the next command takes it back by its key, with its cd and exports. A
// command under way lets go of it itself (run: its answer is
// ErrShellLetGo, and it goes on in the bash; the next command's sync
// reads away the rest of its output).
func (x *shell) letGo() bool {
	return letGoTurn(x.turn, &x.mu, &x.call, func() bool {
		if x.proc == nil {
			return true
		}
		r, key := x.releaser()
		if r == nil {
			return false
		}
		r.Release()
		x.forget(key)
		return true
	})
}

// releaser returns the shell's bash as a Releaser and the key it is kept
// under; nil when it is not kept.
func (x *shell) releaser() (sandbox.Releaser, string) {
	r, ok := x.proc.(sandbox.Releaser)
	if !ok || x.record == "" {
		return nil, ""
	}
	b, err := os.ReadFile(x.record)
	var rec shellRecord
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.Keep == "" {
		return nil, ""
	}
	return r, rec.Keep
}

// forget forgets the bash let go of, kept under key, for the next
// command to take back; the turn is held.
func (x *shell) forget(key string) {
	x.proc, x.out, x.err, x.syncing = nil, nil, nil, nil
	x.started, x.keep, x.resumed = false, key, true
}

// sessionEnded ends the shell with its session.
func (x *shell) sessionEnded() {
	x.close()
	if x.dir != "" {
		_ = os.Remove(x.dir) // when the session left nothing else there
	}
}

// shell is one persistent shell: a long-lived bash (or sh) that reads
// commands on its stdin. After each command it saves its state (exported
// variables, functions, aliases, directory) to a file in the sandbox's
// /tmp, so that a shell killed with a command that timed out is replaced
// by one that starts from that state.
type shell struct {
	name       string
	s          Session
	state      string        // the state file, inside the sandbox
	turn       chan struct{} // held by the running command
	closed     chan struct{}
	closeOnce  sync.Once
	unregister func()
	// offCheckpoint unregisters letGo from the session.
	offCheckpoint func()

	mu      sync.Mutex // guards waiting and call
	waiting int
	// call is the command under way, which a pause by checkpoint asks to
	// let go of the bash (letGo).
	call *callLetGo

	// record is the file that names the shell across gateway restarts,
	// in dir ("": none).
	dir, record string

	// Owned by the command holding turn.
	proc     sandbox.Process
	out, err *markerReader
	cwd      string
	started  bool
	// keep is the key of the bash an earlier gateway left, to take back
	// before the first command ("" once looked at); resumed says the
	// record was there; stale that the bash was taken back and may still
	// be busy with a command of that gateway.
	keep    string
	resumed bool
	stale   bool
	// syncing is a sync's end, when its call left before it (sync).
	syncing chan bool
	// letGoCmd says that a pause let go of the bash while a command ran
	// (its call answered ErrShellLetGo): the next command waits for it.
	letGoCmd bool
	// lost says that the shell's bash ended under it (a timeout, an exit,
	// a restart that could not keep it): the next one, started from the
	// saved state, says stateLost.
	lost bool
}

// shellStatePrefix starts the path of every shell's saved state.
const shellStatePrefix = "/tmp/.sandgate-shell-"

// shellRecord is what a shell's record file holds.
type shellRecord struct {
	// Tenant is the session's, so that the next gateway can find it.
	Tenant string `json:"tenant,omitempty"`
	// State is the saved state's path in the sandbox.
	State string `json:"state"`
	// Keep is the key the sandbox keeps the bash under ("": it does not).
	Keep string `json:"keep,omitempty"`
}

// loadRecord takes what an earlier gateway recorded of the shell: where
// its state is saved, and its bash's key.
func (x *shell) loadRecord() {
	b, err := os.ReadFile(x.record)
	if err != nil {
		return
	}
	var rec shellRecord
	if json.Unmarshal(b, &rec) != nil {
		return
	}
	if tail, ok := strings.CutPrefix(rec.State, shellStatePrefix); ok && shellNameRE.MatchString(tail) {
		x.state = rec.State
	}
	x.keep, x.resumed = rec.Keep, true
}

// saveRecord records the shell's state path and its bash's key.
func (x *shell) saveRecord(key string) {
	if x.record == "" {
		return
	}
	if err := os.MkdirAll(x.dir, 0o700); err == nil {
		_ = writeJSONFile(x.record, shellRecord{Tenant: tenantOf(x.s), State: x.state, Keep: key})
	}
}

// resume takes back the bash an earlier gateway (or a pause by
// checkpoint) left, before the first command: it reports false when
// there was one that could not be taken back (it ended with that
// gateway). A sandbox paused again meanwhile (sandbox.ErrPaused) keeps
// it where it is, to be taken back by the next call: resume then answers
// gateway.ErrPaused, the state not lost.
func (x *shell) resume(ctx context.Context) (bool, error) {
	key := x.keep
	x.keep = ""
	if key == "" {
		return false, nil
	}
	k, ok := sandbox.As[sandbox.Keeper](x.s.Sandbox())
	if !ok {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := k.Reattach(rctx, key)
	if errors.Is(err, sandbox.ErrPaused) {
		x.keep = key
		return false, gateway.ErrPaused
	}
	if err != nil {
		return false, nil
	}
	x.proc, x.out, x.err = p, newMarkerReader(p.Stdout()), newMarkerReader(p.Stderr())
	x.started, x.stale = true, true
	return true, nil
}

// sync reads away what a taken-back bash still had to say for a command
// of the earlier gateway (or of the command a pause let go of it under):
// a marker, and everything up to it. It ends syncWaiting when that does
// not come within timeout (0: none; the command still runs) or before
// ctx ends (its readers go on: the next sync waits for them, x.syncing),
// syncClosed when the shell is being deleted, syncGone when the bash
// ended, and syncAsked (with the reply channel) when a pause asks the
// call to let go (ask).
func (x *shell) sync(ctx context.Context, timeout time.Duration, ask <-chan chan bool) (syncEnd, chan bool) {
	if x.syncing == nil {
		tok := newToken()
		if _, err := fmt.Fprintf(x.proc.Stdin(), "__sandgate_done %s 0 %s\n", tok, Quote(x.state)); err != nil {
			return syncGone, nil
		}
		discard := Request{MaxOutputBytes: 1}
		ended := make(chan bool, 2)
		for _, m := range []*markerReader{x.out, x.err} {
			go func() {
				_, ok := m.until(tok, newStreamReader("discard", discard, nil))
				ended <- ok
			}()
		}
		synced := make(chan bool, 1)
		go func() { a, b := <-ended, <-ended; synced <- a && b }()
		x.syncing = synced
	}
	var expired <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case ok := <-x.syncing:
		x.syncing = nil
		if !ok {
			return syncGone, nil
		}
		x.stale = false
		return syncDone, nil
	case <-expired:
		return syncWaiting, nil
	case <-ctx.Done():
		return syncWaiting, nil
	case <-x.closed:
		return syncClosed, nil
	case reply := <-ask:
		return syncAsked, reply
	}
}

// syncTakenBack reads away what bash x.proc, taken back, still had to
// say for an earlier command (sync), as kernel.syncTakenBack does: a
// command that a pause let go of under its call in this gateway
// (letGoCmd) is waited for until it ends or this call's context does;
// one of an earlier gateway is given timeout, then the bash is killed
// (the next one starts from the saved state, x.lost).
func (x *shell) syncTakenBack(ctx context.Context, timeout time.Duration) error {
	call, leave := enterCall(&x.mu, &x.call)
	defer leave()
	if x.letGoCmd {
		timeout = 0
	}
	for {
		end, reply := x.sync(ctx, timeout, call.ask)
		switch {
		case end == syncDone:
			x.letGoCmd = false
			return nil
		case end == syncClosed:
			return ErrShellClosed // close kills the bash
		case end == syncAsked:
			r, key := x.releaser()
			if r == nil {
				reply <- false
				continue
			}
			r.Release() // the pending sync's readers end
			select {
			case <-x.syncing:
			case <-time.After(OutputGrace):
			}
			x.syncing = nil
			x.forget(key)
			reply <- true
			return shellWaitPaused(x.name) // this command was not sent
		case end == syncWaiting && x.letGoCmd:
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		x.stop()
		x.lost, x.letGoCmd = true, false
		return nil
	}
}

func (x *shell) close() {
	x.closeOnce.Do(func() {
		close(x.closed)
		if x.unregister != nil {
			x.unregister()
		}
		if x.offCheckpoint != nil {
			x.offCheckpoint()
		}
		// Wait for the running command to see closed and kill the shell.
		x.turn <- struct{}{}
		if x.keep != "" {
			// An earlier gateway's bash, not taken back yet: to end it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = x.resume(ctx)
			cancel()
		}
		if x.proc != nil {
			x.stop()
		}
		if x.record != "" {
			_ = os.Remove(x.record)
		}
		if !x.started && !x.resumed {
			return
		}
		// Remove the state files; the sandbox may be going away.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q := Quote(x.state)
		rm := fmt.Sprintf("rm -f -- %[1]s %[1]s.new %[1]s.cwd %[1]s.in %[1]s.cmd", q)
		// Not in a stopped session: its /tmp went with its processes.
		if p, err := x.s.Start(ctx, sandbox.Cmd{Command: rm}, gateway.StartOptions{}); err == nil {
			_ = p.Stdin().Close()
			var readers sync.WaitGroup
			outs := []*procio.Output{procio.NewOutput(p.Stdout()), procio.NewOutput(p.Stderr())}
			readers.Go(func() { _, _ = io.Copy(io.Discard, outs[0]) })
			readers.Go(func() { _, _ = io.Copy(io.Discard, outs[1]) })
			_, _ = p.Wait()
			drain(&readers, outs...) // and closes them
		}
	})
}

// stop kills the shell's process tree and forgets it.
func (x *shell) stop() {
	x.proc.Kill()
	_ = x.proc.Stdin().Close()
	_, _ = x.proc.Wait()
	sandbox.Ack(x.proc)
	_ = x.proc.Stdout().Close()
	_ = x.proc.Stderr().Close()
	x.proc, x.out, x.err, x.syncing = nil, nil, nil, nil
}

// acquire waits for the shell's turn.
func (x *shell) acquire(ctx context.Context) error {
	x.mu.Lock()
	if x.waiting >= MaxShellQueue {
		x.mu.Unlock()
		return ErrShellBusy
	}
	x.waiting++
	x.mu.Unlock()
	defer func() {
		x.mu.Lock()
		x.waiting--
		x.mu.Unlock()
	}()
	select {
	case x.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-x.closed:
		return ErrShellClosed
	}
	select {
	case <-x.closed:
		<-x.turn
		return ErrShellClosed
	default:
		return nil
	}
}

// shellInit is what a new shell runs first: settings, the function that
// ends each command (the exit status and directory on stdout between
// markers, a marker on stderr, the state saved), then the saved state.
const shellInit = `
if [ -n "$BASH_VERSION" ]; then
  shopt -s expand_aliases
  __sandgate_save() { { builtin declare -px; builtin declare -f; builtin alias -p; } >| "$1.new" 2>/dev/null && command mv -f -- "$1.new" "$1"; command printf '%s\n' "$PWD" >| "$1.cwd"; }
else
  __sandgate_save() { { command export -p; command alias; } >| "$1.new" 2>/dev/null && command mv -f -- "$1.new" "$1"; command printf '%s\n' "$PWD" >| "$1.cwd"; }
fi
__sandgate_done() {
  __sandgate_save "$3"
  command printf '%s:%s:%s:%s\n' "$1" "$2" "$PWD" "$1"
  command printf '%s::%s\n' "$1" "$1" >&2
}
umask 077
`

// shellRestore is what a new shell runs after shellInit: the state its
// predecessor saved, if any (%[1]s is the state file), but for the
// driver's tag of the shell's own tree (%[2]s, sandbox.CommandTagEnv),
// which stays the new shell's: with its predecessor's, the commands it
// runs would end with the predecessor's late kill (a timeout's).
const shellRestore = `__sandgate_t=${%[2]s-}
[ -f %[1]s ] && . %[1]s >/dev/null 2>&1
[ -n "$__sandgate_t" ] && export %[2]s="$__sandgate_t"
[ -f %[1]s.cwd ] && IFS= command read -r __sandgate_d < %[1]s.cwd && command cd -- "$__sandgate_d" 2>/dev/null
unset __sandgate_d __sandgate_t
`

// start starts the shell, from the saved state if there is one; a
// sandbox that keeps processes keeps it across gateway restarts.
func (x *shell) start() error {
	cmd := sandbox.Cmd{Command: "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc; fi; exec sh"}
	if k, ok := sandbox.As[sandbox.Keeper](x.s.Sandbox()); ok && k.Keeps() && x.record != "" {
		cmd.Keep = "shell/" + newToken()[len("__sandgate_"):]
	}
	p, err := x.s.Start(context.Background(), cmd, startOwn)
	if err != nil {
		return fmt.Errorf("start shell: %w", err)
	}
	x.saveRecord(cmd.Keep)
	x.proc, x.out, x.err = p, newMarkerReader(p.Stdout()), newMarkerReader(p.Stderr())
	x.started = true
	init := shellInit + fmt.Sprintf(shellRestore, Quote(x.state), sandbox.CommandTagEnv)
	if _, err := io.WriteString(p.Stdin(), init); err != nil {
		x.stop()
		return fmt.Errorf("start shell: %w", err)
	}
	return nil
}

// run runs req in the shell once it is req's turn.
func (x *shell) run(ctx context.Context, req Request) (Result, error) {
	if err := x.acquire(ctx); err != nil {
		return Result{}, err
	}
	defer func() { <-x.turn }()
	if x.resumed && x.keep != "" || x.resumed && !x.started {
		back, err := x.resume(ctx) // a shell of an earlier gateway
		if err != nil {
			return Result{}, err
		}
		x.lost = !back
	}
	if x.proc == nil {
		x.letGoCmd = false // not taken back: nothing to wait for
	}
	if x.proc != nil && x.stale {
		if err := x.syncTakenBack(ctx, req.Timeout); err != nil {
			return Result{}, err
		}
	}
	if x.proc == nil {
		if err := x.start(); err != nil {
			return Result{}, err
		}
	}
	stateLost := x.lost
	x.lost = false
	tok := newToken()
	var line strings.Builder
	if len(req.Stdin) > 0 {
		fmt.Fprintf(&line, "command printf %s >| %s.in\n", Quote(printfEscape(req.Stdin)), Quote(x.state))
	}
	// The script is sourced from a file, not eval'd: bash's parser,
	// after an eval whose text ends inside a quote, misreads the next
	// command it is sent ("{: command not found").
	fmt.Fprintf(&line, "command printf %s >| %s.cmd\n", Quote(printfEscape([]byte(req.script(false)))), Quote(x.state))
	line.WriteString("{ ")
	if req.Cwd != "" {
		line.WriteString(cdScript(req.Cwd) + " && ")
	}
	for _, kv := range envList(req.Env) {
		k, v, _ := strings.Cut(kv, "=")
		line.WriteString(k + "=" + Quote(v) + " ")
	}
	line.WriteString(". " + Quote(x.state+".cmd") + "\n} < ")
	if len(req.Stdin) > 0 {
		line.WriteString(Quote(x.state + ".in"))
	} else {
		line.WriteString("/dev/null")
	}
	fmt.Fprintf(&line, "; __sandgate_done %s \"$?\" %s\n", tok, Quote(x.state))
	if len(req.Stdin) > 0 {
		fmt.Fprintf(&line, "command rm -f -- %s.in\n", Quote(x.state))
	}

	began := time.Now()
	if _, err := io.WriteString(x.proc.Stdin(), line.String()); err != nil {
		// The shell is gone (exit): start another and try once more.
		x.stop()
		stateLost = true
		if err := x.start(); err != nil {
			return Result{}, err
		}
		began = time.Now()
		if _, err := io.WriteString(x.proc.Stdin(), line.String()); err != nil {
			x.stop()
			return Result{}, fmt.Errorf("write to shell: %w", err)
		}
	}
	if req.Started != nil {
		req.Started()
	}
	stdout := newStreamReader("stdout", req, nil)
	stderr := newStreamReader("stderr", req, nil)
	var status string
	var readers sync.WaitGroup
	readers.Add(2)
	// Read here, not in the readers: a pause's let-go (below) forgets
	// them (x.out = nil) after OutputGrace even if a reader has not run
	// yet.
	outR, errR := x.out, x.err
	go func() {
		defer readers.Done()
		status, _ = outR.until(tok, stdout)
		stdout.flush()
	}()
	go func() {
		defer readers.Done()
		_, _ = errR.until(tok, stderr)
		stderr.flush()
	}()
	ended := make(chan struct{})
	go func() {
		readers.Wait()
		close(ended)
	}()
	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	timedOut, killed := false, false
	call, leave := enterCall(&x.mu, &x.call)
	defer leave()
wait:
	for {
		select {
		case <-ended:
		case <-timer.C:
			timedOut = true
		case <-ctx.Done():
			killed = true
		case <-x.closed:
			killed = true
		case reply := <-call.ask:
			// A pause by checkpoint: the bash is let go of, the command
			// running on in it; the next command takes it back, and its
			// sync reads away the rest of this one's output.
			r, key := x.releaser()
			if r == nil {
				reply <- false
				continue
			}
			r.Release() // its streams close: the readers end
			select {
			case <-ended:
			case <-time.After(OutputGrace):
			}
			x.forget(key)
			x.letGoCmd = true
			reply <- true
			return Result{}, shellLetGo(x.name)
		}
		break wait
	}
	res := Result{TimedOut: timedOut}
	var exit sandbox.Exit
	var waitErr error
	if timedOut || killed {
		// Kill the shell's whole tree; the next command starts a new
		// shell from the state saved after the last one.
		p := x.proc
		p.Kill()
		_ = p.Stdin().Close()
		exit, waitErr = p.Wait()
		sandbox.Ack(p)
		drain(&readers, x.out.src, x.err.src)
		x.proc, x.out, x.err = nil, nil, nil
		x.lost = true
	}
	res.Duration = time.Since(began)
	code, cwd, ok := parseStatus(status)
	switch {
	case timedOut:
		c := TimeoutExitCode
		res.ExitCode = &c
	case ok:
		res.ExitCode = &code
		x.cwd = cwd
	default:
		// The shell ended (exit, or killed): its status is the command's.
		if !killed {
			p := x.proc
			_ = p.Stdin().Close()
			exit, waitErr = p.Wait()
			sandbox.Ack(p)
			_ = p.Stdout().Close()
			_ = p.Stderr().Close()
			x.proc, x.out, x.err = nil, nil, nil
			x.lost = true
		}
		if waitErr != nil {
			c := 255
			res.ExitCode = &c
		} else if exit.Signal != "" {
			res.ExitSignal = exit.Signal
		} else {
			c := exit.Code
			res.ExitCode = &c
		}
	}
	res.Cwd = x.cwd
	res.StateLost = stateLost
	res.Stdout, res.Stderr = stdout.cap.output(), stderr.cap.output()
	x.s.RecordCommand(ctx, gateway.CommandRecord{Command: req.text(), Source: "rest", Shell: x.name,
		StartedAt: began.UTC(), DurationMs: res.Duration.Milliseconds(), ExitCode: res.ExitCode,
		ExitSignal: res.ExitSignal, TimedOut: timedOut, BytesOut: stdout.cap.total + stderr.cap.total})
	return res, nil
}

// parseStatus reads "exit-status:directory" as the shell printed it.
func parseStatus(s string) (code int, cwd string, ok bool) {
	c, d, found := strings.Cut(s, ":")
	if !found {
		return 0, "", false
	}
	n, err := strconv.Atoi(c)
	if err != nil {
		return 0, "", false
	}
	return n, d, true
}

// printfEscape writes b as a printf(1) format that prints b exactly.
func printfEscape(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		switch {
		case c == '%':
			sb.WriteString("%%")
		case c == '\\':
			sb.WriteString(`\\`)
		case c >= 0x20 && c < 0x7f:
			sb.WriteByte(c)
		default:
			fmt.Fprintf(&sb, `\%03o`, c)
		}
	}
	return sb.String()
}

// markerReader reads a shell's stream across its commands.
type markerReader struct {
	src  *procio.Output
	left []byte // read past the last command's end marker
}

func newMarkerReader(r io.ReadCloser) *markerReader {
	return &markerReader{src: procio.NewOutput(r)}
}

// maxMarkerStatus bounds what a shell's end marker holds between its
// start and its end (the exit status and the directory): a start with no
// end within it is output (the command wrote it; it can learn the
// token), not held back without bound.
const maxMarkerStatus = 64 << 10

// until copies the stream into w until tok + ":" ... ":" + tok + "\n",
// returning what is between (at most maxMarkerStatus bytes). It holds
// back what may be the start of the marker until it knows. At the end of
// the stream it returns ok=false.
func (m *markerReader) until(tok string, w *streamReader) (string, bool) {
	start := []byte(tok + ":")
	end := []byte(":" + tok + "\n")
	buf := m.left
	m.left = nil
	chunk := make([]byte, 32<<10)
	// from: when buf begins with a start, no end begins in
	// buf[len(start):from] (searched already: each byte is searched once).
	from := 0
	skip := 0 // buf[:skip] holds no marker's start (a start found not one)
	for {
		i := bytes.Index(buf[skip:], start)
		if i >= 0 {
			i += skip
		}
		skip = 0
		if i >= 0 {
			if i > 0 {
				w.write(buf[:i])
				buf = buf[i:]
			}
			from = max(from-i, len(start))
			j := bytes.Index(buf[from:], end)
			if j >= 0 {
				j += from
				if j-len(start) <= maxMarkerStatus {
					status := string(buf[len(start):j])
					m.left = append([]byte(nil), buf[j+len(end):]...)
					return status, true
				}
			}
			if j >= 0 || len(buf)-len(start) > maxMarkerStatus+len(end) {
				// Not a marker: its end is not within the longest status.
				// The start is output, with what follows up to the next.
				skip = 1
				if j < 0 {
					from = len(buf) - len(end) + 1
				} else {
					from = j
				}
				continue
			}
			from = max(len(buf)-len(end)+1, len(start))
		} else if keep := len(start) - 1; len(buf) > keep {
			w.write(buf[:len(buf)-keep])
			buf = append([]byte(nil), buf[len(buf)-keep:]...)
			from = 0
		} else {
			from = 0
		}
		n, err := m.src.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if err != nil && n == 0 {
			if len(buf) > 0 {
				w.write(buf)
			}
			return "", false
		}
	}
}
