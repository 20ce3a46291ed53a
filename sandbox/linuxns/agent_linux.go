package linuxns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// agentSocket is the socket's name in its directory (AgentListener).
const agentSocket = "agent.sock"

// ListenAgent implements sandbox.AgentListener: a Unix socket in a new
// directory of the sandbox's /tmp (/tmp/sandgate-agent.<random>, mode
// 0700), both owned by the sandbox user, so only the sandbox user
// reaches it. The gateway creates them through the init's root
// (/proc/<pid>/root), resolved beneath it without following a symlink
// the sandbox could have planted, and as the sandbox user (fsuid): the
// sandbox's /tmp belongs to its user namespace, where the gateway's own
// uid has no mapping.
func (s *linuxSandbox) ListenAgent(ctx context.Context) (net.Listener, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	s.mu.Lock()
	done, pidfd, pid, stopped, uidBase := s.initDone, s.pidfd, s.st.Pid, s.st.Stopped, s.st.UIDBase
	s.mu.Unlock()
	if stopped {
		return nil, "", sandbox.ErrStopped
	}
	select {
	case <-done:
		return nil, "", sandbox.ErrClosed
	default:
	}
	if pidfd == nil {
		return nil, "", sandbox.ErrClosed
	}
	root, err := os.OpenFile(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", fmt.Errorf("sandbox root: %w", err)
	}
	defer root.Close()
	// The init was not reaped when its root was opened, so its pid was
	// not another process's then: the root is the sandbox's, not the
	// host's of a process that took the pid of an init gone since.
	alive := false
	if rc, err := pidfd.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { alive = unix.PidfdSendSignal(int(fd), 0, nil, 0) == nil })
	}
	if !alive {
		return nil, "", sandbox.ErrClosed
	}
	tmpFD, err := unix.Openat2(int(root.Fd()), "tmp", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, "", fmt.Errorf("sandbox /tmp: %w", err)
	}
	defer unix.Close(tmpFD)
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, "", err
	}
	dir := "sandgate-agent." + hex.EncodeToString(rnd[:])
	type result struct {
		ln  *net.UnixListener
		err error
	}
	res := make(chan result, 1)
	go func() {
		// fsuid and fsgid are the thread's own: this thread creates as
		// the sandbox user, then takes the gateway's back (or, if it
		// cannot, stays locked and exits with the goroutine).
		runtime.LockOSThread()
		uid, gid := uidBase+ctl.SandboxUID, uidBase+ctl.SandboxGID
		prevGID, _ := unix.SetfsgidRetGid(gid)
		prevUID, _ := unix.SetfsuidRetUid(uid)
		ln, err := func() (*net.UnixListener, error) {
			// setfsuid(-1) changes nothing and answers the current one.
			if cur, _ := unix.SetfsuidRetUid(-1); cur != uid {
				return nil, fmt.Errorf("agent socket: could not create as the sandbox user")
			}
			if err := unix.Mkdirat(tmpFD, dir, 0o700); err != nil {
				return nil, fmt.Errorf("agent directory in the sandbox's /tmp: %w", err)
			}
			// The socket's path through the directory's descriptor: the
			// name is created as it is, never through a symlink.
			dirFD, err := unix.Openat2(tmpFD, dir, &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
			})
			if err != nil {
				return nil, fmt.Errorf("agent directory in the sandbox's /tmp: %w", err)
			}
			defer unix.Close(dirFD)
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: fmt.Sprintf("/proc/self/fd/%d/%s", dirFD, agentSocket)})
			if err != nil {
				return nil, fmt.Errorf("agent socket in the sandbox: %w", err)
			}
			// The path named a descriptor of this moment: Close must not
			// unlink through it (the sandbox's /tmp goes with the sandbox).
			ln.SetUnlinkOnClose(false)
			return ln, nil
		}()
		unix.SetfsuidRetUid(prevUID)
		unix.SetfsgidRetGid(prevGID)
		if cur, _ := unix.SetfsuidRetUid(-1); cur != prevUID {
			if ln != nil {
				ln.Close()
			}
			res <- result{err: fmt.Errorf("agent socket: could not take back the gateway's fsuid")}
			return
		}
		runtime.UnlockOSThread()
		res <- result{ln, err}
	}()
	// Waited for whatever ctx says (a few system calls): tmpFD and root
	// are the goroutine's until then, and closed only after; closed
	// while it ran, their numbers could name another directory, the
	// host's, by the time it used them.
	r := <-res
	if r.err != nil {
		return nil, "", r.err
	}
	return r.ln, "/tmp/" + dir + "/" + agentSocket, nil
}
