package dataplane

import (
	"bytes"
	"context"
	_ "embed" // the kernel's driver script
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// kernelDriver is the Python side of a kernel: it runs as
// `python3 -u -c <script>` in the sandbox and speaks the framing that its
// header describes.
//
//go:embed kernel.py
var kernelDriver string

// Kernel limits.
const (
	// MaxKernels caps a session's Python kernels.
	MaxKernels = 8
	// MaxKernelQueue caps the calls waiting for one kernel.
	MaxKernelQueue = 32
	// KernelInterruptGrace is how long a timed-out cell has, after its
	// SIGINT, to come back before the kernel is killed and restarted.
	KernelInterruptGrace = 2 * time.Second
	// KernelStartTimeout bounds a kernel's start, up to its ready frame.
	KernelStartTimeout = 30 * time.Second
	// minKernelFrame bounds one frame from a kernel (output comes in
	// 64 KiB chunks; a done frame holds two strings of at most 256 KiB,
	// JSON-escaped); a result frame may be as long as the call's
	// MaxOutputBytes.
	minKernelFrame = 4 << 20
	// kernelExitWait is how long a kernel whose channel ended has to
	// exit before it is killed.
	kernelExitWait = time.Second
)

// Kernel errors.
var (
	ErrTooManyKernels error = newClientError("too many Python kernels in this session", gateway.KindQuota, "too_many_kernels",
		fmt.Sprintf("a session may have at most %d Python kernels", MaxKernels))
	ErrKernelBusy error = newClientError("too many calls wait for this kernel", gateway.KindQuota, "kernel_busy",
		fmt.Sprintf("%d calls already wait for this kernel", MaxKernelQueue))
	ErrKernelClosed error = newClientError("the kernel was reset while the call waited for it", gateway.KindConflict, "kernel_reset",
		"the kernel was reset while the call waited for it")
	// ErrPythonUnavailable: the sandbox has no python3 on its PATH.
	ErrPythonUnavailable error = newClientError("python3 is not available in this sandbox", gateway.KindInvalid, "python_unavailable",
		"this session's image has no python3 on its PATH; use an image with Python")
)

// KernelStartError is a python3 that is there but could not run the
// kernel (too old, broken); Reason is for people.
type KernelStartError struct {
	Reason string
}

func (e *KernelStartError) Error() string { return "the Python kernel could not start: " + e.Reason }

// Unwrap makes a KernelStartError an ErrPythonUnavailable too.
func (e *KernelStartError) Unwrap() error { return ErrPythonUnavailable }

// ValidKernelName reports whether name may name a kernel (as a shell).
func ValidKernelName(name string) bool { return shellNameRE.MatchString(name) }

// PythonRequest is one piece of code for a kernel.
type PythonRequest struct {
	Code string
	// Timeout bounds the code's run (queueing for the kernel not counted).
	Timeout time.Duration
	// MaxOutputBytes bounds each of stdout and stderr (head and tail
	// kept, as for commands), and the result, the error's value and its
	// traceback (head kept).
	MaxOutputBytes int64
	// Display asks for rich output (kernel.py's display hooks): the MIME
	// bundle of the last expression's value, what display() shows and
	// the figures matplotlib draws, each at most MaxOutputBytes, as
	// PythonResult.Displays.
	Display bool
	// OnOutput, when set, gets each piece of output as it comes (stderr:
	// from fd 2), and OnDisplay each display, in the order the code made
	// them; both are called on the caller's goroutine, within Run.
	OnOutput  func(stderr bool, data []byte)
	OnDisplay func(Display)
	// Env are environment variables (os.environ) set for this call's code
	// only: the kernel puts back what they replaced when it ends.
	// BaseEnv are set once in each interpreter, at its first call that
	// carries them, and stay.
	Env, BaseEnv map[string]string
}

// Display is one rich output of a cell: its MIME bundle (text/plain,
// text/html, image/png in base64, ...), and whether it is the value of
// the cell's last expression.
type Display struct {
	Data map[string]any `json:"data"`
	Main bool           `json:"main"`
}

// PythonError is an exception the code did not catch, or the kernel's
// death (Name "KernelDied") or reset ("KernelReset") under it.
type PythonError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// PythonResult is what a piece of code did.
type PythonResult struct {
	Stdout, Stderr Output
	// Result is the repr of the code's last expression statement, nil
	// when it ends with another statement or the value is None.
	Result          *string
	ResultTruncated bool
	// Displays are the cell's rich outputs, when the request asked.
	Displays []Display
	Error    *PythonError
	Duration time.Duration
	// TimedOut: the timeout expired. Interrupted: the code then stopped
	// on its SIGINT (KeyboardInterrupt) and the state is intact.
	TimedOut, Interrupted bool
	// Restarted: this call started a new interpreter in place of one
	// that was killed (a timeout the code did not stop for) or had died
	// (an earlier call's crash). StateLost: the variables of earlier calls
	// are gone from the kernel this answer leaves.
	Restarted, StateLost bool
}

// Truncated reports whether an output stream or the result was cut.
func (r PythonResult) Truncated() bool {
	return r.Stdout.Truncated || r.Stderr.Truncated || r.ResultTruncated
}

// Kernels holds every session's persistent Python kernels. Its zero value
// is ready to use.
//
// With StateDir, a kernel outlives the gateway: a sandbox that keeps
// processes (sandbox.Keeper) keeps its interpreter, and a file
// <StateDir>/<session>/kernel-<name> names it, so that the next gateway
// takes it back with its state. Where it cannot be taken back (a driver
// that does not keep processes), the file tells that a kernel existed,
// and the first call after the restart says stateLost.
type Kernels struct {
	// StateDir is where kernels are recorded ("": nowhere; a restart
	// forgets them).
	StateDir string

	reg registry[*kernel]
}

// Run runs req in the session's kernel name, starting the kernel if
// needed. Calls to one kernel run one at a time, in the order they came;
// a call waits at most until ctx ends. When ctx ends while the code runs,
// the code is interrupted as on a timeout.
func (k *Kernels) Run(ctx context.Context, id string, s Session, name string, req PythonRequest) (PythonResult, error) {
	x, err := k.get(id, s, name)
	if err != nil {
		return PythonResult{}, err
	}
	return x.run(ctx, req)
}

// Fork gives session dst (s), a fork of session src, the kernels src has
// recorded: dst's sandbox holds copies of src's interpreters, kept under
// the same keys, and each is taken back at its first call, its state
// included, as after a gateway restart. Without StateDir (kernels not
// kept) dst starts with none.
func (k *Kernels) Fork(src, dst string, s Session) {
	for _, name := range forkRecords(k.StateDir, src, dst, "kernel-") {
		if ValidKernelName(name) {
			_, _ = k.get(dst, s, name)
		}
	}
}

// forkRecords copies session src's records of kind (a file name prefix)
// under dir to session dst's, for a fork (Kernels.Fork, Shells.Fork), and
// returns the names copied.
func forkRecords(dir, src, dst, kind string) []string {
	if dir == "" || !sandbox.ValidID(dst) {
		return nil
	}
	var names []string
	for _, name := range recorded(dir, src, kind) {
		b, err := os.ReadFile(filepath.Join(dir, src, kind+name))
		if err != nil {
			continue
		}
		if err := os.MkdirAll(filepath.Join(dir, dst), 0o700); err != nil {
			return names
		}
		if err := os.WriteFile(filepath.Join(dir, dst, kind+name), b, 0o600); err == nil {
			names = append(names, name)
		}
	}
	return names
}

// Restore registers the kernels an earlier gateway recorded for session
// id (s), so that a reset reaches them before any call does; each is
// taken back at its first call.
func (k *Kernels) Restore(id string, s Session) {
	for _, name := range recorded(k.StateDir, id, "kernel-") {
		if ValidKernelName(name) {
			_, _ = k.get(id, s, name)
		}
	}
}

// Reset ends the session's kernel name, if it has one, killing code it
// runs: the next call starts a fresh interpreter. Files are untouched.
// It reports whether there was a kernel.
func (k *Kernels) Reset(id, name string) bool {
	x, ok := k.reg.take(id, name)
	if !ok {
		return false
	}
	x.close()
	return true
}

func (k *Kernels) get(id string, s Session, name string) (*kernel, error) {
	return k.reg.get(id, s, name, MaxKernels, ErrTooManyKernels, func() *kernel {
		x := &kernel{name: name, s: s, turn: make(chan struct{}, 1), closed: make(chan struct{}),
			// Cell ids never repeat one an interpreter taken back from an
			// earlier gateway may still answer.
			seq: uint64(time.Now().UnixNano())}
		if k.StateDir != "" && sandbox.ValidID(id) {
			x.dir = filepath.Join(k.StateDir, id)
			x.record = filepath.Join(x.dir, "kernel-"+name)
		}
		if oc, ok := s.(checkpointNotifier); ok {
			x.offCheckpoint = oc.OnCheckpoint(x.letGo)
		}
		return x
	})
}

func (x *kernel) setUnregister(remove func()) { x.unregister = remove }

// checkpointNotifier is implemented by sessions that tell their kernels
// before a pause that may checkpoint the sandbox (gateway.Session).
type checkpointNotifier interface {
	OnCheckpoint(fn func() bool) (remove func())
}

// letGo lets go of the kernel's interpreter before a checkpoint: it runs
// on in the sandbox, kept under the record's key, and the next call takes
// it back with its state (resume), as after a gateway restart. A call
// whose cell runs lets go of it itself (run: its answer is
// ErrKernelLetGo, its cell goes on in the interpreter). It reports false
// when the interpreter cannot be let go (not kept), or a call holds it
// but runs no cell (it starts, restarts or takes back the interpreter)
// for letGoWait: the pause is then a freeze.
func (x *kernel) letGo() bool {
	return letGoTurn(x.turn, &x.mu, &x.call, func() bool { return x.proc == nil || x.release() })
}

// letGoTurn lets go of a kernel's or shell's process for a checkpoint:
// by release, called holding turn, when no call holds it; else by asking
// the call under way (askLetGo), which lets go of it itself; for at most
// letGoWait.
func letGoTurn(turn chan struct{}, mu *sync.Mutex, call **callLetGo, release func() bool) bool {
	deadline := time.Now().Add(letGoWait)
	for {
		select {
		case turn <- struct{}{}:
			defer func() { <-turn }()
			return release()
		default:
		}
		if ok, asked := askLetGo(mu, call, deadline); asked {
			return ok
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// letGoWait bounds how long a let-go for a checkpoint (kernel.letGo,
// shell.letGo) waits for a call that holds its kernel or shell but is not
// in the part of it that can let go (starting or taking back the process,
// or ending).
const letGoWait = 500 * time.Millisecond

// callLetGo is a kernel call or shell command under way, which a pause by
// checkpoint asks to let go of its process (askLetGo): it answers on the
// channel it is sent whether it did, or leaves (left closed) first.
type callLetGo struct {
	ask  chan chan bool
	left chan struct{}
}

// enterCall registers a call that can let go of its process in *cur
// (guarded by mu) until the returned function.
func enterCall(mu *sync.Mutex, cur **callLetGo) (*callLetGo, func()) {
	c := &callLetGo{ask: make(chan chan bool), left: make(chan struct{})}
	mu.Lock()
	*cur = c
	mu.Unlock()
	return c, func() {
		mu.Lock()
		*cur = nil
		mu.Unlock()
		close(c.left)
	}
}

// askLetGo asks the call in *cur to let go of its process: asked is false
// when there is none, or it left before it heard, or it did not hear by
// deadline. A call hears only where it waits on its process; elsewhere
// (it restarts its interpreter, it ends) it may wait for what the pause
// holds (the session's lifecycle lock, for a start): the ask must not
// wait for it without end.
func askLetGo(mu *sync.Mutex, cur **callLetGo, deadline time.Time) (ok, asked bool) {
	mu.Lock()
	c := *cur
	mu.Unlock()
	if c == nil {
		return false, false
	}
	reply := make(chan bool, 1)
	select {
	case c.ask <- reply: // a call that hears now is asked, deadline or not
		return <-reply, true
	default:
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case c.ask <- reply:
		return <-reply, true
	case <-c.left:
		return false, false
	case <-timer.C:
		return false, false
	}
}

// release lets go of the interpreter (letGo; the turn is held): false
// when it is not kept.
func (x *kernel) release() bool {
	r, ok := x.proc.p.(sandbox.Releaser)
	if !ok || x.record == "" {
		return false
	}
	if rec, _ := x.readRecord(); rec.Keep == "" {
		return false
	}
	x.proc.stopOnce.Do(func() { close(x.proc.gone) })
	r.Release()
	x.proc, x.resumed = nil, false
	return true
}

// sessionEnded ends the kernel with its session.
func (x *kernel) sessionEnded() {
	x.close()
	if x.dir != "" {
		_ = os.Remove(x.dir) // when the session left nothing else there
	}
}

// kernel is one named kernel of a session: its current interpreter, if
// any, and the queue of calls for it.
type kernel struct {
	name       string
	s          Session
	turn       chan struct{} // held by the running call
	closed     chan struct{}
	closeOnce  sync.Once
	unregister func()
	// offCheckpoint unregisters letGo from the session.
	offCheckpoint func()

	mu      sync.Mutex // guards waiting and call
	waiting int
	// call is the call whose cell runs, which a pause by checkpoint asks
	// to let go of the interpreter (letGo).
	call *callLetGo

	// record is the file that names the kernel's interpreter across
	// gateway restarts, in dir ("": none).
	dir, record string

	// Owned by the call holding turn.
	proc *kernelProc
	died bool   // the last interpreter died on its own; not yet said by a restart
	seq  uint64 // the last cell's id
	// resumed says that the record was looked at: an interpreter of an
	// earlier gateway was taken back, or its loss said.
	resumed bool
	// letGoCell says that a pause let go of the interpreter while a cell
	// ran (its call answered ErrKernelLetGo), cellMax that cell's
	// MaxOutputBytes: the next call waits for it (syncTakenBack).
	letGoCell bool
	cellMax   int64
}

func (x *kernel) close() {
	x.closeOnce.Do(func() {
		close(x.closed)
		if x.unregister != nil {
			x.unregister()
		}
		if x.offCheckpoint != nil {
			x.offCheckpoint()
		}
		// Wait for the running call to see closed and kill its kernel.
		x.turn <- struct{}{}
		if !x.resumed {
			// An earlier gateway's interpreter, not taken back yet: to
			// end it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = x.resume(ctx, &PythonResult{})
			cancel()
		}
		if x.proc != nil {
			x.proc.kill() // with what the code left running in its group
			x.proc = nil
		}
		if x.record != "" {
			_ = os.Remove(x.record)
		}
	})
}

// kernelRecord is what a kernel's record file holds.
type kernelRecord struct {
	// Tenant is the session's, so that the next gateway can find it.
	Tenant string `json:"tenant,omitempty"`
	// Keep is the key the sandbox keeps the interpreter under; "" when it
	// does not keep it (it ended with its gateway).
	Keep string `json:"keep,omitempty"`
	// Mark says that the interpreter's driver sends a run's mark
	// (kernel.py): a gateway that takes it back finds its channel again
	// at a frame boundary however it was cut (a pause let go of it during
	// a cell, a reader stopped inside a frame). Drivers before it do not:
	// their channel is taken back as it is.
	Mark bool `json:"mark,omitempty"`
}

// readRecord reads the kernel's record; false when there is none (no
// kernel of this name before).
func (x *kernel) readRecord() (kernelRecord, bool) {
	var rec kernelRecord
	b, err := os.ReadFile(x.record)
	if err != nil {
		return rec, false
	}
	_ = json.Unmarshal(b, &rec)
	return rec, true
}

// resume runs before the kernel's first interpreter in this gateway: an
// interpreter an earlier gateway left (its record) is taken back with its
// state; one that cannot be was lost with that gateway, which res says.
// A sandbox paused again meanwhile (sandbox.ErrPaused: the interpreter is
// kept, but its init cannot hand it back now) loses nothing: resume
// answers gateway.ErrPaused, the record kept, and the next call takes
// it back.
func (x *kernel) resume(ctx context.Context, res *PythonResult) error {
	if x.record == "" {
		x.resumed = true
		return nil
	}
	rec, ok := x.readRecord()
	if !ok {
		x.resumed = true
		return nil // no kernel of this name before
	}
	if rec.Keep != "" {
		if k, ok := sandbox.As[sandbox.Keeper](x.s.Sandbox()); ok {
			rctx, cancel := context.WithTimeout(ctx, KernelStartTimeout)
			p, err := k.Reattach(rctx, rec.Keep)
			cancel()
			if errors.Is(err, sandbox.ErrPaused) {
				return gateway.ErrPaused
			}
			if err == nil {
				x.resumed = true
				mark := ""
				if rec.Mark {
					mark = newToken()[len("__sandgate_"):]
				}
				x.proc = newKernelProcAt(p, mark)
				x.proc.stale = true
				if x.letGoCell {
					x.proc.maxFrame.Store(x.cellMax) // its frames may be as long
				}
				return nil
			}
		}
	}
	x.resumed = true
	_ = os.Remove(x.record)
	res.Restarted, res.StateLost = true, true
	return nil
}

// sync reads away what a taken-back interpreter still had to say for a
// cell of the earlier gateway (or of the call a pause let go of it
// under): an empty cell, and every frame up to its end (with a mark, the
// channel's bytes up to the mark's frame, then the frames up to the
// cell's end). It ends syncWaiting when that does not come before ctx
// ends or timeout (0: none), syncClosed when closed is, syncGone when the
// channel ends first, and syncAsked (with the reply channel) when a pause
// asks the call to let go (ask).
func (kp *kernelProc) sync(ctx context.Context, id uint64, timeout time.Duration, ask <-chan chan bool, closed <-chan struct{}) (syncEnd, chan bool) {
	if err := kp.send(kernelRequest{Op: "run", ID: id, Code: "", MaxBytes: 1, Mark: kp.mark}); err != nil {
		return syncGone, nil
	}
	var expired <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		expired = timer.C
	}
	for {
		select {
		case f, ok := <-kp.frames:
			if !ok {
				return syncGone, nil
			}
			var m kernelMessage
			if f.kind == 'J' && json.Unmarshal(f.data, &m) == nil && m.Op == "done" && m.ID == id {
				kp.stale = false
				return syncDone, nil
			}
		case <-expired:
			return syncWaiting, nil
		case <-ctx.Done():
			return syncWaiting, nil
		case <-closed:
			return syncClosed, nil
		case reply := <-ask:
			return syncAsked, reply
		}
	}
}

// syncEnd is how a sync ended.
type syncEnd int

const (
	syncDone    syncEnd = iota // the earlier cell (command) is over: the channel is the call's
	syncGone                   // the process ended
	syncWaiting                // the earlier cell runs on: the timeout or the call's context ended
	syncAsked                  // a pause asked the call to let go of the process
	syncClosed                 // the kernel (shell) is being reset or deleted
)

// saveRecord names the kernel's interpreter (key) in its record.
func (x *kernel) saveRecord(key string) {
	if x.record == "" {
		return
	}
	if err := os.MkdirAll(x.dir, 0o700); err == nil {
		_ = writeJSONFile(x.record, kernelRecord{Tenant: tenantOf(x.s), Keep: key, Mark: true})
	}
}

// acquire waits for the kernel's turn.
func (x *kernel) acquire(ctx context.Context) error {
	x.mu.Lock()
	if x.waiting >= MaxKernelQueue {
		x.mu.Unlock()
		return ErrKernelBusy
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
		return ErrKernelClosed
	}
	select {
	case <-x.closed:
		<-x.turn
		return ErrKernelClosed
	default:
		return nil
	}
}

// kernelMessage is a JSON frame from the driver.
type kernelMessage struct {
	Op              string       `json:"op"`
	ID              uint64       `json:"id"`
	Python          string       `json:"python"`
	ResultTruncated bool         `json:"resultTruncated"`
	Error           *PythonError `json:"error"`
}

// kernelRequest is a request to the driver.
type kernelRequest struct {
	Op       string            `json:"op"`
	ID       uint64            `json:"id"`
	Code     string            `json:"code,omitempty"`
	MaxBytes int64             `json:"maxBytes,omitempty"`
	Display  bool              `json:"display,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	BaseEnv  map[string]string `json:"baseEnv,omitempty"`
	Mark     string            `json:"mark,omitempty"`
}

// kernelFrame is one frame from the driver: kind 'O' (stdout bytes), 'E'
// (stderr bytes), 'R' (the result, UTF-8), 'D' (a Display, JSON) or 'J'
// (a JSON message).
type kernelFrame struct {
	kind byte
	data []byte
}

// kernelProc is one running interpreter.
type kernelProc struct {
	p        sandbox.Process
	maxFrame atomic.Int64     // the largest frame the current cell may send
	frames   chan kernelFrame // closed when the channel ends (EOF, a bad frame)
	gone     chan struct{}    // closed by stop: the frame reader gives up
	stderr   *capture         // the real stderr's tail: the driver's own failures
	errMu    sync.Mutex       // guards stderr
	errEnd   chan struct{}    // closed when stderr is at EOF

	stopOnce sync.Once
	exit     sandbox.Exit
	waitErr  error
	// stale says that the interpreter was taken back from an earlier
	// gateway and may still send frames of a cell of that gateway.
	stale bool
	// mark, when set, is the mark of the first cell sync sends: the
	// reader skips the channel's bytes up to that mark's frame.
	mark string
}

// kernelCommand is the shell text that starts a kernel: exit status 127
// says there is no python3.
func kernelCommand() string {
	return "command -v python3 >/dev/null 2>&1 || exit 127\nexec python3 -u -c " + Quote(kernelDriver)
}

// newKernelProc starts reading interpreter p's channel.
func newKernelProc(p sandbox.Process) *kernelProc { return newKernelProcAt(p, "") }

// newKernelProcAt starts reading the channel of interpreter p, taken
// back: from mark's frame on, when mark is set (kernelRecord.Mark).
func newKernelProcAt(p sandbox.Process, mark string) *kernelProc {
	kp := &kernelProc{p: p, frames: make(chan kernelFrame, 16), gone: make(chan struct{}),
		stderr: newCapture(4 << 10), errEnd: make(chan struct{}), mark: mark}
	go kp.readFrames()
	go kp.readStderr()
	return kp
}

// markFrame is the exact frame kernel.py sends for a run's mark.
func markFrame(mark string) []byte {
	payload := `{"op":"mark","mark":"` + mark + `"}`
	f := make([]byte, 5, 5+len(payload))
	f[0] = 'J'
	binary.BigEndian.PutUint32(f[1:], uint32(len(payload)))
	return append(f, payload...)
}

// skipTo reads r up to and with pat, and returns what it read past it;
// false when r ends first.
func skipTo(r io.Reader, pat []byte) ([]byte, bool) {
	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if i := bytes.Index(buf, pat); i >= 0 {
			return buf[i+len(pat):], true
		}
		if keep := len(pat) - 1; len(buf) > keep {
			buf = append(buf[:0], buf[len(buf)-keep:]...)
		}
		if err != nil {
			return nil, false
		}
	}
}

// startKernel starts x's interpreter in its session's sandbox and waits
// for it to be ready; a sandbox that keeps processes keeps it across
// gateway restarts, under the key x's record names.
func (x *kernel) start(ctx context.Context) (*kernelProc, error) {
	cmd := sandbox.Cmd{Command: kernelCommand()}
	if k, ok := sandbox.As[sandbox.Keeper](x.s.Sandbox()); ok && k.Keeps() && x.record != "" {
		cmd.Keep = "kernel/" + newToken()[len("__sandgate_"):]
	}
	kp, err := startKernel(ctx, x.s, cmd)
	if err == nil {
		x.saveRecord(cmd.Keep)
	}
	return kp, err
}

// startKernel starts an interpreter with cmd in s's sandbox and waits for
// it to be ready.
func startKernel(ctx context.Context, s Session, cmd sandbox.Cmd) (*kernelProc, error) {
	p, err := s.Start(context.Background(), cmd, startOwn)
	if err != nil {
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	kp := newKernelProc(p)
	timer := time.NewTimer(KernelStartTimeout)
	defer timer.Stop()
	select {
	case f, ok := <-kp.frames:
		if ok && f.kind == 'J' {
			var m kernelMessage
			if json.Unmarshal(f.data, &m) == nil && m.Op == "ready" {
				return kp, nil
			}
		}
		kp.stop()
		if kp.waitErr == nil && kp.exit.Signal == "" && kp.exit.Code == 127 {
			return nil, ErrPythonUnavailable
		}
		return nil, &KernelStartError{Reason: kp.describeEnd()}
	case <-timer.C:
		kp.stop()
		return nil, &KernelStartError{Reason: fmt.Sprintf("it was not ready within %s", KernelStartTimeout)}
	case <-ctx.Done():
		kp.stop()
		return nil, ctx.Err()
	}
}

// readFrames delivers the driver's frames until its channel ends.
func (kp *kernelProc) readFrames() {
	defer close(kp.frames)
	var r io.Reader = kp.p.Stdout()
	if kp.mark != "" {
		// What comes before the mark is an earlier cell's, maybe from
		// inside a frame: it is dropped.
		rest, ok := skipTo(r, markFrame(kp.mark))
		if !ok {
			return
		}
		r = io.MultiReader(bytes.NewReader(rest), r)
	}
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if int64(n) > max(kp.maxFrame.Load(), minKernelFrame) || !strings.ContainsRune("OERDJ", rune(hdr[0])) {
			return // not the driver speaking: the channel is broken
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(r, data); err != nil {
			return
		}
		select {
		case kp.frames <- kernelFrame{kind: hdr[0], data: data}:
		case <-kp.gone:
			return
		}
	}
}

// readStderr keeps the tail of what reaches the real stderr.
func (kp *kernelProc) readStderr() {
	defer close(kp.errEnd)
	buf := make([]byte, 4096)
	for {
		n, err := kp.p.Stderr().Read(buf)
		kp.errMu.Lock()
		kp.stderr.Write(buf[:n])
		kp.errMu.Unlock()
		if err != nil {
			return
		}
	}
}

// send writes one request to the driver.
func (kp *kernelProc) send(req kernelRequest) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(msg, uint32(len(b)))
	if _, err := kp.p.Stdin().Write(append(msg, b...)); err != nil {
		return fmt.Errorf("write to kernel: %w", err)
	}
	return nil
}

// ended reports whether the driver's channel has ended.
func (kp *kernelProc) ended() bool {
	select {
	case f, ok := <-kp.frames:
		// Nothing comes between cells: a frame means a broken driver.
		_, _ = f, ok
		return true
	default:
		return false
	}
}

// stop ends the interpreter (its whole process group) and reaps it.
// When its channel has ended already it is given kernelExitWait to exit on
// its own, so that its exit status says why.
func (kp *kernelProc) stop() {
	kp.stopOnce.Do(func() {
		close(kp.gone)
		_ = kp.p.Stdin().Close() // the driver exits at EOF
		waited := make(chan struct{})
		go func() {
			kp.exit, kp.waitErr = kp.p.Wait()
			sandbox.Ack(kp.p)
			close(waited)
		}()
		select {
		case <-waited:
		case <-time.After(kernelExitWait):
			kp.p.Kill()
			<-waited
		}
		// The streams: the readers end once the process and anything it
		// left holding them are gone; do not wait for those.
		select {
		case <-kp.errEnd:
		case <-time.After(OutputGrace):
		}
		_ = kp.p.Stdout().Close()
		_ = kp.p.Stderr().Close()
	})
}

// kill ends the interpreter at once.
func (kp *kernelProc) kill() {
	kp.p.Kill()
	kp.stop()
}

// describeEnd says how a stopped interpreter ended, for people.
func (kp *kernelProc) describeEnd() string {
	var msg string
	switch {
	case kp.waitErr != nil:
		msg = "the Python process was lost"
	case kp.exit.Signal != "":
		msg = "the Python process was killed by SIG" + kp.exit.Signal
		if kp.exit.Signal == "KILL" {
			msg += " (out of memory?)"
		}
	default:
		msg = fmt.Sprintf("the Python process exited with status %d", kp.exit.Code)
	}
	kp.errMu.Lock()
	tail, _ := kp.stderr.text()
	kp.errMu.Unlock()
	if tail != "" {
		msg += ": " + tail
	}
	return msg
}

// run runs req once it is its turn.
func (x *kernel) run(ctx context.Context, req PythonRequest) (PythonResult, error) {
	if err := x.acquire(ctx); err != nil {
		return PythonResult{}, err
	}
	defer func() { <-x.turn }()
	var res PythonResult
	if !x.resumed {
		if err := x.resume(ctx, &res); err != nil {
			return PythonResult{}, err
		}
		if x.proc == nil {
			x.letGoCell = false // not taken back: nothing to wait for
		}
	}
	if x.proc != nil && x.proc.stale {
		if err := x.syncTakenBack(ctx, req.Timeout, &res); err != nil {
			return PythonResult{}, err
		}
	}
	if x.proc != nil && x.proc.ended() {
		// It died between calls (a thread of its own, the OOM killer).
		x.proc.stop()
		x.proc, x.died = nil, true
	}
	if x.proc == nil {
		kp, err := x.start(ctx)
		if err != nil {
			return PythonResult{}, err
		}
		x.proc = kp
		if x.died {
			res.Restarted, res.StateLost = true, true
			x.died = false
		}
	}
	x.seq++
	id := x.seq
	began := time.Now()
	stdout, stderr := newCapture(req.MaxOutputBytes), newCapture(req.MaxOutputBytes)
	finish := func() PythonResult {
		res.Duration = time.Since(began)
		res.Stdout, res.Stderr = stdout.output(), stderr.output()
		return res
	}
	kp := x.proc
	kp.maxFrame.Store(req.MaxOutputBytes)
	if err := kp.send(kernelRequest{Op: "run", ID: id, Code: req.Code, MaxBytes: max(req.MaxOutputBytes, 1), Display: req.Display,
		Env: req.Env, BaseEnv: req.BaseEnv}); err != nil {
		x.lost(&res, "")
		return finish(), nil
	}
	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	timeout, done := timer.C, ctx.Done()
	var grace <-chan time.Time
	pausedInGrace := false // the session was paused when the grace last ran out
	call, leave := enterCall(&x.mu, &x.call)
	defer leave()
	interrupt := func() {
		timeout, done = nil, nil
		if grace == nil {
			_ = kp.send(kernelRequest{Op: "interrupt", ID: id})
			grace = time.After(KernelInterruptGrace)
		}
	}
	for {
		select {
		case f, ok := <-kp.frames:
			if !ok {
				x.lost(&res, "")
				return finish(), nil
			}
			switch f.kind {
			case 'O', 'E':
				if f.kind == 'O' {
					stdout.Write(f.data)
				} else {
					stderr.Write(f.data)
				}
				if req.OnOutput != nil {
					req.OnOutput(f.kind == 'E', f.data)
				}
			case 'D':
				var d Display
				if json.Unmarshal(f.data, &d) == nil && req.Display {
					res.Displays = append(res.Displays, d)
					if req.OnDisplay != nil {
						req.OnDisplay(d)
					}
				}
			case 'R':
				result := string(f.data)
				res.Result = &result
			case 'J':
				var m kernelMessage
				if err := json.Unmarshal(f.data, &m); err != nil || m.Op != "done" {
					x.lost(&res, "the kernel broke its protocol")
					return finish(), nil
				}
				if m.ID != id {
					res.Result, res.Displays = nil, nil
					continue // a late answer to an older cell
				}
				res.ResultTruncated, res.Error = m.ResultTruncated, m.Error
				res.Interrupted = grace != nil
				return finish(), nil
			}
		case <-timeout:
			res.TimedOut = true
			interrupt()
		case <-done:
			interrupt()
		case <-grace:
			if paused := sessionPaused(x.s); paused || pausedInGrace {
				// The session is (or was, during this grace) paused: the
				// gateway's clock ran on, the kernel did not, and the
				// interrupt waits in its input until the resume. Killing
				// it now would lose the state the pause keeps: it has its
				// whole grace again once the session runs.
				pausedInGrace = paused
				grace = time.After(KernelInterruptGrace)
				continue
			}
			// The code did not stop: kill the interpreter, start another.
			kp.kill()
			x.proc = nil
			res.StateLost = true
			res.Error = &PythonError{Name: "KernelRestarted", Value: fmt.Sprintf(
				"the code did not stop within %s of its interrupt; the kernel was killed and restarted, its state is lost",
				KernelInterruptGrace)}
			if ctx.Err() == nil {
				if kp, err := x.start(ctx); err == nil {
					x.proc = kp
					res.Restarted = true
				} else {
					x.died = true // the next call tries again, and says so
				}
			}
			return finish(), nil
		case <-x.closed:
			kp.kill()
			x.proc = nil
			res.StateLost = true
			res.Error = &PythonError{Name: "KernelReset", Value: "the kernel was reset while this code ran"}
			return finish(), nil
		case reply := <-call.ask:
			// A pause by checkpoint: the interpreter is let go of, its
			// cell running on; the next call takes it back and reads
			// away the rest of this cell (sync).
			ok := x.release()
			reply <- ok
			if ok {
				x.letGoCell, x.cellMax = true, req.MaxOutputBytes
				return PythonResult{}, kernelLetGo(x.name)
			}
		}
	}
}

// syncTakenBack reads away what interpreter x.proc, taken back, still had
// to say for an earlier cell (kernelProc.sync). A cell that a pause let
// go of under its call in this gateway (letGoCell) is waited for as a
// call queued before this one would be: until it ends, or this call's
// context does (the kernel kept: the next call waits again), or a pause
// asks to let go again (this call answers session_paused, its code not
// run: kernelWaitPaused). One of
// an earlier gateway is given timeout, then the interpreter is killed
// and another started, without the state (res says so).
func (x *kernel) syncTakenBack(ctx context.Context, timeout time.Duration, res *PythonResult) error {
	call, leave := enterCall(&x.mu, &x.call)
	defer leave()
	if x.letGoCell {
		timeout = 0
	}
	for {
		x.seq++
		end, reply := x.proc.sync(ctx, x.seq, timeout, call.ask, x.closed)
		switch {
		case end == syncDone:
			x.letGoCell = false
			return nil
		case end == syncClosed:
			return ErrKernelClosed // close kills the interpreter
		case end == syncAsked:
			ok := x.release()
			reply <- ok
			if ok {
				// This call's code was not sent: it does not run (the
				// earlier cell does, and the next call waits for it).
				return kernelWaitPaused(x.name)
			}
			continue // another sync: the one sent answers first, ignored
		case end == syncWaiting && x.letGoCell:
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		// Still busy with a cell of the earlier gateway, or gone: a new
		// interpreter, without the state.
		x.proc.kill()
		x.proc, x.letGoCell = nil, false
		res.Restarted, res.StateLost = true, true
		return nil
	}
}

// lost records in res that the interpreter died under the cell (or broke
// its protocol: why), reaping it; the next call starts another.
func (x *kernel) lost(res *PythonResult, why string) {
	kp := x.proc
	kp.stop()
	if why == "" {
		why = kp.describeEnd()
	}
	x.proc, x.died = nil, true
	res.StateLost = true
	res.Error = &PythonError{Name: "KernelDied", Value: why + "; its state is lost and the next call starts a new kernel"}
}

// sessionPaused reports whether s is a gateway session paused in place
// (gateway.StatusPaused): its processes are frozen, however long.
func sessionPaused(s Session) bool {
	st, ok := s.(interface{ Status() string })
	return ok && st.Status() == gateway.StatusPaused
}
