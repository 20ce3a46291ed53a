// Package sandbox is the API between the gateway and the drivers that
// isolate a session's processes and files. It holds no driver: those are
// sandbox/workdir and sandbox/linuxns, and cmd/sandgate picks one.
//
// A Driver creates one Sandbox per session. Every process of the session
// (exec, shell, sftp-server) is started through Sandbox.Start, so callers never
// learn which driver they run on: adding a driver changes no caller.
//
// Optional behaviour is a small interface below (Reporter, ProxyListener,
// LoopbackDialer, Reattacher, Detacher, Ender, PIDer, Stopper, Pauser, Statser, Keeper); each says who implements it and who uses it.
// docs/architecture.md has the package map.
package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
)

// Error is a sentinel error of this package: a constant, so that no
// importer can change it.
type Error string

func (e Error) Error() string { return string(e) }

// BadImageError is a Create failure caused by the image itself (no shell,
// /workspace not a directory...): the caller may show Reason to whoever
// chose the image.
type BadImageError struct {
	Image, Reason string
}

func (e *BadImageError) Error() string {
	return "image " + e.Image + " cannot run as a sandbox: " + e.Reason
}

// ErrNoImages is Create's answer to a Spec with an image from a driver
// that cannot run images (workdir: it runs commands on the host's own
// root).
const ErrNoImages = Error("this sandbox driver cannot run images; the linux driver can")

// ErrNoTrust is Create's answer to a Spec with TrustPEM from a driver
// that cannot add a certificate to its sandboxes' trust store (workdir).
const ErrNoTrust = Error("this sandbox driver cannot add a certificate authority to a sandbox's trust store; the linux driver can")

// TrustBundle is where, inside a sandbox created with TrustPEM, the trust
// store with TrustPEM added lives: the gateway points SSL_CERT_FILE and
// friends at it.
const TrustBundle = "/etc/sandgate-ca-certificates.crt"

// ErrClosed is returned by Start once the sandbox has been destroyed.
const ErrClosed = Error("sandbox is closed")

// Spec describes the sandbox to create for one session.
type Spec struct {
	// ID is the session id; it names the workdir and, where supported, the
	// hostname (its short form) and the cgroup.
	ID string
	// Image, when set, is the sandbox's root filesystem. Nil is the
	// default root that each driver builds (linuxns: from the host's /usr
	// and /etc). A driver that cannot run images refuses a non-nil Image.
	Image *Image
	// Limits are this sandbox's own limits; each zero field is the
	// driver's (Config.Limits). A driver enforces what it can, as it does
	// its defaults: the linuxns driver enforces memory, pids, CPUs and
	// the workspace's size per sandbox; workdir enforces none.
	Limits Limits
	// TrustPEM, when set, holds PEM certificates that the sandbox's
	// processes must trust (the session's egress CA): the driver adds them
	// to the root's trust store and writes the whole store to TrustBundle.
	// A driver that cannot refuses it with ErrNoTrust.
	TrustPEM []byte
	// Warm says the sandbox is built ahead for a pool, to be claimed
	// later (sandbox.Rebinder): a driver may build it, and keep it while
	// idle, at a low CPU priority, which the claim raises to any
	// sandbox's (linuxns: its cgroup's CPU weight).
	Warm bool
}

// Image is an OCI image unpacked into layers, as the image store
// (package images) hands it to a driver.
type Image struct {
	// Name is the normalised reference ("docker.io/library/python:3.12-slim").
	Name string
	// Digest is the manifest digest ("sha256:...").
	Digest string
	// Layers are the unpacked layer directories, bottom first, in
	// overlayfs form (whiteouts are 0:0 character devices, opaque
	// directories carry trusted.overlay.opaque). Files keep the image's
	// own uids and gids, which the driver maps into the sandbox.
	Layers []string
	// Env is the image config's environment (PATH included): it applies
	// to every process of the sandbox.
	Env []string
	// WorkingDir is the image config's working directory: where commands
	// and SFTP start ("" for the workspace).
	WorkingDir string
}

// Driver creates sandboxes. Implementations must be safe for concurrent use.
// Implemented by workdir.Driver and linuxns.Driver; cmd/sandgate picks one,
// and gateway.Manager creates a sandbox per session with it.
type Driver interface {
	// Name is the driver's name as given to `serve --sandbox`.
	Name() string
	// Create makes a new sandbox. On error nothing of it is left behind.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// Sandbox is one session's isolated environment. Implemented by each
// driver's sandbox; gateway.Manager owns it (Destroy), and sshd starts every
// process of the session in it (Start).
type Sandbox interface {
	// Workdir is the host path of the session's workspace directory.
	Workdir() string
	// Start runs a process inside the sandbox.
	Start(ctx context.Context, cmd Cmd) (Process, error)
	// Destroy kills every process of the sandbox and removes everything it
	// owns on the host (workdir, cgroup, mounts). It is idempotent.
	Destroy(ctx context.Context) error
}

// Window is a terminal size in character cells.
type Window struct {
	Cols, Rows uint16
}

// OrDefault is w, or 80x24 when a side is zero.
func (w Window) OrDefault() Window {
	if w.Cols == 0 || w.Rows == 0 {
		return Window{Cols: 80, Rows: 24}
	}
	return w
}

// PTY asks for a pseudo-terminal.
type PTY struct {
	Term   string
	Window Window
}

// Cmd describes a process to start in a sandbox.
type Cmd struct {
	// Command is run by the sandbox's shell with -c. Empty means an
	// interactive login shell.
	Command string
	// Subsystem, when set, names a built-in subsystem to run instead of
	// Command. Only "sftp" exists.
	Subsystem string
	// Env holds extra KEY=VALUE pairs on top of the sandbox's clean
	// environment (already filtered by the caller).
	Env []string
	// PTY, when non-nil, runs the process on a new pseudo-terminal as its
	// controlling terminal. Stdout then carries the terminal output and Stderr is nil.
	PTY *PTY
	// Keep, when set, asks the sandbox to keep the process (on a PTY only
	// where the sandbox is a PTYKeeper)
	// under this key across gateway restarts (a REST background process):
	// when the gateway goes away the process runs on, its pipes held open,
	// and a later gateway takes it back with Keeper.Reattach. A sandbox
	// that cannot keep processes (see Keeper) ignores it: the process
	// ends with the gateway.
	Keep string
	// Direct, when set (by the gateway, for a REST command: DirectWords),
	// are the words of Command's last line, every line before it running
	// builtins only (dataplane.Run's script): the sandbox runs them
	// without the shell when DirectExec says that bash would exec them as
	// they are, and reports it (DirectProcess). Without a PTY only.
	Direct []string
	// DirectArgv says that Direct is an argv that Command runs as
	// `exec 'a' 'b'` (DirectArgvOK), not Command's words.
	DirectArgv bool
	// DirectCwd is where Command's script cds before the words
	// (dataplane.Request.Cwd: absolute, or relative to $HOME).
	DirectCwd string
	// Builtin, when set (by the gateway, for a REST command:
	// DirectBuiltinWords), are the words of Command's last line when they
	// call a builtin of bash that does nothing but exit (true, :, false):
	// the sandbox may answer for them without starting anything where
	// DirectBuiltin says that it may, and reports it as it reports Direct
	// (DirectProcess). Without a PTY, and not kept, only. A sandbox that
	// does not know it runs the shell.
	Builtin []string
}

// DirectProcess is a Process that says whether it ran its command
// without the shell (Cmd.Direct), and then in which directory, as bash's
// $PWD would have named it.
type DirectProcess interface {
	DirectPWD() (pwd string, direct bool)
}

// Exit is how a process ended.
type Exit struct {
	// Code is the exit status, valid when Signal is empty.
	Code int
	// Signal is the signal name without "SIG" ("KILL", "TERM") when the
	// process was killed by a signal.
	Signal     string
	CoreDumped bool
}

// Process is a running process inside a sandbox, as Sandbox.Start returns
// it; sshd copies its streams to an SSH channel.
type Process interface {
	// Stdin is the process's standard input. Closing it sends EOF
	// (no-op with a PTY).
	Stdin() io.WriteCloser
	// Stdout is the process's standard output (the terminal with a PTY).
	Stdout() io.ReadCloser
	// Stderr is the process's standard error, nil with a PTY.
	Stderr() io.ReadCloser
	// Resize changes the terminal size; an error without a PTY.
	Resize(w Window) error
	// Signal sends sig to the process's group.
	Signal(sig syscall.Signal) error
	// Wait waits for the process to exit. It may be called once.
	Wait() (Exit, error)
	// Kill ends the process's group: SIGHUP, then SIGKILL shortly after.
	Kill()
}

// Reporter is implemented by drivers that can tell which limits they enforce
// on this host (linuxns). cmd/sandgate logs it at start; /readyz shows it.
type Reporter interface {
	Report() map[string]any
}

// ProxyListener is implemented by sandboxes whose processes can reach a
// TCP listener that the gateway opens for them (linuxns: on loopback
// inside the sandbox's network namespace, its only network; workdir: on
// the host's loopback). gateway.Manager serves the session's egress proxy
// on it.
type ProxyListener interface {
	// ListenProxy opens the listener; addr is how the sandbox's processes
	// reach it ("127.0.0.1:3128"). The caller closes ln.
	ListenProxy(ctx context.Context) (ln net.Listener, addr string, err error)
}

// TransparentNet is implemented by sandboxes whose every outbound TCP
// connection the gateway can take (linuxns: a default route off the
// loopback of the sandbox's network namespace and an nftables redirect in
// it). gateway.Manager serves the session's transparent egress and its
// resolver on the sockets.
type TransparentNet interface {
	// ListenTransparent routes the sandbox's traffic and opens the
	// sockets. The caller closes them.
	ListenTransparent(ctx context.Context) (Transparent, error)
}

// Transparent are the sockets of a sandbox's transparent egress.
type Transparent struct {
	// TCP accepts every redirected connection; the connection's original
	// destination (SO_ORIGINAL_DST) is where the client meant to go.
	TCP net.Listener
	// DNSUDP and DNSTCP are the sandbox's resolver.
	DNSUDP net.PacketConn
	DNSTCP net.Listener
	// Source is the sandbox's own address its redirected connections come
	// from; the resolver never answers with it.
	Source netip.Addr
}

// AgentListener is implemented by sandboxes whose processes can reach a
// Unix socket the gateway listens on (linuxns: in a directory of the
// sandbox's own /tmp that only the sandbox user may enter).
// gateway.Manager serves a session's SSH agent on it, the agent of its
// ssh-key secrets, whose keys stay in the gateway.
type AgentListener interface {
	// ListenAgent opens the listener; path is where the sandbox's
	// processes reach it (SSH_AUTH_SOCK). The caller closes ln.
	ListenAgent(ctx context.Context) (ln net.Listener, path string, err error)
}

// LoopbackDialer is implemented by sandboxes whose loopback the gateway
// can connect to, for SSH local port forwarding (ssh -L) into the sandbox
// (linuxns: 127.0.0.1 or ::1 inside the sandbox's network namespace, the
// sandbox's own loopback; workdir: the host's loopback, as workdir
// isolates no network). sshd dials with it for direct-tcpip channels.
type LoopbackDialer interface {
	// DialLoopback connects to port on the sandbox's loopback: network is
	// "tcp4" (127.0.0.1) or "tcp6" (::1). The caller closes the conn.
	DialLoopback(ctx context.Context, network string, port int) (net.Conn, error)
}

// Reattacher is implemented by drivers whose sandboxes can outlive the
// gateway process (linuxns, workdir), so that a restarted gateway finds
// them again. gateway.Manager uses it at restore.
type Reattacher interface {
	// List returns the ids of the sandboxes present on the host.
	List(ctx context.Context) ([]string, error)
	// Adopt re-attaches the live sandbox id; an error means it is gone or broken.
	Adopt(ctx context.Context, id string) (Sandbox, error)
	// Remove destroys whatever is left of sandbox id.
	Remove(ctx context.Context, id string) error
}

// Detacher is implemented by sandboxes that can be left behind when the
// gateway stops with --keep-sandboxes-on-exit, to be adopted by the next
// gateway process (linuxns, workdir). gateway.Manager uses it at shutdown.
type Detacher interface {
	// Detach releases the gateway's hold on the sandbox without destroying
	// what the next process adopts.
	Detach(ctx context.Context) error
}

// Halter is implemented by sandboxes whose processes can be ended at
// once, apart from the release of the rest (linuxns: its init is killed,
// and with it every process of its pid namespace; its mounts, cgroups,
// loop device and directory stay until Destroy). The gateway halts a
// deleted session's sandbox when it defers its release (Destroy) during a
// burst of creates: nothing of the session runs meanwhile.
type Halter interface {
	// Halt ends every process of the sandbox without waiting for them to
	// exit. Destroy must still be called; it waits for them.
	Halt()
}

// Rebinder is implemented by sandboxes that can take a session's Spec
// while they run (linuxns: memory, pids and CPUs are its cgroups', and
// TrustPEM goes into its trust store). The gateway's warm pool uses it: a
// sandbox made ahead of any session, from a Spec with its ID alone, gets
// the session's limits and trust at claim.
type Rebinder interface {
	// Rebind makes the running sandbox what spec (of the same ID) asks,
	// as if it had been created from it: spec.Limits (zero fields: the
	// driver's) and spec.TrustPEM. It fails with ErrNotLive, changing
	// nothing, for what cannot change live (an image, the size of /tmp or
	// of the workspace, a second TrustPEM).
	Rebind(ctx context.Context, spec Spec) error
}

// ErrNotLive is Rebinder.Rebind's answer for limits that only a new
// sandbox can have.
const ErrNotLive = Error("these limits cannot change in a running sandbox")

// ErrNotKept is Keeper.Reattach's answer when the sandbox keeps no
// process of that key (it was never kept, or a gateway already took its
// exit).
const ErrNotKept = Error("the sandbox keeps no such process")

// Keeper is implemented by sandboxes that keep processes started with
// Cmd.Keep across gateway restarts (linuxns: the init holds them, their
// pipes and their exit status). The REST data plane re-attaches its
// background processes with it after a restart.
type Keeper interface {
	// Keeps reports whether processes started now with Cmd.Keep are kept
	// (false for a sandbox whose init predates keeping).
	Keeps() bool
	// Reattach returns kept process key as it is now: output not yet read
	// waits in its streams, and Wait returns at once when it ended while
	// no gateway held it. Closing its Stdin sends EOF. ErrNotKept when
	// there is no such process.
	Reattach(ctx context.Context, key string) (Process, error)
}

// PTYKeeper is implemented by Keepers that also keep processes on a
// terminal (Cmd.PTY with Cmd.Keep; linuxns: the init holds a copy of the
// terminal's master, and Reattach hands one back). Without it a process
// on a terminal is not kept.
type PTYKeeper interface {
	KeepsPTY() bool
}

// Acker is implemented by kept processes (Cmd.Keep) whose sandbox holds
// their exit until it hears that the exit is safe with the gateway
// (linuxns: the init forgets the process then). Wait does not acknowledge:
// the caller calls Ack once Wait has returned and what it learnt is
// stored, so that a gateway that dies in between leaves the exit, and the
// output not yet stored, to the next one. Ack also releases what Wait left
// open for it; call it once Wait has returned, whether or not it is kept.
type Acker interface {
	Ack()
}

// Ack acknowledges p's exit when p is an Acker; nothing otherwise.
func Ack(p Process) {
	if a, ok := p.(Acker); ok {
		a.Ack()
	}
}

// Ender is implemented by sandboxes that can end on their own (linuxns:
// its init may die). gateway.Manager watches it to fail the session.
type Ender interface {
	// Done is closed when the sandbox has ended.
	Done() <-chan struct{}
}

// PIDer is implemented by processes that know their pid as the sandbox's
// processes see it (linuxns: the pid in the sandbox's pid namespace, as
// the init reports it; workdir: the host pid), and by the gateway's
// wrappers of them. The REST data plane shows it for background
// processes; 0 means unknown.
type PIDer interface {
	PID() int
}

// ErrStopped is returned by Start while the sandbox is stopped
// (Stopper): Resume it first.
const ErrStopped = Error("sandbox is stopped")

// ErrPaused is returned by Start and Reattach while the sandbox is
// paused (Pauser): its init is frozen and would never answer, so they
// fail at once instead of waiting on it. Unpause it first.
const ErrPaused = Error("sandbox is paused")

// Stopper is implemented by sandboxes that can be stopped and started
// again on the same files (linuxns, workdir). gateway.Manager.Stop stops
// one; the gateway's session wrapper resumes it before it starts the
// session's next process.
type Stopper interface {
	// Stop ends every process of the sandbox and releases its CPU and
	// memory (linuxns: its init, its namespaces and its cgroups), but
	// keeps its files: the workspace and, for an image, the root's
	// writable layer. Until Resume, Start fails with ErrStopped. Stopping
	// a stopped sandbox does nothing; Destroy works on a stopped one.
	Stop(ctx context.Context) error
	// Resume starts a stopped sandbox again: new processes (linuxns: a
	// new init, new namespaces and cgroups) on the same files. Resuming a
	// running sandbox does nothing.
	Resume(ctx context.Context) error
	// Stopped reports whether the sandbox is stopped. A sandbox adopted
	// after a gateway restart may be stopped already (linuxns keeps the
	// state on disk).
	Stopped() bool
}

// Pauser is implemented by sandboxes whose processes can be parked in
// place and go on later exactly where they were (linuxns: the cgroup
// freezer; docs/pause.md says why not a CRIU checkpoint yet).
// gateway.Manager.Pause pauses one; the gateway's session wrapper unpauses
// it before it starts the session's next process.
type Pauser interface {
	// Pause stops every process of the sandbox where it is, and keeps it
	// so, across a restart of the gateway too, until Unpause. Its memory
	// is kept as it is; the report says what the pause could not keep or
	// free. Pausing a paused sandbox does nothing.
	Pause(ctx context.Context) (PauseReport, error)
	// Unpause lets a paused sandbox's processes run again. Unpausing a
	// running sandbox does nothing.
	Unpause(ctx context.Context) error
	// Paused reports whether the sandbox is paused.
	Paused() bool
}

// Releaser is implemented by kept processes (Cmd.Keep; linuxns) that the
// gateway can let go of without ending them: its streams and control
// connection close, and the process runs on, its output waiting, for a
// Keeper.Reattach (as after a gateway restart). A pause by checkpoint
// needs it: a restore cannot hand the gateway's streams back.
type Releaser interface {
	Release()
}

// KeepLater is implemented by processes started without Cmd.Keep (an SSH
// exec; linuxns) that the sandbox can keep from now on, as if they had
// been started with it, without stopping them: a pause by checkpoint
// hands a command under way to the REST process API so (gateway.Handoff),
// instead of ending it. KeepAs asks the sandbox to keep the process under
// key, its standard input closed (EOF), and lets go of it as Releaser
// does: its streams close, Wait returns ErrHandedOff, and a
// Keeper.Reattach by key takes it back (its output, and its exit, waiting
// till then). It fails with ErrExited when the process ended first (Wait
// returns its exit as usual), and changes nothing on any other error.
// Wait must be under way.
type KeepLater interface {
	KeepAs(ctx context.Context, key string) error
}

// ErrHandedOff is Wait's answer for a process that the gateway let go of
// to be kept by the sandbox (KeepLater): it did not end.
const ErrHandedOff = Error("the process was handed over to be kept: it runs on")

// ErrExited is KeepLater.KeepAs's answer for a process that ended first.
const ErrExited = Error("the process has exited")

// CheckpointPauser is implemented by sandboxes whose next Pause would be
// a checkpoint (linuxns with Config.Checkpoint), if nothing of the
// gateway's holds their processes: the gateway lets go of its kept
// processes (Releaser) before such a pause.
type CheckpointPauser interface {
	CanCheckpointPause() bool
}

// PauseReport is what a Pause did.
type PauseReport struct {
	// Method names how the processes were parked: "checkpoint" (dumped
	// to disk, ended; linuxns) or "freeze".
	Method string
	// ResidentBytes is the memory the paused sandbox still holds, as its
	// cgroup counts it (-1: unknown).
	ResidentBytes int64
	// NotKept lists what the pause could not keep, one line each.
	NotKept []string
}

// Checkpointer is implemented by sandboxes that can be copied while they
// run, processes and memory included (linuxns with Config.Checkpoint,
// through CRIU): one Checkpoint, then a Restore per copy. The sandbox
// keeps running.
type Checkpointer interface {
	Checkpoint(ctx context.Context) (Checkpoint, error)
}

// Checkpoint is a running sandbox's processes, memory and workspace as
// they were at one instant.
type Checkpoint interface {
	// Restore makes a new sandbox from it, as Driver.Create does from
	// spec (its ID and Limits; the image and trust store are the
	// checkpoint's).
	Restore(ctx context.Context, spec Spec) (Sandbox, error)
	// Close deletes the checkpoint's images.
	Close() error
}

// ErrNoCheckpoint says a sandbox cannot be checkpointed: its driver or
// host cannot (no CRIU, a sandbox not built for it, an image root).
var ErrNoCheckpoint = errors.New("this sandbox cannot be checkpointed")

// Freezer is implemented by sandboxes whose processes can be frozen at
// once (linuxns: the cgroup freezer, v1 or v2), so that a snapshot of the
// workspace sees no half-done write. Freeze returns once every process is
// frozen; thaw lets them run again. The workspace package uses it.
type Freezer interface {
	Freeze(ctx context.Context) (thaw func() error, err error)
}

// WorkspaceHomer is implemented by sandboxes whose /workspace is a
// directory below Workdir (a linuxns sandbox on an image keeps its root's
// writable layer beside it): the workspace package saves and restores
// that directory only.
type WorkspaceHomer interface {
	WorkspaceHome() string
}
