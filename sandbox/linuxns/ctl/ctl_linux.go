//go:build linux

// Package ctl is the wire protocol between the linuxns driver, in the
// gateway, and a sandbox's init (linuxns/initd), in the sandbox: both sides
// import it, and nothing else is shared between the two processes.
// docs/architecture.md ("The init protocol") walks through it.
package ctl

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// The gateway and a sandbox's init talk over unix stream sockets in frames:
// a 4-byte big-endian length, then that many bytes of JSON. File
// descriptors ride as SCM_RIGHTS on the sendmsg that carries a frame's
// header, so the reader receives them with the header's first byte.
//
// Set-up (the socketpair the init is started with, fd 3 in the init):
//
//	gateway -> init  Spec + fds named by Spec.FDs
//	init -> gateway  Ready
//
// One command (a new connection to the init's control socket per command):
//
//	gateway -> init  Request{Op: "exec"} + stdin, stdout, stderr (pipes; none with a PTY)
//	init -> gateway  Reply{Op: "started"} (+ the PTY master) or {Op: "error"}
//	gateway -> init  Request{Op: "signal"} / {Op: "kill"}, any number of times
//	init -> gateway  Reply{Op: "exit"} once the command's process has exited
//
// The gateway closing the connection before the exit reply means the
// command's client is gone: the init ends the command's process group
// (SIGHUP, then SIGKILL after a grace), as Process.Kill does.
//
// A kept command (Request.Keep, a REST background process) is the
// exception: its exec carries the gateway's ends of the three pipes too
// (stdin, stdout, stderr: six descriptors), which the init holds, and its
// connection closing leaves it running, its pipes open, its exit status
// kept. A later gateway takes it back on a new connection:
//
//	gateway -> init  Request{Op: "attach", Keep}
//	init -> gateway  Reply{Op: "started", Pid, StdinClosed} + the gateway's ends
//	                 (stdout, stderr; stdin first unless StdinClosed),
//	                 or {Op: "error", Errno: ENOENT} when the init keeps no such command
//	...              then as for exec; "exit" at once if it ended meanwhile
//
// A command started without Keep becomes a kept one, as it runs, with
// {Op: "keep", Keep} on its connection, carrying the gateway's ends of
// its output (stdout's and stderr's read ends: two descriptors; or its
// terminal's master: one), which the init then holds; its stdin is the
// gateway's to close (EOF). The init answers {Op: "kept"} (never after the
// command's "exit") or an error (it ended, is kept already, or MaxKept).
// A pause by checkpoint hands an SSH exec to the process API so.
//
// {Op: "eof"} on a kept command's connection closes the init's end of its
// stdin, so that the command sees EOF once the gateway closed its own.
// After a kept command's "exit" the gateway answers {Op: "ack"}: only then
// does the init forget the command; an exit whose connection closed first
// is sent again to the next attach.

// The sandbox's user and layout, as both sides see them.
const (
	// SandboxUID and SandboxGID are the sandbox user inside the sandbox.
	SandboxUID = 1000
	SandboxGID = 1000
	// WorkspaceDir is where the session's workspace is mounted.
	WorkspaceDir = "/workspace"
	// SpecFD is the init's end of the set-up socketpair.
	SpecFD = 3
)

const (
	maxFrame    = 4 << 20
	maxFrameFDs = 16
	// Protocol versions the messages below; it is kept in each
	// sandbox's state. Change it only with a way to talk to older inits.
	Protocol = 1
)

// Spec tells a new init how to build its sandbox.
type Spec struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname"`
	TmpBytes int64  `json:"tmpBytes"`
	ShmBytes int64  `json:"shmBytes"`
	// SocketCheckMillis is how often the init checks that its control
	// socket's file still exists (see "socket-file").
	SocketCheckMillis int64 `json:"socketCheckMillis"`
	// Probe builds the sandbox, reports and exits: Open uses it to learn
	// whether this host can run the linux driver.
	Probe bool `json:"probe,omitempty"`
	// Env and WorkingDir come from the sandbox's image (sandbox.Image):
	// the environment every command starts from, on top of the sandbox's
	// own, and where commands and SFTP start ("": the workspace).
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	// TrustPEM holds certificates to add to the sandbox's trust store
	// (sandbox.Spec.TrustPEM).
	TrustPEM string `json:"trustPEM,omitempty"`
	// AllowUserNS lets the sandbox's processes create user namespaces
	// (serve --sandbox-allow-userns); by default the seccomp filter and the
	// sandbox's max_user_namespaces of 0 refuse them.
	AllowUserNS bool `json:"allowUserNS,omitempty"`
	// NoSeccomp starts the sandbox without its seccomp filter. Only tests
	// set it, to measure what the filter costs; the gateway never does.
	NoSeccomp bool `json:"noSeccomp,omitempty"`
	// Seccomp is the seccomp filter's program (package seccompprog),
	// which the gateway assembles once: struct sock_filter entries of 8
	// bytes in the host's byte order. The init loads it on its spawner
	// thread; unless NoSeccomp, a spec without one fails the build.
	Seccomp []byte `json:"seccomp,omitempty"`
	// Checkpoint builds a sandbox CRIU can checkpoint (sandbox.Config.
	// Checkpoint): no UTS namespace per command (a command's tree is its
	// descendants and its process group), stdio reopened on the sandbox's
	// own /dev/null, and no "socket-file".
	Checkpoint bool `json:"checkpoint,omitempty"`
	// InitPath is set by the init itself: the path of the "init"
	// descriptor, which a checkpointable sandbox's root binds at
	// /.sandgate-init before the init re-executes itself from there, so
	// that its executable is a file of the sandbox's own mounts (CRIU
	// restores no executable from a memfd).
	InitPath string `json:"-"`
	// NofileSoft and NofileHard are the RLIMIT_NOFILE of every command
	// the init starts (sandbox.Config.Nofile), and of the init itself when
	// InitNofile is zero (a gateway before it); zero keeps the inherited
	// one.
	NofileSoft uint64 `json:"nofileSoft,omitempty"`
	NofileHard uint64 `json:"nofileHard,omitempty"`
	// InitNofile, when set, is what the init needs for its running and
	// kept commands: the soft limit (the init's and so its commands') is
	// raised to it when NofileSoft is lower, and the hard one with it
	// when NofileHard is.
	InitNofile uint64 `json:"initNofile,omitempty"`
	// FDs names the descriptors sent with the spec, in order:
	// "listener" (the control socket, listening), "workspace" (a detached
	// mount to attach at /workspace), "tasks" (the open cgroup v1 tasks
	// files of the cgroups the commands run in), "socket-file" (an O_PATH
	// descriptor of the control socket's file: once it is unlinked, no
	// gateway can reach the init, which then ends the sandbox), "rootfs" (a
	// detached mount of an image's root: the sandbox's / instead of the
	// host-derived one). With Checkpoint, "init" is an O_PATH descriptor
	// of a host file holding the init's binary (InitPath). "etc" is a
	// detached, read-only mount of the gateway's /etc template (initd's
	// BuildEtcTemplate): the default root's /etc, to which the init adds
	// only the files naming the sandbox; without it, the init builds its
	// /etc from the host's.
	FDs []string `json:"fds"`
	// Late names descriptors that are not sent with the spec but in an
	// Attach frame after it ("workspace", and "rootfs" for an image; and
	// "cputasks", the tasks file of the sandbox's v1 cpu cgroup, which the
	// init's threads move into themselves once its root is built): the
	// gateway sends the spec as soon as the init runs, and the init builds
	// what needs neither (the default root, its /etc, /dev, /proc, /tmp)
	// while the gateway makes the workspace.
	Late []string `json:"late,omitempty"`
}

// Attach follows a Spec that named Late descriptors: they come with it,
// in the order FDs names them.
type Attach struct {
	FDs []string `json:"fds"`
}

// Ready is the init's answer to Spec.
type Ready struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// BadImage says that Error is the image's fault, and may be shown to
	// whoever chose it.
	BadImage bool `json:"badImage,omitempty"`
	// Steps time the init's own steps of building the sandbox (the
	// gateway adds them to the create's sandbox.Trace).
	Steps []Step `json:"steps,omitempty"`
	// StartedMicros is when the init's main began, in Unix microseconds:
	// the gateway times the exec and the Go runtime's start from it.
	StartedMicros int64 `json:"startedUs,omitempty"`
}

// Step is one step of building a sandbox, as the init timed it.
type Step struct {
	Name   string `json:"name"`
	Micros int64  `json:"us"`
}

// Request is a message from the gateway on a control connection.
type Request struct {
	Op string `json:"op"` // exec, attach, signal, kill, eof, keep
	// Keep names a kept command (exec, attach): see above.
	Keep    string `json:"keep,omitempty"`
	Command string `json:"command,omitempty"`
	// Direct, when set, are Command's words, which the init runs without
	// the shell where bash would exec them as they are (sandbox.Cmd.Direct).
	Direct []string `json:"direct,omitempty"`
	// DirectArgv: Direct is an argv run as `exec 'a' 'b'`.
	DirectArgv bool `json:"directArgv,omitempty"`
	// DirectCwd is where Command cds before the words (Cmd.DirectCwd).
	DirectCwd string `json:"directCwd,omitempty"`
	// Builtin, when set, are Command's words when they call a builtin
	// that does nothing but exit (sandbox.Cmd.Builtin): the init answers
	// for it without a process where sandbox.DirectBuiltin says it may.
	// An init that predates it ignores it, and runs the shell.
	Builtin   []string     `json:"builtin,omitempty"`
	Subsystem string       `json:"subsystem,omitempty"`
	Env       []string     `json:"env,omitempty"`
	PTY       *sandbox.PTY `json:"pty,omitempty"`
	Signal    int          `json:"signal,omitempty"`
	// TrustPEM is what a "trust" request adds to the sandbox's trust
	// store, as Spec.TrustPEM at build (a warm sandbox bound to a
	// session); the init answers "trusted" or "error".
	TrustPEM string `json:"trustPEM,omitempty"`
}

// Reply is a message from the init on a control connection.
type Reply struct {
	Op    string `json:"op"` // started, error, exit, kept
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
	// Errno is the system error behind Error, when there is one (ENOENT
	// for a missing shell), so that the gateway can tell errors apart.
	Errno int           `json:"errno,omitempty"`
	Exit  *sandbox.Exit `json:"exit,omitempty"`
	// StdinClosed says that an attach's descriptors hold no stdin: the
	// command's input was closed (eof).
	StdinClosed bool `json:"stdinClosed,omitempty"`
	// PTY says that an attach's one descriptor is the command's terminal
	// (a kept command on a PTY), which the init holds a copy of.
	PTY bool `json:"pty,omitempty"`
	// DirectPWD ("started") says that the command runs without the shell
	// (Request.Direct), in this directory, as bash's $PWD would name it.
	DirectPWD string `json:"directPWD,omitempty"`
}

// ImageError marks a build failure that is the image's fault (see
// Ready.BadImage).
type ImageError struct{ Reason string }

func (e *ImageError) Error() string { return e.Reason }

// ErrorReply is the reply for err, with its errno when it has one.
func ErrorReply(err error) Reply {
	r := Reply{Op: "error", Error: err.Error()}
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		r.Errno = int(errno)
	}
	return r
}

// Err is the error an "error" reply stands for: its text, wrapping its
// errno when it has one (errors.Is(err, fs.ErrNotExist) holds for ENOENT).
func (r Reply) Err() error {
	if r.Errno != 0 {
		return &replyError{msg: r.Error, errno: syscall.Errno(r.Errno)}
	}
	return errors.New(r.Error)
}

type replyError struct {
	msg   string
	errno syscall.Errno
}

func (e *replyError) Error() string { return e.msg }
func (e *replyError) Unwrap() error { return e.errno }

// Conn is a control connection's end that frames go over: a
// *net.UnixConn, or an FD.
type Conn interface {
	io.ReadWriter
	ReadMsgUnix(b, oob []byte) (n, oobn, flags int, addr *net.UnixAddr, err error)
	WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (n, oobn int, err error)
}

// FD is a Conn over a blocking unix socket descriptor, for a thread that
// must not wait through the Go runtime's poller (the init's spawner
// thread; see initd). The caller owns the descriptor.
type FD int

func (fd FD) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (fd FD) Write(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Write(int(fd), b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// ReadMsgUnix is (*net.UnixConn).ReadMsgUnix on the descriptor; the
// address is always nil.
func (fd FD) ReadMsgUnix(b, oob []byte) (n, oobn, flags int, addr *net.UnixAddr, err error) {
	for {
		n, oobn, flags, _, err = unix.Recvmsg(int(fd), b, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			return n, oobn, flags, nil, err
		}
	}
}

// WriteMsgUnix is (*net.UnixConn).WriteMsgUnix on the descriptor; addr
// must be nil.
func (fd FD) WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (n, oobn int, err error) {
	if addr != nil {
		return 0, 0, errors.New("ctl.FD: an address on a connected socket")
	}
	for {
		n, err = unix.SendmsgN(int(fd), b, oob, nil, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return n, 0, err
	}
	return n, len(oob), nil
}

// WriteFrame sends v as one frame with fds attached.
func WriteFrame(c Conn, v any, fds ...int) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > maxFrame {
		return fmt.Errorf("frame of %d bytes is too large", len(body))
	}
	msg := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(msg, uint32(len(body)))
	copy(msg[4:], body)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	// A stream socket may take a large frame in several writes; the
	// descriptors went with the first.
	if n < len(msg) {
		_, err = c.Write(msg[n:])
	}
	return err
}

// ReadFrame reads one frame into v and returns the descriptors that came
// with it (close-on-exec). On error, no descriptor is left open.
func ReadFrame(c Conn, v any) (fds []int, err error) {
	defer func() {
		if err != nil {
			procio.CloseFDs(fds)
			fds = nil
		}
	}()
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*maxFrameFDs))
	for got := 0; got < len(hdr); {
		n, oobn, _, _, err := c.ReadMsgUnix(hdr[got:], oob)
		if oobn > 0 {
			more, perr := parseRights(oob[:oobn])
			fds = append(fds, more...)
			if perr != nil {
				return fds, perr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return fds, err
		}
		if n == 0 {
			return fds, io.EOF
		}
		got += n
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		return fds, fmt.Errorf("frame of %d bytes is too large", size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return fds, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fds, fmt.Errorf("decode frame: %w", err)
	}
	return fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// MaxKept bounds the kept commands of a sandbox (Request.Keep): the
// gateway keeps at most 88 per session (64 background processes, 16
// shells, 8 kernels). The init holds three descriptors for each (the
// pipes) beyond the two of any running command, until its exit is
// acknowledged.
const MaxKept = 96

// The spawn server (`sandgate-init sandbox-spawner`, initd.SpawnMain) is
// a small process the linux driver starts once, which starts every new
// sandbox init on the driver's behalf. A clone into a new user namespace
// cannot share the caller's memory (the child waits for its id maps), so
// Go forks the whole caller: from the gateway, with its heap and page
// tables, that cost milliseconds per sandbox, growing with the gateway,
// and held the gateway's memory map locked meanwhile. The server is a few
// MiB: the same clone costs it a fraction of that.
const (
	// SpawnConnFD is the server's end of its socketpair with the driver.
	SpawnConnFD = 3
	// SpawnInitFD is the init binary the server execs, open read-only.
	SpawnInitFD = 4
)

// SpawnRequest asks the spawn server to start one sandbox init, exactly
// as the driver would (driver_linux.go, startInit). Its descriptors, named
// by FDs in order: "reply" (a socket the server answers SpawnReply on,
// with the init's pidfd), "init" (the init's end of its set-up
// socketpair, its fd 3), "log" (its stderr), "cgroup" (the cgroup v2
// directory it is born in, optional), and "tasks" (each a v1 tasks file the
// forking thread joins first, optional).
type SpawnRequest struct {
	// UIDBase and IDs map the init's ids 0..IDs-1 to UIDBase onwards.
	UIDBase int `json:"uidBase"`
	IDs     int `json:"ids"`
	// Cloneflags are the namespaces it is born in (CLONE_NEWUSER and
	// others).
	Cloneflags uintptr  `json:"cloneflags"`
	Env        []string `json:"env"`
	FDs        []string `json:"fds"`
}

// SpawnReply answers a SpawnRequest: the init's host pid, with its pidfd,
// or why it did not start.
type SpawnReply struct {
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}
