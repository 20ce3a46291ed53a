package workdir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// hostProcess is a process started with os/exec in its own process group
// (pipes) or session (PTY). Drivers that start processes from the gateway
// process share it.
type hostProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr io.ReadCloser
	pty    *os.File
	// tag is in the environment of every process of the command's tree,
	// unless one clears its own: how Kill finds the ones that left the group.
	tag string
	// directPWD is the command's directory when it runs without the
	// shell (sandbox.Cmd.Direct), "" when the shell runs it.
	directPWD string
	done      chan struct{}
	once      sync.Once
}

// startHost starts c in a new process group, or a new session with c's
// controlling terminal set to a new PTY when p is non-nil. c must not have
// Stdin, Stdout or Stderr set.
func startHost(c *exec.Cmd, p *sandbox.PTY) (*hostProcess, error) {
	hp := &hostProcess{cmd: c, done: make(chan struct{})}
	if p != nil {
		if c.SysProcAttr == nil {
			c.SysProcAttr = &syscall.SysProcAttr{}
		}
		c.SysProcAttr.Setsid = true
		c.SysProcAttr.Setctty = true
		w := p.Window.OrDefault()
		master, tty, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("start on pty: %w", err)
		}
		defer tty.Close()
		if err := pty.Setsize(master, &pty.Winsize{Cols: w.Cols, Rows: w.Rows}); err != nil {
			master.Close()
			return nil, fmt.Errorf("start on pty: %w", err)
		}
		c.Env = sandbox.WithTTY(c.Env, tty.Name())
		c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
		if err := c.Start(); err != nil {
			master.Close()
			return nil, fmt.Errorf("start on pty: %w", err)
		}
		hp.pty = master
		hp.stdin = procio.NopWriteCloser{Writer: master}
		hp.stdout = master
		return hp, nil
	}
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Setpgid = true
	var parentEnds, childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	for i := 0; i < 3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(parentEnds)
			closeAll(childEnds)
			return nil, fmt.Errorf("pipe: %w", err)
		}
		if i < 2 {
			procio.GrowPipe(r)
		}
		if i == 0 {
			childEnds, parentEnds = append(childEnds, r), append(parentEnds, w)
		} else {
			childEnds, parentEnds = append(childEnds, w), append(parentEnds, r)
		}
	}
	c.Stdin, c.Stdout, c.Stderr = childEnds[0], childEnds[1], childEnds[2]
	err := c.Start()
	closeAll(childEnds)
	if err != nil {
		closeAll(parentEnds)
		return nil, fmt.Errorf("start: %w", err)
	}
	hp.stdin, hp.stdout, hp.stderr = parentEnds[0], parentEnds[1], parentEnds[2]
	return hp, nil
}

// DirectPWD implements sandbox.DirectProcess.
func (p *hostProcess) DirectPWD() (string, bool) { return p.directPWD, p.directPWD != "" }

// PID is the process's host pid, which is how the workdir sandbox's
// processes see it (sandbox.PIDer).
func (p *hostProcess) PID() int { return p.cmd.Process.Pid }

func (p *hostProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *hostProcess) Stdout() io.ReadCloser { return p.stdout }
func (p *hostProcess) Stderr() io.ReadCloser {
	if p.stderr == nil {
		return nil
	}
	return p.stderr
}

func (p *hostProcess) Resize(w sandbox.Window) error {
	if p.pty == nil {
		return errors.New("no pty")
	}
	return procio.SetWinsize(p.pty, w)
}

func (p *hostProcess) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal process group: %w", err)
	}
	return nil
}

func (p *hostProcess) Wait() (sandbox.Exit, error) {
	err := p.cmd.Wait()
	close(p.done)
	if p.stdin != nil {
		p.stdin.Close()
	}
	if err != nil && p.cmd.ProcessState == nil {
		return sandbox.Exit{}, fmt.Errorf("wait: %w", err)
	}
	return sandbox.ExitFromState(p.cmd.ProcessState), nil
}

func (p *hostProcess) Kill() {
	p.once.Do(func() {
		select {
		case <-p.done:
			// It ended on its own: what it left running was detached
			// on purpose (nohup job &) and stays.
			return
		default:
		}
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGHUP)
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		time.AfterFunc(sandbox.KillGrace, func() {
			select {
			case <-p.done:
			default:
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
			if p.tag != "" {
				killAllTagged(p.tag)
			}
		})
	})
}
