//go:build linux

package linuxns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// keepAsWait bounds how long KeepAs waits for the init's answer.
const keepAsWait = 5 * time.Second

// KeepAs implements sandbox.KeepLater for a command started without
// sandbox.Cmd.Keep (an SSH exec): the init is asked ("keep", with the
// gateway's ends of its output) to keep it under key, its stdin closed,
// and the gateway lets go of it as Release does for a kept one: Wait
// returns sandbox.ErrHandedOff, the streams close (a read under way
// returns what it read; what the command writes from then on waits in
// its pipes, or its terminal, for Keeper.Reattach), and Kill and Signal
// do nothing. Its output's descriptors are the gateway's own, which the
// init gets copies of. It fails, changing nothing, with
// sandbox.ErrExited when the command ended first (Wait returns its exit),
// and with another error when the init cannot keep it (an init that
// predates it, or one that keeps ctl.MaxKept commands already).
func (p *initProcess) KeepAs(ctx context.Context, key string) error {
	if !p.canKeepLater {
		return fmt.Errorf("the sandbox's init predates keeping a running command: %w", errors.ErrUnsupported)
	}
	if p.kept || p.handedOff.Load() {
		return errors.New("the command is kept already")
	}
	if !p.waiting.Load() || p.keepReply == nil {
		return errors.New("the command's end is not yet waited for")
	}
	p.kmu.Lock()
	if p.keeping {
		p.kmu.Unlock()
		return errors.New("a keep is under way")
	}
	p.keeping = true
	select {
	case <-p.keepReply: // an earlier keep's extra answer
	default:
	}
	p.kmu.Unlock()
	// done ends the wait for the init's answer; it reports whether Wait
	// took a "kept" meanwhile: the init keeps the command, and Wait
	// returned sandbox.ErrHandedOff, so it is handed over whatever else
	// KeepAs saw.
	done := func() bool {
		p.kmu.Lock()
		defer p.kmu.Unlock()
		p.keeping = false
		return p.handedOff.Load()
	}
	if err := p.sendKeep(key); err != nil {
		done()
		select {
		case <-p.waitDone:
			return sandbox.ErrExited
		default:
		}
		return fmt.Errorf("keep: %w", err)
	}
	wait := keepAsWait
	if p.keepWait > 0 {
		wait = p.keepWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case rep := <-p.keepReply:
		if rep.Op != "kept" {
			select {
			case <-p.waitDone:
			case <-time.After(100 * time.Millisecond):
			}
			if done() {
				break // it said both: it keeps it, as Wait took it
			}
			select {
			case <-p.waitDone:
				return sandbox.ErrExited
			default:
			}
			return fmt.Errorf("keep: %w", rep.Err())
		}
		done()
	case <-p.waitDone:
		// Its exit came first (the init refuses, or its answer is not
		// read): Wait returned it; or Wait took the "kept".
		if !done() {
			return sandbox.ErrExited
		}
	case <-ctx.Done():
		if !done() {
			p.Kill() // not left kept with no gateway's record of it
			return ctx.Err()
		}
	case <-t.C:
		if !done() {
			// Not left kept with no gateway's record of it: a "kept"
			// that comes after this is answered "ack" at its exit (Wait).
			p.Kill()
			return errors.New("keep: the init did not answer")
		}
	}
	// Kept: the gateway's ends close (stdin's too: EOF), and so does the
	// connection, which the init lets go of as a gateway's that went away.
	p.shrinkPipes()
	p.closeStdio()
	p.conn.Close()
	return nil
}

// sendKeep sends "keep" with the gateway's ends of the command's output
// (its pipes' read ends, or its terminal's master). The descriptors are
// held (not closed, their numbers not reused) until the frame is sent.
func (p *initProcess) sendKeep(key string) error {
	var files []*os.File
	if p.pty != nil {
		files = []*os.File{p.pty}
	} else {
		for _, r := range []any{p.stdout, p.stderr} {
			f, ok := r.(*os.File)
			if !ok {
				return errors.New("the command's output is not a pipe")
			}
			files = append(files, f)
		}
	}
	var send func(fds []int) error
	send = func(fds []int) error {
		if len(fds) == len(files) {
			p.wmu.Lock()
			defer p.wmu.Unlock()
			return ctl.WriteFrame(p.conn, ctl.Request{Op: "keep", Keep: key}, fds...)
		}
		rc, err := files[len(fds)].SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = send(append(fds, int(fd))) }); err != nil {
			return err // closed already
		}
		return serr
	}
	return send(nil)
}
