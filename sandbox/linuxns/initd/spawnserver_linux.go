//go:build linux

package initd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// SpawnMain is `sandgate-init sandbox-spawner`, the spawn server
// (ctl.SpawnRequest says why it exists): it reads requests on fd 3 until
// the driver closes it, and starts each init in a goroutine of its own.
// Its children are reaped by the kernel (SIGCHLD ignored): the driver
// watches each init through the pidfd it is sent.
func SpawnMain(args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "sandbox-spawner: takes no arguments; the gateway starts it")
		return 2
	}
	// The main goroutine keeps the main thread: a spawn's thread, which
	// joins a sandbox's v1 cgroups, must end with its goroutine, and the
	// Go runtime never ends the main thread (it would stay in them).
	runtime.LockOSThread()
	signal.Ignore(syscall.SIGCHLD)
	closeInherited(ctl.SpawnConnFD, ctl.SpawnInitFD)
	unix.CloseOnExec(ctl.SpawnInitFD)
	f := os.NewFile(ctl.SpawnConnFD, "gateway")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-spawner: gateway connection:", err)
		return 2
	}
	c, ok := fc.(*net.UnixConn)
	if !ok {
		fmt.Fprintln(os.Stderr, "sandbox-spawner: fd 3 is not a unix socket")
		return 2
	}
	defer c.Close()
	for {
		var req ctl.SpawnRequest
		fds, err := ctl.ReadFrame(c, &req)
		if err != nil {
			return 0 // the driver went away
		}
		go serveSpawn(&req, fds)
	}
}

// serveSpawn starts the init req asks for and answers on its reply
// socket. It closes fds.
func serveSpawn(req *ctl.SpawnRequest, fds []int) {
	defer procio.CloseFDs(fds)
	reply, initSock, logFD, cgroupFD := -1, -1, -1, -1
	var tasks []int
	if len(fds) != len(req.FDs) {
		fmt.Fprintf(os.Stderr, "sandbox-spawner: got %d descriptors for %d names\n", len(fds), len(req.FDs))
		return
	}
	var files []*os.File // the descriptors an *os.File owns: closed through it
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	own := func(i int, name string) (int, *os.File) {
		fd := fds[i]
		f := os.NewFile(uintptr(fd), name)
		fds[i] = -1
		files = append(files, f)
		return fd, f
	}
	var initFile, logFile, replyFile *os.File
	for i, name := range req.FDs {
		switch name {
		case "reply":
			reply, replyFile = own(i, "reply")
		case "init":
			initSock, initFile = own(i, "init")
		case "log":
			logFD, logFile = own(i, "init.log")
		case "cgroup":
			cgroupFD = fds[i]
		case "tasks":
			tasks = append(tasks, fds[i])
		}
	}
	if reply < 0 {
		fmt.Fprintln(os.Stderr, "sandbox-spawner: a request without a reply socket")
		return
	}
	rc, err := net.FileConn(replyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-spawner: reply socket:", err)
		return
	}
	defer rc.Close()
	answer := func(r ctl.SpawnReply, fds ...int) {
		if err := ctl.WriteFrame(rc.(*net.UnixConn), r, fds...); err != nil {
			fmt.Fprintln(os.Stderr, "sandbox-spawner: reply:", err)
		}
	}
	if initSock < 0 || logFD < 0 {
		answer(ctl.SpawnReply{Error: "incomplete spawn request"})
		return
	}
	pid, pidfd, err := spawnInit(req, initFile, logFile, cgroupFD, tasks)
	if err != nil {
		answer(ctl.SpawnReply{Error: err.Error()})
		return
	}
	answer(ctl.SpawnReply{Pid: pid}, pidfd)
	unix.Close(pidfd)
}

// spawnInit starts the init as the driver's startInit does, and returns
// its pid and a pidfd (from the clone itself: the pid cannot be reused
// before the driver holds it).
func spawnInit(req *ctl.SpawnRequest, initSock, log *os.File, cgroupFD int, tasks []int) (int, int, error) {
	if req.IDs <= 0 || req.UIDBase <= 0 || req.Cloneflags&unix.CLONE_NEWUSER == 0 {
		return 0, 0, errors.New("incomplete spawn request")
	}
	pidfd := -1
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: req.UIDBase, Size: req.IDs}}
	cmd := &exec.Cmd{
		Path:       "/proc/self/fd/" + strconv.Itoa(ctl.SpawnInitFD),
		Args:       []string{"sandgate", "sandbox-init"},
		Env:        req.Env,
		Dir:        "/",
		ExtraFiles: []*os.File{initSock}, // fd 3
		Stderr:     log,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:                 req.Cloneflags,
			UidMappings:                ids,
			GidMappings:                ids,
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
			Setsid:                     true,
			PidFD:                      &pidfd,
		},
	}
	if cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgroupFD
	}
	errc := make(chan error, 1)
	go func() {
		if len(tasks) > 0 {
			// The init is forked from a thread that joined its v1
			// cgroups; never unlocked, the thread ends with this
			// goroutine instead of going back to the server's cgroups.
			runtime.LockOSThread()
			for _, fd := range tasks {
				// "0": the writing thread alone, this one.
				if _, err := unix.Write(fd, []byte("0")); err != nil {
					errc <- fmt.Errorf("join the sandbox's cgroup: %w", err)
					return
				}
			}
		}
		errc <- cmd.Start()
	}()
	if err := <-errc; err != nil {
		return 0, 0, fmt.Errorf("start sandbox init: %w", err)
	}
	// The kernel reaps it (SIGCHLD ignored); os/exec's own pidfd goes.
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	if pidfd < 0 {
		// A kernel without CLONE_PIDFD (before 5.2, which the driver
		// refuses anyway): the driver forks its inits itself.
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, 0, errors.New("no pidfd from the clone")
	}
	return pid, pidfd, nil
}
