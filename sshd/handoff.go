package sshd

import (
	"fmt"
	"io"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// A pause by checkpoint ends every SSH connection, but an exec's command
// under way is not ended with it, as it would be when a connection drops
// (SIGHUP): the pause hands it to the REST process API
// (gateway.HandoffEntry), where it runs on as a background process, kept
// across the checkpoint, its stdin closed, its output from then on in
// that process's output. The channel then ends with a line on its stderr
// that names the process, and no exit status (the command did not end:
// OpenSSH's client exits 255, as for a connection lost). A shell (with
// or without a terminal) and an SFTP server end as before: an
// interactive shell is the user's, whose connection went (docs/pause.md).

// handoff is a channel's exec offered to a pause (offerHandoff).
type handoff struct {
	remove func()
	// done is closed once the pause handed the command over
	// (c.handedID); written once the channel told its client.
	done, written chan struct{}
}

// handoffWait bounds how long an exec whose process was handed over
// waits for the pause to name it.
const handoffWait = 10 * time.Second

// offerHandoff registers proc, c's exec, with its session for a pause to
// hand over; nil when the session has ended.
func (c *channel) offerHandoff(proc sandbox.Process) *handoff {
	ho := &handoff{done: make(chan struct{}), written: make(chan struct{})}
	c.mu.Lock()
	command, pty := c.command, c.interactive
	c.mu.Unlock()
	e := &gateway.HandoffEntry{Command: command, Source: "ssh", StartedAt: time.Now(), PTY: pty, Process: proc,
		Begin: func() {
			c.mu.Lock()
			c.handing = true
			c.mu.Unlock()
		},
		Done: func(id string) {
			c.mu.Lock()
			c.handedID, c.handing = id, id != ""
			c.mu.Unlock()
			if id != "" {
				close(ho.done) // at most once: Done has an id at most once
			}
		},
	}
	remove, ok := c.sess.AddHandoff(e)
	if !ok {
		return nil
	}
	ho.remove = remove
	return ho
}

// waitWritten, for the pause's notice, reports whether c's command was
// handed over (ho nil: it was not offered), then waits (at most
// gateway.PauseNoticeWait) for the channel to have said so.
func (ho *handoff) waitWritten(c *channel) bool {
	if ho == nil {
		return false
	}
	c.mu.Lock()
	handing := c.handing
	c.mu.Unlock()
	if !handing {
		return false
	}
	select {
	case <-ho.written:
	case <-time.After(gateway.PauseNoticeWait):
	}
	return true
}

// endHandedOff ends c's channel once its exec's process was handed over
// (its Wait answered sandbox.ErrHandedOff): the output read before the
// hand-over is forwarded, its client is told which process it is now,
// and the channel closes, with no exit status.
func (c *channel) endHandedOff(ho *handoff, drained <-chan struct{}, stdout, stderr *procio.Output, began time.Time) {
	select {
	case <-ho.done:
	case <-time.After(handoffWait):
	}
	c.mu.Lock()
	c.exited = true
	id, pty := c.handedID, c.interactive
	c.mu.Unlock()
	// Its streams were closed by the hand-over: the copiers end with
	// what they read.
	procio.Drain(drained, c.srv.cfg.OutputGrace, stdout, stderr)
	msg := "sandgate: the session is being paused: this connection ends, but this command goes on in the sandbox"
	if id != "" {
		msg = fmt.Sprintf("sandgate: the session is being paused: this connection ends, but this command goes on in the sandbox "+
			"as background process %s (its input closed; its output from now on: GET /v1/sessions/%s/processes/%s/output); "+
			"the next connection or call resumes the session", id, c.sess.ID, id)
	}
	if pty {
		msg = "\r\n" + msg + "\r\n"
	} else {
		msg = "\n" + msg + "\n"
	}
	_, _ = io.WriteString(c.ch.Stderr(), msg)
	close(ho.written)
	c.notices.Wait()
	c.answering.Lock()
	c.answering.Unlock()
	_ = c.ch.CloseWrite()
	_ = c.ch.Close()
	c.srv.cfg.Log.InfoContext(c.ctx, "exec_handed_off", "session", c.sess.ID, "process", id,
		"duration_ms", time.Since(began).Milliseconds())
}
