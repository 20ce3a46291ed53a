package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/sandbox"
)

// AgentEnv is the variable that names a session's SSH agent socket in its
// processes' environment (a session with an ssh-key secret).
const AgentEnv = "SSH_AUTH_SOCK"

// maxAgentConns bounds the agent connections a session holds open at
// once; more are closed as they come.
const maxAgentConns = 16

// errAgentReadOnly answers what would change the agent's keys.
var errAgentReadOnly = errors.New("sandgate's agent is read-only: its keys are the session's ssh-key secrets")

// hasSSHKey reports whether s asked for an ssh-key secret.
func (s *Session) hasSSHKey() bool {
	for _, r := range s.Secrets {
		if r.Bound() && s.secrets != nil {
			if _, ok := secretKey(s.secrets, s.Tenant, r.Name); ok {
				return true
			}
		}
	}
	return false
}

// openAgent serves s's SSH agent, when s has an ssh-key secret, on a
// socket its sandbox reaches (sandbox.AgentListener); ps is s's egress
// proxy, whose open connections gate each signature. It answers nil, ""
// when s has no ssh-key secret.
func (m *Manager) openAgent(ctx context.Context, s *Session, ps *egress.Session) (io.Closer, string, error) {
	if !s.hasSSHKey() {
		return nil, "", nil
	}
	al, ok := sandbox.As[sandbox.AgentListener](s.sandbox)
	if !ok {
		return nil, "", errors.New("this sandbox driver cannot give sessions an SSH agent")
	}
	ln, path, err := al.ListenAgent(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("SSH agent: %w", err)
	}
	a := &sessionAgent{m: m, s: s, ps: ps}
	srv := &agentServer{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(srv.done)
		a.serve(ln)
	}()
	return srv, path, nil
}

// agentServer is a session's agent being served.
type agentServer struct {
	ln   net.Listener
	done chan struct{}
}

// Close closes the listener and every connection, and waits for them.
func (a *agentServer) Close() error {
	err := a.ln.Close()
	<-a.done
	return err
}

// sessionAgent is the SSH agent of a session's ssh-key secrets. It holds
// no key: each request looks the secrets up (a reload applies at once),
// and it signs with one only while the session's egress proxy has an
// open connection to one of the hosts the secret is bound to.
type sessionAgent struct {
	m  *Manager
	s  *Session
	ps *egress.Session
}

// serve answers each connection of ln until ln is closed.
func (a *sessionAgent) serve(ln net.Listener) {
	sem := make(chan struct{}, maxAgentConns)
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close() // too many at once: the client sees the agent hang up
			continue
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			_ = agent.ServeAgent(a, c)
		}()
	}
}

// agentKey is one ssh-key secret of the session.
type agentKey struct {
	name   string
	hosts  egress.List
	signer ssh.Signer
}

// keys are the session's ssh-key secrets as the secrets source has them now.
func (a *sessionAgent) keys() []agentKey {
	var out []agentKey
	s := a.s
	if s.secrets == nil {
		return nil
	}
	for _, r := range s.Secrets {
		if !r.Bound() {
			continue
		}
		k, ok := secretKey(s.secrets, s.Tenant, r.Name)
		if !ok {
			continue
		}
		hosts, _ := egress.ParseList(r.Hosts)
		// Pins set by a reload since the session was created hold too.
		if pins, pinned := secretPins(s.secrets, s.Tenant, r.Name); !pinned || len(pins.Outside(hosts)) > 0 {
			continue
		}
		out = append(out, agentKey{name: r.Name, hosts: hosts, signer: k})
	}
	return out
}

// List implements agent.Agent: every key, whether it may sign now or not
// (its comment says where it signs).
func (a *sessionAgent) List() ([]*agent.Key, error) {
	var out []*agent.Key
	for _, k := range a.keys() {
		pub := k.signer.PublicKey()
		out = append(out, &agent.Key{Format: pub.Type(), Blob: pub.Marshal(),
			Comment: fmt.Sprintf("%s (sandgate: signs while connected to %s)", k.name, strings.Join(k.hosts.Entries(), ", "))})
	}
	return out, nil
}

// Sign implements agent.Agent.
func (a *sessionAgent) Sign(key ssh.PublicKey, data []byte) (*ssh.Signature, error) {
	return a.SignWithFlags(key, data, 0)
}

// SignWithFlags implements agent.ExtendedAgent: it signs with the secret
// whose public key is key, only while the session has an open egress
// connection to one of the secret's hosts; a refusal is audited.
func (a *sessionAgent) SignWithFlags(key ssh.PublicKey, data []byte, flags agent.SignatureFlags) (*ssh.Signature, error) {
	blob := key.Marshal()
	for _, k := range a.keys() {
		if string(k.signer.PublicKey().Marshal()) != string(blob) {
			continue
		}
		hosts := strings.Join(k.hosts.Entries(), ",")
		if !a.ps.OpenTo(k.hosts) {
			reason := "no open connection to " + hosts
			a.audit(k.name, hosts, "refused", reason)
			a.m.log.Warn("ssh_agent_refused", "session", a.s.ID, "secret", k.name, "reason", reason)
			return nil, fmt.Errorf("ssh-key %s: %s", k.name, reason)
		}
		sig, err := sign(k.signer, data, flags)
		if err != nil {
			a.audit(k.name, hosts, "failed", err.Error())
			return nil, err
		}
		a.audit(k.name, hosts, "signed", "")
		return sig, nil
	}
	return nil, errors.New("no such key in this session's agent")
}

// sign signs data with s, with the RSA hash flags ask for.
func sign(s ssh.Signer, data []byte, flags agent.SignatureFlags) (*ssh.Signature, error) {
	var algo string
	switch {
	case flags&agent.SignatureFlagRsaSha256 != 0:
		algo = ssh.KeyAlgoRSASHA256
	case flags&agent.SignatureFlagRsaSha512 != 0:
		algo = ssh.KeyAlgoRSASHA512
	}
	if as, ok := s.(ssh.AlgorithmSigner); ok && algo != "" && s.PublicKey().Type() == ssh.KeyAlgoRSA {
		return as.SignWithAlgorithm(nil, data, algo)
	}
	return s.Sign(nil, data)
}

// audit records an agent's signature or refusal (never a key).
func (a *sessionAgent) audit(name, hosts, result, reason string) {
	a.m.auditor().Record(context.Background(), audit.Event{Kind: audit.KindEgress, Tenant: a.s.Tenant, Session: a.s.ID,
		Op: "ssh-agent", Host: hosts, Result: result, Reason: reason, Secret: name})
}

// Extension implements agent.ExtendedAgent: none.
func (a *sessionAgent) Extension(string, []byte) ([]byte, error) {
	return nil, agent.ErrExtensionUnsupported
}

// Add, Remove, RemoveAll, Lock and Unlock implement agent.Agent: the
// agent's keys are the session's secrets, nothing else.
func (a *sessionAgent) Add(agent.AddedKey) error       { return errAgentReadOnly }
func (a *sessionAgent) Remove(ssh.PublicKey) error     { return errAgentReadOnly }
func (a *sessionAgent) RemoveAll() error               { return errAgentReadOnly }
func (a *sessionAgent) Lock([]byte) error              { return errAgentReadOnly }
func (a *sessionAgent) Unlock([]byte) error            { return errAgentReadOnly }
func (a *sessionAgent) Signers() ([]ssh.Signer, error) { return nil, errAgentReadOnly }
