package sandbox

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
	"golang.org/x/sys/unix"
)

// killGrace is how long Kill waits after SIGHUP before SIGKILL.
const killGrace = 2 * time.Second

// hostProcess is a process started with os/exec in its own process group
// (pipes) or session (PTY). Drivers that start processes from the gateway
// process share it.
type hostProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr io.ReadCloser
	pty    *os.File
	done   chan struct{}
	once   sync.Once
}

// startHost starts c in a new process group, or a new session with c's
// controlling terminal set to a new PTY when p is non-nil. c must not have
// Stdin, Stdout or Stderr set.
func startHost(c *exec.Cmd, p *PTY) (*hostProcess, error) {
	hp := &hostProcess{cmd: c, done: make(chan struct{})}
	if p != nil {
		if c.SysProcAttr == nil {
			c.SysProcAttr = &syscall.SysProcAttr{}
		}
		c.SysProcAttr.Setsid = true
		c.SysProcAttr.Setctty = true
		master, err := pty.StartWithAttrs(c, winsize(p.Window), c.SysProcAttr)
		if err != nil {
			return nil, fmt.Errorf("start on pty: %w", err)
		}
		hp.pty = master
		hp.stdin = nopWriteCloser{master}
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
			growPipe(r)
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

// setWinsize resizes the terminal f. It goes through SyscallConn so that a
// concurrent Close of f is safe.
func setWinsize(f *os.File, w Window) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	ws := winsize(w)
	var ioctlErr error
	err = rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	return nil
}

func winsize(w Window) *pty.Winsize {
	if w.Cols == 0 || w.Rows == 0 {
		w = Window{Cols: 80, Rows: 24}
	}
	return &pty.Winsize{Cols: w.Cols, Rows: w.Rows}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func (p *hostProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *hostProcess) Stdout() io.ReadCloser { return p.stdout }
func (p *hostProcess) Stderr() io.ReadCloser {
	if p.stderr == nil {
		return nil
	}
	return p.stderr
}

func (p *hostProcess) Resize(w Window) error {
	if p.pty == nil {
		return errors.New("no pty")
	}
	return setWinsize(p.pty, w)
}

func (p *hostProcess) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal process group: %w", err)
	}
	return nil
}

func (p *hostProcess) Wait() (Exit, error) {
	err := p.cmd.Wait()
	close(p.done)
	if p.stdin != nil {
		p.stdin.Close()
	}
	if err != nil && p.cmd.ProcessState == nil {
		return Exit{}, fmt.Errorf("wait: %w", err)
	}
	return exitFromState(p.cmd.ProcessState), nil
}

func (p *hostProcess) Kill() {
	p.once.Do(func() {
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGHUP)
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		time.AfterFunc(killGrace, func() {
			select {
			case <-p.done:
			default:
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		})
	})
}
