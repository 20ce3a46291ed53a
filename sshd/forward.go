package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/rawio"
	"github.com/sandgate/sandgate/sandbox"
)

// Local port forwarding (ssh -L): a direct-tcpip channel is served only
// when Config.LocalForward is set, and only to the sandbox's own loopback
// (localhost, 127.0.0.1 or ::1): the gateway connects there through
// sandbox.LoopbackDialer, never to another host, so that -L cannot reach
// the gateway's network and -D (a direct-tcpip per destination) is
// refused. Remote forwarding (tcpip-forward), agent and X11 forwarding
// stay refused: no handler exists for them.

// forwardDialTimeout bounds the connect to the sandbox's loopback.
const forwardDialTimeout = 10 * time.Second

// loopbackNetwork is the network to dial for a direct-tcpip destination
// host, "" when the host is not the sandbox's loopback.
func loopbackNetwork(host string) string {
	switch host {
	case "localhost", "127.0.0.1":
		return "tcp4"
	case "::1", "[::1]":
		return "tcp6"
	}
	return ""
}

// loopbackDialer finds the LoopbackDialer behind the session's sandbox,
// which the gateway wraps (Unwrap).
func loopbackDialer(sb sandbox.Sandbox) sandbox.LoopbackDialer {
	for sb != nil {
		if d, ok := sb.(sandbox.LoopbackDialer); ok {
			return d
		}
		u, ok := sb.(interface{ Unwrap() sandbox.Sandbox })
		if !ok {
			return nil
		}
		sb = u.Unwrap()
	}
	return nil
}

func (s *Server) handleDirectTCPIP(_ *gliderssh.Server, _ *gossh.ServerConn, nc gossh.NewChannel, ctx gliderssh.Context) {
	defer func() {
		if v := recover(); v != nil {
			s.cfg.Log.Error("ssh_channel_panic", "panic", v, "in", "direct-tcpip")
		}
	}()
	var d struct {
		DestAddr   string
		DestPort   uint32
		OriginAddr string
		OriginPort uint32
	}
	if err := gossh.Unmarshal(nc.ExtraData(), &d); err != nil {
		_ = nc.Reject(gossh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	sess := sessionOf(ctx)
	if sess == nil || !sess.Live() {
		_ = nc.Reject(gossh.Prohibited, "session is gone")
		return
	}
	log := s.cfg.Log.With("session", sess.ID, "host", d.DestAddr, "port", d.DestPort)
	fw := s.newForwardAudit(ctx, sess, d.DestAddr, d.DestPort)
	if !s.cfg.LocalForward {
		log.Info("ssh_forward_refused", "reason", "disabled")
		fw.refused("disabled", "port forwarding is disabled on this gateway")
		_ = nc.Reject(gossh.Prohibited, "port forwarding is disabled on this gateway")
		return
	}
	network := loopbackNetwork(d.DestAddr)
	if network == "" {
		log.Info("ssh_forward_refused", "reason", "not loopback")
		fw.refused("not_loopback", "only the sandbox's own loopback can be forwarded to")
		_ = nc.Reject(gossh.Prohibited, "only the sandbox's own loopback can be forwarded to (localhost, 127.0.0.1 or ::1)")
		return
	}
	if d.DestPort < 1 || d.DestPort > 65535 {
		fw.refused("invalid_port", fmt.Sprintf("port %d out of range", d.DestPort))
		_ = nc.Reject(gossh.ConnectionFailed, fmt.Sprintf("port %d out of range", d.DestPort))
		return
	}
	if err := sess.Wake(ctx); err != nil { // a paused session resumes on a forward
		fw.refused("resume_failed", err.Error())
		_ = nc.Reject(gossh.ConnectionFailed, "the paused session could not resume")
		return
	}
	dialer := loopbackDialer(sess.Sandbox())
	if dialer == nil {
		log.Info("ssh_forward_refused", "reason", "sandbox cannot dial its loopback")
		fw.refused("unsupported", "this sandbox driver does not support port forwarding")
		_ = nc.Reject(gossh.Prohibited, "this sandbox driver does not support port forwarding")
		return
	}
	if bc, _ := ctx.Value(keyConn).(*boundConn); bc != nil {
		if bc.fwds.Add(1) > MaxForwardsPerConn {
			bc.fwds.Add(-1)
			msg := fmt.Sprintf("too many forwarded connections open on this connection (max %d)", MaxForwardsPerConn)
			fw.refused("too_many_channels", msg)
			_ = nc.Reject(gossh.ResourceShortage, msg)
			return
		}
		defer bc.fwds.Add(-1)
	}
	dctx, cancel := context.WithTimeout(ctx, forwardDialTimeout)
	conn, err := dialer.DialLoopback(dctx, network, int(d.DestPort))
	if err != nil && d.DestAddr == "localhost" && dctx.Err() == nil {
		// "localhost" is both loopbacks (a sandbox's /etc/hosts has
		// ::1 too): a server listening on ::1 only is reached, as
		// OpenSSH reaches it by trying every address of the name.
		if c6, err6 := dialer.DialLoopback(dctx, "tcp6", int(d.DestPort)); err6 == nil {
			conn, err = c6, nil
		}
	}
	cancel()
	if err != nil {
		log.Info("ssh_forward_failed", "err", err)
		fw.refused("connect_failed", connectErr(err))
		_ = nc.Reject(gossh.ConnectionFailed, "cannot connect in the sandbox: "+connectErr(err))
		return
	}
	defer conn.Close()
	conn = rawio.Wrap(conn) // bulk data both ways: raw system calls
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	go gossh.DiscardRequests(reqs)
	// An open forward is work in progress, quiet or not: the idle
	// timeout waits for it (as OpenSSH, which has none, would).
	defer sess.Hold()()
	log.Info("ssh_forward_opened")
	in, out := s.pipe(ctx, ch, conn)
	fw.ended(in, out)
}

// connectErr is err without the gateway's own details (addresses and
// namespaces): what the client may read.
func connectErr(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return err.Error()
}

// pipe copies between the channel and conn both ways, passing each EOF on
// as a half-close, until both directions are done or the connection ends
// (the session closing ends it); every move of data is session activity.
// It returns the bytes moved from the client and to it.
func (s *Server) pipe(ctx context.Context, ch gossh.Channel, conn net.Conn) (in, out int64) {
	a := &activity{sess: sessionOf(ctx)}
	stop := context.AfterFunc(ctx, func() {
		_ = conn.Close()
		_ = ch.Close()
	})
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // client -> sandbox
		defer wg.Done()
		defer s.recoverForward(conn, ch)
		var err error
		in, err = copyIn(conn, ch, nil, a.touch, &s.bufs)
		if err != nil {
			_ = conn.Close()
			_ = ch.Close()
			return
		}
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	go func() { // sandbox -> client
		defer wg.Done()
		defer s.recoverForward(conn, ch)
		var err error
		out, err = copyStream(a.writer(ch), conn, &s.bufs)
		if err != nil {
			_ = conn.Close()
			_ = ch.Close()
			return
		}
		_ = ch.CloseWrite()
	}()
	wg.Wait()
	_ = ch.Close()
	return in, out
}

func (s *Server) recoverForward(c io.Closer, ch gossh.Channel) {
	if v := recover(); v != nil {
		s.cfg.Log.Error("ssh_channel_panic", "panic", v, "in", "direct-tcpip copy")
		_ = c.Close()
		_ = ch.Close()
	}
}
