package linuxns

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// DialLoopback implements sandbox.LoopbackDialer: it connects to port on
// 127.0.0.1 (tcp4) or ::1 (tcp6) inside the sandbox's network namespace,
// the sandbox's own loopback, for `ssh -L`. The socket is created in that
// namespace and stays there once the dialing thread has switched back.
func (s *linuxSandbox) DialLoopback(ctx context.Context, network string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d out of range", port)
	}
	var host string
	switch network {
	case "tcp4":
		host = "127.0.0.1"
	case "tcp6":
		host = "::1"
	default:
		return nil, fmt.Errorf("network %q: want tcp4 or tcp6", network)
	}
	s.mu.Lock()
	done, pid, stopped := s.initDone, s.st.Pid, s.st.Stopped
	s.mu.Unlock()
	if stopped {
		return nil, sandbox.ErrStopped
	}
	select {
	case <-done:
		return nil, sandbox.ErrClosed
	default:
	}
	// The init is alive and watched through its pidfd, so its pid names it.
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("sandbox network namespace: %w", err)
	}
	defer ns.Close()
	return dialIn(ctx, ns, network, net.JoinHostPort(host, strconv.Itoa(port)))
}

// dialIn connects to addr from inside the network namespace ns (inNetNS).
// The connect runs on that thread to its end (the Go dialer may hand the
// wait to the poller, but the socket was created in ns, which is what
// counts).
func dialIn(ctx context.Context, ns *os.File, network, addr string) (net.Conn, error) {
	return inNetNS(ns, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
}

// inNetNS runs open, which makes a socket, inside the network namespace
// ns: one locked OS thread switches into ns, runs it, and switches back; a
// thread that cannot switch back is never reused (it stays locked and
// ends with its goroutine), and what open made is closed then.
func inNetNS[T io.Closer](ns *os.File, open func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("gateway network namespace: %w", err)}
			return
		}
		defer home.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter sandbox network namespace: %w", err)}
			return
		}
		v, oerr := open()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			if oerr == nil {
				v.Close()
			}
			done <- result{err: fmt.Errorf("leave sandbox network namespace: %w", err)}
			return // the thread stays locked, and exits with this goroutine
		}
		runtime.UnlockOSThread()
		done <- result{v, oerr}
	}()
	r := <-done
	return r.v, r.err
}
