package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

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

// Bounds of one agent connection (agentConn). A request is a few hundred
// bytes (a signature request holds the login being signed; with a
// certificate a few KiB); the agent library itself would allocate up to
// 16 MiB for a length it is told, before the bytes arrive.
const (
	maxAgentRequest = 64 << 10        // one request, its length prefix excluded
	agentIdle       = 2 * time.Minute // waiting for a connection's next request
	agentIO         = 10 * time.Second
)

// The audit events (and logged refusals) of a session's agent are paced:
// a sandbox process can ask for signatures far faster than a log should
// take them. Past a burst of agentAuditBurst, agentAuditPerSecond are
// recorded; the others are counted, and the next one recorded says how
// many were left out.
const (
	agentAuditPerSecond = 8
	agentAuditBurst     = 32
)

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
	a := &sessionAgent{m: m, s: s, ps: ps, idle: agentIdle, io: agentIO}
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
	// idle bounds the wait for a connection's next request, io the rest
	// of a request once begun and the writing of its answer.
	idle, io time.Duration

	paceMu  sync.Mutex // guards the pace of audit events
	tokens  float64
	last    time.Time
	skipped int
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
			_ = agent.ServeAgent(a, &agentConn{c: c, idle: a.idle, io: a.io})
		}()
	}
}

// agentConn hands agent.ServeAgent one request at a time, read whole
// within its bounds: a length over maxAgentRequest, a connection idle
// longer than idle, or a request (or an answer) not through in io ends
// the connection, so a sandbox process can neither make the gateway
// allocate what it claims nor hold a connection half-sent.
type agentConn struct {
	c        net.Conn
	idle, io time.Duration
	buf      []byte // the rest of the request read
}

func (a *agentConn) Read(p []byte) (int, error) {
	if len(a.buf) == 0 {
		var n [4]byte
		_ = a.c.SetReadDeadline(time.Now().Add(a.idle))
		if _, err := io.ReadFull(a.c, n[:1]); err != nil {
			return 0, err
		}
		_ = a.c.SetReadDeadline(time.Now().Add(a.io))
		if _, err := io.ReadFull(a.c, n[1:]); err != nil {
			return 0, err
		}
		l := binary.BigEndian.Uint32(n[:])
		if l > maxAgentRequest {
			return 0, fmt.Errorf("agent request of %d bytes: more than %d", l, maxAgentRequest)
		}
		req := make([]byte, 4+l)
		copy(req, n[:])
		if _, err := io.ReadFull(a.c, req[4:]); err != nil {
			return 0, err
		}
		a.buf = req
	}
	n := copy(p, a.buf)
	a.buf = a.buf[n:]
	return n, nil
}

func (a *agentConn) Write(p []byte) (int, error) {
	_ = a.c.SetWriteDeadline(time.Now().Add(a.io))
	return a.c.Write(p)
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
// whose public key is key an SSH login (sshLogin) and nothing else, only
// while the session has an open egress connection to one of the secret's
// hosts; a refusal is audited.
func (a *sessionAgent) SignWithFlags(key ssh.PublicKey, data []byte, flags agent.SignatureFlags) (*ssh.Signature, error) {
	blob := key.Marshal()
	for _, k := range a.keys() {
		if string(k.signer.PublicKey().Marshal()) != string(blob) {
			continue
		}
		hosts := strings.Join(k.hosts.Entries(), ",")
		if !a.ps.OpenTo(k.hosts) {
			return nil, a.refuse(k.name, hosts, "no open connection to "+hosts)
		}
		if !sshLogin(data, blob) {
			return nil, a.refuse(k.name, hosts, "not an SSH login (the agent signs publickey authentication requests only)")
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

// Methods of an SSH login's signed data (sshLogin): RFC 4252's, and
// OpenSSH's host-bound one (8.9 on, with a server that offers it), which
// adds the server's host key.
const (
	loginPublicKey = "publickey"
	loginHostBound = "publickey-hostbound-v00@openssh.com"
)

// sshLogin reports whether data is what an SSH client signs to log in
// with the key whose wire form is blob (RFC 4252 section 7): the session
// identifier (an exchange hash, at most 64 bytes), SSH_MSG_USERAUTH_REQUEST,
// the user, "ssh-connection", the method, TRUE, the algorithm, and the
// key (or a certificate of it), then, host-bound, the server's host key.
// Anything else (an SSHSIG file or commit signature, another protocol's
// challenge) is no login: such a signature would outlive the connection
// that let the agent sign.
func sshLogin(data, blob []byte) bool {
	str := func() ([]byte, bool) {
		if len(data) < 4 {
			return nil, false
		}
		n := binary.BigEndian.Uint32(data)
		if uint64(n) > uint64(len(data)-4) {
			return nil, false
		}
		s := data[4 : 4+n]
		data = data[4+n:]
		return s, true
	}
	id, ok := str()
	if !ok || len(id) == 0 || len(id) > 64 || len(data) < 1 || data[0] != 50 { // SSH_MSG_USERAUTH_REQUEST
		return false
	}
	data = data[1:]
	if _, ok := str(); !ok { // the user
		return false
	}
	if service, ok := str(); !ok || string(service) != "ssh-connection" {
		return false
	}
	method, ok := str()
	if !ok || string(method) != loginPublicKey && string(method) != loginHostBound {
		return false
	}
	if len(data) < 1 || data[0] != 1 { // has a signature: TRUE
		return false
	}
	data = data[1:]
	if algo, ok := str(); !ok || len(algo) == 0 {
		return false
	}
	key, ok := str()
	if !ok {
		return false
	}
	if !bytes.Equal(key, blob) {
		pk, err := ssh.ParsePublicKey(key)
		cert, isCert := pk.(*ssh.Certificate)
		if err != nil || !isCert || !bytes.Equal(cert.Key.Marshal(), blob) {
			return false
		}
	}
	if string(method) == loginHostBound {
		if hostKey, ok := str(); !ok || len(hostKey) == 0 {
			return false
		}
	}
	return len(data) == 0
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

// refuse audits and logs a refused signature, and answers the error.
func (a *sessionAgent) refuse(name, hosts, reason string) error {
	if a.audit(name, hosts, "refused", reason) {
		a.m.log.Warn("ssh_agent_refused", "session", a.s.ID, "secret", name, "reason", reason)
	}
	return fmt.Errorf("ssh-key %s: %s", name, reason)
}

// audit records an agent's signature or refusal (never a key), within the
// session's pace of them; it reports whether it did.
func (a *sessionAgent) audit(name, hosts, result, reason string) bool {
	now := time.Now()
	a.paceMu.Lock()
	if a.last.IsZero() {
		a.tokens = agentAuditBurst
	} else {
		a.tokens = min(agentAuditBurst, a.tokens+now.Sub(a.last).Seconds()*agentAuditPerSecond)
	}
	a.last = now
	ok := a.tokens >= 1
	skipped := 0
	if ok {
		a.tokens--
		skipped, a.skipped = a.skipped, 0
	} else {
		a.skipped++
	}
	a.paceMu.Unlock()
	if !ok {
		return false
	}
	if skipped > 0 {
		reason = strings.TrimSpace(fmt.Sprintf("%s (and %d more agent events not recorded: past %d a second)", reason, skipped, agentAuditPerSecond))
	}
	a.m.auditor().Record(context.Background(), audit.Event{Kind: audit.KindEgress, Tenant: a.s.Tenant, Session: a.s.ID,
		Op: "ssh-agent", Host: hosts, Result: result, Reason: reason, Secret: name})
	return true
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
