//go:build linux

package initd

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// serveArg starts the second stage of a checkpointable init (reexec).
const serveArg = "--serve"

// selfPath is where a checkpointable sandbox's root binds the init's
// binary (ctl.Spec.InitPath).
const selfPath = "/.sandgate-init"

// serveState is what the first stage of a checkpointable init hands the
// second across its re-exec.
type serveState struct {
	// Conn is the gateway's connection, which the second stage answers
	// Ready on (Steps and Started are the first stage's, for it).
	Conn      int        `json:"conn"`
	Steps     []ctl.Step `json:"steps,omitempty"`
	Started   int64      `json:"startedUs,omitempty"`
	Listener  int        `json:"listener"`
	Tasks     []int      `json:"tasks"`
	NoSeccomp bool       `json:"noSeccomp,omitempty"`
	Seccomp   []byte     `json:"seccomp,omitempty"`
	Env       []string   `json:"env,omitempty"`
	WorkDir   string     `json:"workDir,omitempty"`
	SockCheck int64      `json:"sockCheckMillis"`
}

// reexec replaces a checkpointable init, its sandbox built, by its binary
// as bound in the sandbox (selfPath): a checkpoint then finds the init's
// executable among the sandbox's mounts, where the gateway's memfd is
// not. The listener and the tasks files cross the exec; the second stage
// (serveMain) starts the spawner and serves. It returns only on failure.
func reexec(in *initd, spec *ctl.Spec, c *net.UnixConn, tm *stepTimer) int {
	st := serveState{Tasks: in.tasks, NoSeccomp: spec.NoSeccomp, Seccomp: spec.Seccomp,
		Env: in.env, WorkDir: in.workDir, SockCheck: in.sockCheck.Milliseconds(),
		Steps: tm.steps, Started: tm.start.UnixMicro()}
	fail := func(err error) int {
		_ = ctl.WriteFrame(c, ctl.Ready{Error: "re-exec: " + err.Error()})
		fmt.Fprintln(os.Stderr, "sandbox-init: re-exec:", err)
		return 1
	}
	ln, err := unix.FcntlInt(uintptr(in.ln), unix.F_DUPFD, 3)
	if err != nil {
		return fail(err)
	}
	st.Listener = ln
	rc, err := c.SyscallConn()
	if err != nil {
		return fail(err)
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { st.Conn, cerr = unix.FcntlInt(fd, unix.F_DUPFD, 3) }); err != nil {
		return fail(err)
	}
	if cerr != nil {
		return fail(cerr)
	}
	if err := unix.SetNonblock(st.Conn, false); err != nil {
		return fail(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return 1
	}
	path := selfPath
	if spec.InitPath == "" {
		path = "/proc/self/exe"
	}
	err = syscall.Exec(path, []string{"sandgate", "sandbox-init", serveArg, string(b)}, os.Environ())
	return fail(err)
}

// serveMain is the second stage of a checkpointable init (reexec).
func serveMain(arg string) int {
	var st serveState
	if err := json.Unmarshal([]byte(arg), &st); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-init:", err)
		return 2
	}
	for _, fd := range append([]int{st.Listener, st.Conn}, st.Tasks...) {
		unix.CloseOnExec(fd)
	}
	f := os.NewFile(uintptr(st.Conn), "gateway")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-init: gateway connection:", err)
		return 2
	}
	c := fc.(*net.UnixConn)
	defer c.Close()
	sp, err := startSpawner(st.Tasks, spawnFilter{on: !st.NoSeccomp, program: st.Seccomp, checkpoint: true})
	procio.CloseFDs(st.Tasks)
	if err != nil {
		_ = ctl.WriteFrame(c, ctl.Ready{Error: err.Error()})
		fmt.Fprintln(os.Stderr, "sandbox-init:", err)
		return 1
	}
	if err := ctl.WriteFrame(c, ctl.Ready{OK: true, Steps: st.Steps, StartedMicros: st.Started}); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-init: report ready:", err)
		return 1
	}
	c.Close()
	in := &initd{checkpoint: true, sp: sp, shell: sandbox.FindShell(), waiters: map[int]*child{}, jobs: map[string]*child{},
		sockFile: -1, ln: st.Listener, forked: make(chan struct{}, 1), env: st.Env, workDir: st.WorkDir,
		sockCheck: max(time.Duration(st.SockCheck)*time.Millisecond, 100*time.Millisecond)}
	trimMemory()
	in.serve()
	return 1
}
