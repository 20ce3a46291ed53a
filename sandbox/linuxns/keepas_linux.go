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
	if p.kept || p.handedOff.Load() {
		return errors.New("the command is kept already")
	}
	if !p.waiting.Load() || p.keepReply == nil {
		return errors.New("the command's end is not yet waited for")
	}
	var fds []int
	if p.pty != nil {
		fds = []int{rawFD(p.pty)}
	} else {
		for _, r := range []any{p.stdout, p.stderr} {
			f, ok := r.(*os.File)
			if !ok {
				return errors.New("the command's output is not a pipe")
			}
			fds = append(fds, rawFD(f))
		}
	}
	if !p.keeping.CompareAndSwap(false, true) {
		return errors.New("a keep is under way")
	}
	defer p.keeping.Store(false)
	p.wmu.Lock()
	err := ctl.WriteFrame(p.conn, ctl.Request{Op: "keep", Keep: key}, fds...)
	p.wmu.Unlock()
	if err != nil {
		select {
		case <-p.waitDone:
			return sandbox.ErrExited
		default:
		}
		return fmt.Errorf("keep: %w", err)
	}
	t := time.NewTimer(keepAsWait)
	defer t.Stop()
	select {
	case rep := <-p.keepReply:
		if rep.Op != "kept" {
			select {
			case <-p.waitDone:
				return sandbox.ErrExited
			case <-time.After(100 * time.Millisecond):
			}
			return fmt.Errorf("keep: %w", rep.Err())
		}
	case <-p.waitDone:
		// Its exit came first (the init refuses, or its answer is not
		// read): Wait returned it.
		if p.handedOff.Load() {
			break
		}
		return sandbox.ErrExited
	case <-ctx.Done():
		p.Kill() // not left kept with no gateway's record of it
		return ctx.Err()
	case <-t.C:
		p.Kill()
		return errors.New("keep: the init did not answer")
	}
	// Kept: the gateway's ends close (stdin's too: EOF), and so does the
	// connection, which the init lets go of as a gateway's that went away.
	p.closeStdio()
	p.conn.Close()
	return nil
}
