package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
	"github.com/sandgate/sandgate/sandbox"
)

// Bounds of a Start, as /v1 bounds a process's start.
const (
	maxEnvVars   = 64
	maxEnvBytes  = 4096 // one variable, name and value
	maxTagBytes  = 64
	maxCwdBytes  = 4096
	maxArgs      = 4096
	maxArgvBytes = 256 << 10 // cmd and args together
)

// procService is process.Process over the data plane's background
// processes: every command an SDK starts, in the foreground or not, is
// one (envd does not know which: the SDK decides whether to wait), so
// that /v1's /processes sees it, it keeps running when the client goes
// away (as envd's do), and it ends with the session.
type procService struct {
	s *Server

	mu sync.Mutex
	// meta is what envd tells of a process that the data plane does not
	// keep (its config as given, its tag), by session, then process id.
	meta map[string]*sessionMeta
}

type sessionMeta struct {
	procs map[string]*procMeta
}

// procMeta is a process's config as the client gave it.
type procMeta struct {
	cmd  string
	args []string
	envs map[string]string
	cwd  *string
	tag  *string
	pty  bool
}

func (ps *procService) config() dataplane.ProcessConfig {
	b := ps.s.d.Plane.Bounds
	return dataplane.ProcessConfig{StateDir: b.StateDir, TenantOutputBytes: b.MaxProcessOutputPerTenant, Log: ps.s.d.Log}
}

// remember keeps m for process id of sess until the session ends (or
// stops: its processes end then). It prunes what the data plane forgot.
func (ps *procService) remember(sess *gateway.Session, id string, m *procMeta) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.meta == nil {
		ps.meta = map[string]*sessionMeta{}
	}
	sm := ps.meta[sess.ID]
	if sm == nil {
		sm = &sessionMeta{procs: map[string]*procMeta{}}
		_, ok := sess.AddConn(func() {
			ps.mu.Lock()
			if ps.meta[sess.ID] == sm {
				delete(ps.meta, sess.ID)
			}
			ps.mu.Unlock()
		})
		if !ok {
			return
		}
		ps.meta[sess.ID] = sm
	}
	for pid := range sm.procs {
		if _, ok := ps.s.d.Plane.Processes.Get(sess.ID, pid); !ok {
			delete(sm.procs, pid)
		}
	}
	sm.procs[id] = m
}

// metaOf is what remember kept of process id, or nil.
func (ps *procService) metaOf(sessID, id string) *procMeta {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if sm := ps.meta[sessID]; sm != nil {
		return sm.procs[id]
	}
	return nil
}

// pidOf is the pid envd's clients know a process by: the sandbox's pid,
// or its number in the session ("p3": 3) when the driver tells no pid.
func pidOf(info dataplane.ProcessInfo) uint32 {
	if info.PID > 0 {
		return uint32(info.PID)
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(info.ProcessID, "p"))
	return uint32(n)
}

// find is the session's process sel names: by pid (a running or
// remembered process), or by tag (the newest running one).
func (ps *procService) find(sess *gateway.Session, sel *process.ProcessSelector) (*dataplane.Process, error) {
	procs := ps.s.d.Plane.Processes
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		id := strconv.FormatUint(uint64(v.Pid), 10)
		if pr, ok := procs.Get(sess.ID, id); ok {
			return pr, nil
		}
		if pr, ok := procs.Get(sess.ID, "p"+id); ok && pr.Info().PID == 0 {
			return pr, nil
		}
		return nil, rpcError(connect.CodeNotFound, "process_not_found", "process with pid "+id+" not found")
	case *process.ProcessSelector_Tag:
		infos := procs.List(sess.ID)
		for i := len(infos) - 1; i >= 0; i-- {
			if infos[i].Name == v.Tag && infos[i].Status == dataplane.StatusRunning {
				if pr, ok := procs.Get(sess.ID, infos[i].ProcessID); ok {
					return pr, nil
				}
			}
		}
		return nil, rpcError(connect.CodeNotFound, "process_not_found", "process with tag "+strconv.Quote(v.Tag)+" not found")
	}
	return nil, invalid("invalid_field", "process: a pid or a tag is required")
}

// procError is err of a call on a process: one that has exited is not
// found, as envd forgets a process when it exits.
func (ps *procService) procError(ctx context.Context, err error, what string) error {
	if errors.Is(err, dataplane.ErrProcessExited) {
		return rpcError(connect.CodeNotFound, "process_exited", "the process has exited")
	}
	if errors.Is(err, dataplane.ErrStdinBlocked) {
		// E2B's SDKs raise their TimeoutException for it.
		return rpcError(connect.CodeDeadlineExceeded, "stdin_blocked",
			"the process did not read its standard input within 10 s: the input was not (all) written")
	}
	return ps.s.toRPC(ctx, err, what)
}

// startRequest checks a Start's config and turns it into the data
// plane's request; the sandbox's own variables (the create's envVars,
// base) come under the command's.
func startRequest(m *process.StartRequest, base map[string]string) (dataplane.StartRequest, *procMeta, error) {
	var sr dataplane.StartRequest
	cfg := m.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return sr, nil, invalid("invalid_field", "process.cmd is required")
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	if len(argv) > maxArgs+1 {
		return sr, nil, invalid("invalid_field", fmt.Sprintf("process.args: more than %d arguments", maxArgs))
	}
	n := 0
	for _, a := range argv {
		n += len(a)
		if strings.IndexByte(a, 0) >= 0 {
			return sr, nil, invalid("invalid_field", "process.cmd and args must not contain NUL")
		}
	}
	if n > maxArgvBytes {
		return sr, nil, invalid("invalid_field", fmt.Sprintf("process.cmd and args are longer than %d bytes", maxArgvBytes))
	}
	sr.Argv = argv
	envs := cfg.GetEnvs()
	if len(envs) > maxEnvVars {
		return sr, nil, invalid("invalid_field", fmt.Sprintf("process.envs has more than %d variables", maxEnvVars))
	}
	// envd sets the variables as given: so does this facade (the command
	// it runs could set them itself). The session's own variables (its
	// secrets, its egress proxy) still win (gateway.Session.Start).
	for name, value := range envs {
		if name == "" || strings.ContainsAny(name, "=\x00") || strings.IndexByte(value, 0) >= 0 {
			return sr, nil, invalid("invalid_field", fmt.Sprintf("process.envs: %q is not a valid variable", name))
		}
		if len(name)+len(value) > maxEnvBytes {
			return sr, nil, invalid("invalid_field", fmt.Sprintf("process.envs: %s is longer than %d bytes", name, maxEnvBytes))
		}
		sr.Env = append(sr.Env, name+"="+value)
	}
	for name, value := range base {
		if _, ok := envs[name]; !ok {
			sr.Env = append(sr.Env, name+"="+value)
		}
	}
	slices.Sort(sr.Env)
	if cfg.Cwd != nil {
		cwd := cfg.GetCwd()
		if len(cwd) > maxCwdBytes || strings.IndexByte(cwd, 0) >= 0 {
			return sr, nil, invalid("invalid_field", fmt.Sprintf("process.cwd must be a path of at most %d bytes without NUL", maxCwdBytes))
		}
		sr.Cwd = cwd
	}
	if m.Tag != nil {
		tag := m.GetTag()
		if len(tag) > maxTagBytes || strings.IndexFunc(tag, func(c rune) bool { return !unicode.IsPrint(c) }) >= 0 {
			return sr, nil, invalid("invalid_field", fmt.Sprintf("tag must be at most %d printable characters", maxTagBytes))
		}
		sr.Name = tag
	}
	if m.Pty != nil {
		size := m.GetPty().GetSize()
		if size.GetCols() > 0xffff || size.GetRows() > 0xffff {
			return sr, nil, invalid("invalid_field", "pty.size: cols and rows must be at most 65535")
		}
		term := envs["TERM"]
		if term == "" {
			term = "xterm-256color"
		}
		sr.PTY = &sandbox.PTY{Term: term, Window: sandbox.Window{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}.OrDefault()}
	}
	meta := &procMeta{cmd: cfg.GetCmd(), args: cfg.GetArgs(), envs: envs, cwd: cfg.Cwd, tag: m.Tag, pty: m.Pty != nil}
	return sr, meta, nil
}

// Start starts a process and streams its events: start (its pid), its
// output as it comes, its end. The process outlives the stream (a client
// that disconnects leaves it running, as envd does) but not the request's
// timeout (Connect-Timeout-Ms, the SDK's command timeout), which kills it
// as envd does; without one it runs until it exits or the session ends.
func (ps *procService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	c := callOf(ctx)
	rec, _ := ps.s.d.Sealer.Of(c.sess)
	sr, meta, err := startRequest(req.Msg, rec.EnvVars)
	if err != nil {
		return err
	}
	done, err := ps.s.streams.open(c)
	if err != nil {
		return err
	}
	defer done()
	info, err := ps.s.d.Plane.Processes.Start(ctx, c.sess, ps.config(), sr)
	if err != nil {
		return ps.s.toRPC(ctx, err, "start process")
	}
	pr, ok := ps.s.d.Plane.Processes.Get(c.sess.ID, info.ProcessID)
	if !ok {
		return rpcError(connect.CodeUnavailable, "session_not_running", notRunning(c))
	}
	ps.remember(c.sess, info.ProcessID, meta)
	if dl, ok := ctx.Deadline(); ok {
		go killAt(pr, dl)
	}
	if !req.Msg.GetStdin() && !meta.pty {
		// The SDK's default: no input, as if from /dev/null.
		if _, err := pr.WriteStdin(ctx, nil, true); err != nil && !errors.Is(err, dataplane.ErrProcessExited) {
			ps.s.d.Log.WarnContext(ctx, "envd_stdin_close_failed", "session", c.sess.ID, "process", info.ProcessID, "err", err)
		}
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pidOf(info)}}}); err != nil {
		return err
	}
	return ps.follow(ctx, send, pr, 0, meta.pty, keepaliveInterval(req.Header()))
}

// killAt kills pr's process group at deadline dl, unless it ended before.
func killAt(pr *dataplane.Process, dl time.Time) {
	t := time.NewTimer(time.Until(dl))
	defer t.Stop()
	select {
	case <-t.C:
		_ = pr.Signal(syscall.SIGKILL)
	case <-pr.Done():
	}
}

// Connect streams the events of a running process from now on: start
// (its pid), its output, its end.
func (ps *procService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	c := callOf(ctx)
	pr, err := ps.find(c.sess, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	done, err := ps.s.streams.open(c)
	if err != nil {
		return err
	}
	defer done()
	info := pr.Info()
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pidOf(info)}}}); err != nil {
		return err
	}
	return ps.follow(ctx, send, pr, pr.Output().End(), pr.PTY(), keepaliveInterval(req.Header()))
}

// follow sends pr's output from offset off as data events (pty ones for a
// terminal), a keepalive event after every quiet interval, then its end
// event once it ended.
func (ps *procService) follow(ctx context.Context, send func(*process.ProcessEvent) error, pr *dataplane.Process, off int64, pty bool, keepalive time.Duration) error {
	// A pause of the session ends the stream, saying so (session_paused),
	// as it ends /v1's follow (docs/pause.md): the process waits with the
	// session, and a Connect after the resume follows it again. Left
	// open, the stream would stay quiet for as long as the session is
	// paused, and hold a gateway's shutdown up.
	sess := callOf(ctx).sess
	pctx, remove, ok := sess.AddPausedCall(ctx)
	defer remove()
	if !ok {
		return rpcError(connect.CodeUnavailable, "session_not_running", notRunning(callOf(ctx)))
	}
	if sess.Status() == gateway.StatusPaused { // paused since the call woke it
		return ps.s.toRPC(ctx, gateway.ErrPaused, "follow process")
	}
	rd := pr.Output().NewReader(off)
	for {
		wctx, cancel := context.WithTimeout(pctx, keepalive)
		chunk, err := rd.Next(wctx, true)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			select {
			case <-pr.Done():
			case <-pctx.Done():
				if gateway.PausedCause(pctx) {
					return ps.s.toRPC(ctx, gateway.ErrPaused, "follow process")
				}
				return ctx.Err()
			}
			return send(endEvent(pr.Info()))
		case errors.Is(err, dataplane.ErrOutputGone):
			return rpcError(connect.CodeUnavailable, "session_not_running", notRunning(callOf(ctx)))
		case gateway.PausedCause(pctx) && ctx.Err() == nil:
			return ps.s.toRPC(ctx, gateway.ErrPaused, "follow process")
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		default:
			return ps.s.toRPC(ctx, err, "read process output")
		}
		if chunk.Dropped > 0 {
			// The client read slower than the process wrote, past what
			// the process keeps (dataplane.DefaultOutputCap): envd's
			// events have no way to say so.
			ps.s.d.Log.WarnContext(ctx, "envd_output_dropped", "session", callOf(ctx).sess.ID, "pid", pidOf(pr.Info()), "bytes", chunk.Dropped)
		}
		if len(chunk.Data) == 0 {
			continue
		}
		data := &process.ProcessEvent_DataEvent{}
		switch {
		case pty:
			data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: chunk.Data}
		case chunk.Stream == dataplane.Stderr:
			data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: chunk.Data}
		default:
			data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: chunk.Data}
		}
		if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}}); err != nil {
			return err
		}
	}
}

// endEvent is how a process ended, as envd tells it (Go's
// os.ProcessState: "exit status 1", "signal: killed", exit code -1 for a
// signal; error set unless it exited 0).
func endEvent(info dataplane.ProcessInfo) *process.ProcessEvent {
	end := &process.ProcessEvent_EndEvent{}
	switch {
	case info.ExitCode != nil:
		end.ExitCode, end.Exited = int32(*info.ExitCode), true
		end.Status = "exit status " + strconv.Itoa(*info.ExitCode)
	default:
		name := strings.ToLower(info.ExitSignal)
		if sig, ok := sandbox.ParseSignal(info.ExitSignal); ok {
			name = syscall.Signal(sig).String()
		}
		end.ExitCode, end.Status = -1, "signal: "+name
	}
	if !end.Exited || end.ExitCode != 0 {
		msg := end.Status
		end.Error = &msg
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
}

// List lists the session's running processes.
func (ps *procService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	c := callOf(ctx)
	res := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, info := range ps.s.d.Plane.Processes.List(c.sess.ID) {
		if info.Status != dataplane.StatusRunning {
			continue
		}
		pi := &process.ProcessInfo{Pid: pidOf(info)}
		if m := ps.metaOf(c.sess.ID, info.ProcessID); m != nil {
			pi.Config = &process.ProcessConfig{Cmd: m.cmd, Args: m.args, Envs: m.envs, Cwd: m.cwd}
			pi.Tag = m.tag
		} else {
			// A process /v1 started, or one a gateway before a restart did.
			cfg := &process.ProcessConfig{Cmd: info.Command}
			if len(info.Argv) > 0 {
				cfg.Cmd, cfg.Args = info.Argv[0], info.Argv[1:]
			}
			if info.Cwd != "" {
				cwd := info.Cwd
				cfg.Cwd = &cwd
			}
			pi.Config = cfg
			if info.Name != "" {
				tag := info.Name
				pi.Tag = &tag
			}
		}
		res.Processes = append(res.Processes, pi)
	}
	return connect.NewResponse(res), nil
}

// input is the bytes of in (stdin or, for a terminal, what is typed).
func input(in *process.ProcessInput) []byte {
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		return v.Stdin
	case *process.ProcessInput_Pty:
		return v.Pty
	}
	return nil
}

// SendInput writes to a process's input.
func (ps *procService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	c := callOf(ctx)
	pr, err := ps.find(c.sess, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if _, err := pr.WriteStdin(ctx, input(req.Msg.GetInput()), false); err != nil {
		return nil, ps.procError(ctx, err, "write input")
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput writes a stream of input to a process: the first message
// (start) names it, data messages follow.
func (ps *procService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	c := callOf(ctx)
	done, err := ps.s.streams.open(c)
	if err != nil {
		return nil, err
	}
	defer done()
	var pr *dataplane.Process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if pr != nil {
				return nil, invalid("invalid_field", "the input stream was already started")
			}
			p, err := ps.find(c.sess, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			pr = p
		case *process.StreamInputRequest_Data:
			if pr == nil {
				return nil, invalid("invalid_field", "the input stream must start with a start event")
			}
			if _, err := pr.WriteStdin(ctx, input(ev.Data.GetInput()), false); err != nil {
				return nil, ps.procError(ctx, err, "write input")
			}
		case *process.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// CloseStdin closes a process's standard input (EOF).
func (ps *procService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	c := callOf(ctx)
	pr, err := ps.find(c.sess, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pr.PTY() {
		return nil, invalid("invalid_field", "a terminal's input cannot be closed; send EOT (ctrl-d) instead")
	}
	if _, err := pr.WriteStdin(ctx, nil, true); err != nil {
		return nil, ps.procError(ctx, err, "close input")
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process's group.
func (ps *procService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	c := callOf(ctx)
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, invalid("invalid_signal", "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL")
	}
	pr, err := ps.find(c.sess, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := pr.Signal(sig); err != nil {
		return nil, ps.procError(ctx, err, "signal process")
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// Update resizes a process's terminal.
func (ps *procService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	c := callOf(ctx)
	pr, err := ps.find(c.sess, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		size := req.Msg.GetPty().GetSize()
		if size.GetCols() == 0 || size.GetRows() == 0 || size.GetCols() > 0xffff || size.GetRows() > 0xffff {
			return nil, invalid("invalid_field", "pty.size: cols and rows must be between 1 and 65535")
		}
		if err := pr.Resize(sandbox.Window{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}); err != nil {
			return nil, ps.procError(ctx, err, "resize terminal")
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
