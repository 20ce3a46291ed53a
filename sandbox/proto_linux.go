//go:build linux

package sandbox

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// The gateway and a sandbox's init talk over unix stream sockets in frames:
// a 4-byte big-endian length, then that many bytes of JSON. File
// descriptors ride as SCM_RIGHTS on the sendmsg that carries a frame's
// header, so the reader receives them with the header's first byte.
//
// Set-up (the socketpair the init is started with, fd 3 in the init):
//
//	gateway -> init  initSpec + fds named by initSpec.FDs
//	init -> gateway  initReady
//
// One command (a new connection to the init's control socket per command):
//
//	gateway -> init  ctlRequest{Op: "exec"} + stdin, stdout, stderr (pipes; none with a PTY)
//	init -> gateway  ctlReply{Op: "started"} (+ the PTY master) or {Op: "error"}
//	gateway -> init  ctlRequest{Op: "signal"} / {Op: "kill"}, any number of times
//	init -> gateway  ctlReply{Op: "exit"} once the command's process has exited
//
// The gateway closing the connection before the exit reply means the
// command's client is gone: the init ends the command's process group
// (SIGHUP, then SIGKILL after a grace), as Process.Kill does.

const (
	maxFrame    = 4 << 20
	maxFrameFDs = 16
	// ctlProtocol versions the messages below; it is kept in each
	// sandbox's state. Change it only with a way to talk to older inits.
	ctlProtocol = 1
)

// initSpec tells a new init how to build its sandbox.
type initSpec struct {
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
	// FDs names the descriptors sent with the spec, in order:
	// "listener" (the control socket, listening), "workspace" (a detached
	// mount to attach at /workspace), "tasks" (the open cgroup v1 tasks
	// files of the cgroups the commands run in), "socket-file" (an O_PATH descriptor of the control
	// socket's file: once it is unlinked, no gateway can reach the init,
	// which then ends the sandbox).
	FDs []string `json:"fds"`
}

// initReady is the init's answer to initSpec.
type initReady struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// ctlRequest is a message from the gateway on a control connection.
type ctlRequest struct {
	Op        string   `json:"op"` // exec, signal, kill
	Command   string   `json:"command,omitempty"`
	Subsystem string   `json:"subsystem,omitempty"`
	Env       []string `json:"env,omitempty"`
	PTY       *PTY     `json:"pty,omitempty"`
	Signal    int      `json:"signal,omitempty"`
}

// ctlReply is a message from the init on a control connection.
type ctlReply struct {
	Op    string `json:"op"` // started, error, exit
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
	Exit  *Exit  `json:"exit,omitempty"`
}

// writeFrame sends v as one frame with fds attached.
func writeFrame(c *net.UnixConn, v any, fds ...int) error {
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

// readFrame reads one frame into v and returns the descriptors that came
// with it (close-on-exec). On error, no descriptor is left open.
func readFrame(c *net.UnixConn, v any) (fds []int, err error) {
	defer func() {
		if err != nil {
			closeFDs(fds)
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

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
