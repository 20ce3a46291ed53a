package sshd

import (
	"errors"

	gossh "golang.org/x/crypto/ssh"
)

// Metrics receives the SSH server's counts (internal/metrics implements
// it); Config.Metrics nil counts nothing.
type Metrics interface {
	// SSHAuthFailed: an authentication attempt with method failed.
	SSHAuthFailed(method string)
}

// countAuth counts a failed attempt. The "none" probe clients send first
// to learn the methods (ErrNoAuth) is no failure.
func (s *Server) countAuth(method string, err error) {
	if err == nil || s.cfg.Metrics == nil || errors.Is(err, gossh.ErrNoAuth) {
		return
	}
	s.cfg.Metrics.SSHAuthFailed(method)
}
