// Package gateway holds sessions: the Manager that creates, finds, lists,
// deletes and expires them, the principals that own them, and the
// verification of the bearer tokens that name those principals.
package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/sandbox"
)

// Session status values.
const (
	StatusRunning = "running"
	// StatusStopped is a session whose processes were stopped (Manager.Stop):
	// its files are kept, and its next process starts it again.
	StatusStopped = "stopped"
	// StatusPaused is a session whose processes are paused where they are
	// (Manager.Pause, pause.go): its next use lets them run again.
	StatusPaused  = "paused"
	StatusDeleted = "deleted"
	StatusExpired = "expired"
	StatusFailed  = "failed"
)

// TTL bounds in seconds.
const (
	MinTTL     = 60
	MaxTTL     = 28800
	DefaultTTL = 3600
)

// Session is one session and its sandbox. Its exported fields never change
// after creation; activity, status, expiry and ttl (which a PATCH moves) are
// read through methods or Snapshot.
type Session struct {
	ID     string
	Tenant string
	// Name is the creator's name for the session ("" for none), unique
	// among the tenant's live sessions.
	Name  string
	Image string
	// Workspace is what /workspace started from: a named workspace the
	// session holds, or a snapshot.
	Workspace WorkspaceRef
	// Env is the session's own environment (CreateParams.Env).
	Env map[string]string
	// secretScope is CreateParams.SecretScope.
	secretScope string
	// ImageDigest is the manifest digest of the image the sandbox runs
	// ("" for the default root).
	ImageDigest string
	Metadata    map[string]any
	CreatedAt   time.Time
	// SSHPublicKey is the authorized_keys line the creator supplied, if any.
	SSHPublicKey string
	// IdempotencyKey is the creator's Idempotency-Key, if any.
	IdempotencyKey string
	// Resources are the sandbox's limits in force (nil for a session
	// recorded before sessions had their own).
	Resources *Resources
	// Secrets are the secrets the session asked for, by name (values are
	// looked up in secrets when a process starts).
	Secrets []SecretRef

	secrets SecretSource
	hist    history
	// egressLog keeps the latest egress decisions (egresslog.go).
	egressLog egressLog
	// egressCA signs the certificates the egress proxy shows for hosts
	// with a bound secret; the sandbox trusts it (nil: no bound secret).
	egressCA                 *egress.CA
	egressCAPEM, egressCAKey []byte

	requestHash   [32]byte // fingerprint of the create's payload, with IdempotencyKey
	passwordHash  [32]byte
	sandbox       sandbox.Sandbox
	lastActivity  atomic.Int64 // unix nanoseconds
	holds         atomic.Int32 // calls in progress: REST, SSH commands, forwards (Hold)
	savedActivity atomic.Int64 // lastActivity as last written to the store
	// tunnelIn and tunnelOut count the bytes of the session's CONNECT
	// tunnels since this gateway process started (tunnelbytes.go).
	tunnelIn, tunnelOut atomic.Int64

	// resume starts the stopped session again (the holding Manager's
	// resume; nil, as for a session made by hand, leaves it stopped);
	// auditor and metrics are the Manager's too (nil: none). The Manager
	// sets them with hold; the session never calls back into it otherwise.
	resume  func(ctx context.Context) error
	unpause func(ctx context.Context) error // the holding Manager's unpause (pause.go)
	auditor audit.Auditor
	metrics Metrics
	// life orders Stop and resume (held to write) against the start of
	// processes (held to read): a process never starts in a sandbox half
	// stopped, and many first calls to a stopped session resume it once.
	life sync.RWMutex

	mu           sync.Mutex
	status       string
	statusReason string
	expiresAt    time.Time
	ttl          int // seconds, as last set (by create or an update)
	conns        map[*connEntry]struct{}
	ckHooks      map[*func() bool]struct{}  // OnCheckpoint's
	handoffs     map[*HandoffEntry]struct{} // AddHandoff's
	forkHooks    map[*func() bool]struct{}  // OnForkCheckpoint's
	resumed      chan struct{}              // Resumed's: closed at the next unpause or end
	cmds         map[*recorded]struct{}     // recorded commands under way (heldCommands)
	egressAllow  []string                   // the allow-list in force, canonical
	egressMode   string                     // EgressModeAsk, or "" (EgressModeDeny)
	egressDeny   []string                   // host:ports denied for good in ask mode (approvals.go)
	followers    int                        // GET .../egress/pending?follow=true streams open (approvals.go)
	proxy        *egress.Session            // nil until the session needs one
	proxyAddr    string                     // where the sandbox reaches proxy
	agent        io.Closer                  // the SSH agent of its ssh-key secrets, with proxy
	agentPath    string                     // where the sandbox reaches agent (SSH_AUTH_SOCK)
	savedIn      int64                      // egress bytes when the proxy last closed, or as restored
	savedOut     int64
	recIn        int64 // egress bytes as last written to the store
	recOut       int64
}

// View is what a tenant sees of a session. The REST API renders it as it
// is, and Record embeds it, so the two share these fields and JSON names.
type View struct {
	Name string `json:"name,omitempty"`
	// WorkspaceRef is what the workspace started from (workspaces.go).
	WorkspaceRef
	Status         string         `json:"status"`
	Image          string         `json:"image"`
	ImageDigest    string         `json:"imageDigest,omitempty"`
	Metadata       map[string]any `json:"metadata"`
	Resources      *Resources     `json:"resources,omitempty"`
	Egress         *EgressView    `json:"egress,omitempty"`
	Secrets        []SecretRef    `json:"secrets,omitempty"`
	CreatedAt      time.Time      `json:"createdAt"`
	ExpiresAt      time.Time      `json:"expiresAt"`
	LastActivityAt time.Time      `json:"lastActivityAt"`
	// TTL is the lifetime in seconds as last set, by the create or by an
	// update (PATCH): ExpiresAt is the moment it was set plus TTL.
	TTL          int    `json:"ttl"`
	StatusReason string `json:"statusReason,omitempty"` // why a failed session failed
}

// Record is a session at one moment: what Snapshot returns for rendering
// and what the Store keeps. Its JSON is the store's on-disk format.
type Record struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	View
	SSHPublicKey string `json:"sshPublicKey,omitempty"`
	PasswordHash []byte `json:"passwordHash"` // SHA-256 of the SSH password
	// IdempotencyKey and RequestHash (the fingerprint of the create's
	// payload) let a repeated create find this session after a restart.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	RequestHash    []byte `json:"requestHash,omitempty"`
	// EgressCA and EgressCAKey are the session's egress CA (PEM), which
	// its sandbox trusts, kept so a restarted gateway signs with it again.
	EgressCA    []byte `json:"egressCA,omitempty"`
	EgressCAKey []byte `json:"egressCAKey,omitempty"`
	// Env is the session's own environment (CreateParams.Env).
	Env map[string]string `json:"env,omitempty"`
	// SecretScope is CreateParams.SecretScope (the scope, never a value).
	SecretScope string `json:"secretScope,omitempty"`
}

// Snapshot returns the session's current state.
func (s *Session) Snapshot() Record {
	s.mu.Lock()
	status, reason, expires, ttl := s.status, s.statusReason, s.expiresAt, s.ttl
	ev := &EgressView{Allow: slices.Clone(s.egressAllow), BytesIn: s.savedIn, BytesOut: s.savedOut,
		Mode: s.egressMode, Deny: slices.Clone(s.egressDeny)}
	if s.proxy != nil {
		ev.BytesIn, ev.BytesOut = s.proxy.Bytes()
	}
	s.mu.Unlock()
	if ev.Allow == nil {
		ev.Allow = []string{}
	}
	r := Record{
		ID: s.ID, Tenant: s.Tenant,
		View: View{
			Name: s.Name, Status: status, Image: s.Image, ImageDigest: s.ImageDigest, Metadata: s.Metadata, Resources: s.Resources,
			Egress: ev, Secrets: s.Secrets,
			CreatedAt: s.CreatedAt, ExpiresAt: expires, LastActivityAt: s.LastActivity(), TTL: ttl,
			StatusReason: reason, WorkspaceRef: s.Workspace,
		},
		SSHPublicKey: s.SSHPublicKey, PasswordHash: bytes.Clone(s.passwordHash[:]),
		EgressCA: s.egressCAPEM, EgressCAKey: s.egressCAKey, Env: s.Env, SecretScope: s.secretScope,
	}
	if s.IdempotencyKey != "" {
		r.IdempotencyKey, r.RequestHash = s.IdempotencyKey, bytes.Clone(s.requestHash[:])
	}
	return r
}

// sessionFromRecord rebuilds a session from the store; its sandbox is set
// by the caller.
func sessionFromRecord(r Record) *Session {
	s := &Session{
		ID: r.ID, Tenant: r.Tenant, Name: r.Name, Image: r.Image, ImageDigest: r.ImageDigest, Metadata: r.Metadata, Resources: r.Resources,
		CreatedAt: r.CreatedAt, expiresAt: r.ExpiresAt, ttl: r.TTL, SSHPublicKey: r.SSHPublicKey,
		IdempotencyKey: r.IdempotencyKey,
		status:         r.Status, statusReason: r.StatusReason, conns: map[*connEntry]struct{}{},
		Secrets: r.Secrets, egressCAPEM: r.EgressCA, egressCAKey: r.EgressCAKey,
		Workspace: r.WorkspaceRef, Env: r.Env, secretScope: r.SecretScope,
	}
	if r.Egress != nil {
		s.egressAllow, s.savedIn, s.savedOut = r.Egress.Allow, r.Egress.BytesIn, r.Egress.BytesOut
		s.egressMode, s.egressDeny = r.Egress.Mode, r.Egress.Deny
	}
	copy(s.passwordHash[:], r.PasswordHash)
	copy(s.requestHash[:], r.RequestHash)
	s.lastActivity.Store(r.LastActivityAt.UnixNano())
	s.savedActivity.Store(r.LastActivityAt.UnixNano())
	return s
}

type connEntry struct {
	close func()
	// paused says a pause closes it too (AddPausedConn), not only the
	// session's end or stop; notice, that it is a pause notice
	// (AddPauseNotice), run before the connections close.
	paused, notice bool
	// pauseOnly says only a pause calls it (AddPausedCall: its cause says
	// "paused"); an end or a stop does not.
	pauseOnly bool
}

// StartOptions say what Session.Start does around the start of a
// process, besides starting it in the session's sandbox with the
// session's environment.
type StartOptions struct {
	// Resume starts a stopped session again first. Without it a stopped
	// session's Start fails with sandbox.ErrStopped: clean-up after
	// processes that a Stop ended must not bring the session back.
	Resume bool
	// Record lists the command in the session's history (and the audit
	// trail and the metrics) when it ends, with Source. A caller that
	// records its commands itself (a persistent shell's, one at a time;
	// a REST command, which knows its timeout) leaves it false and calls
	// RecordCommand. Subsystems and shells (no Command) are never listed.
	Record bool
	// Source is where the command came from: "ssh" or "rest".
	Source string
	// ProcessID is the background process's id (POST
	// /v1/sessions/{id}/processes) a recorded command runs as, which its
	// audit event carries.
	ProcessID string
}

// SSHStart are the options of an SSH channel's processes, and of the
// session's Sandbox().Start: resume, and record as "ssh".
var SSHStart = StartOptions{Resume: true, Record: true, Source: "ssh"}

// Start starts cmd in the session's sandbox as o says: with the session's
// environment (its secrets, its egress proxy and trust store) added to
// the command's. A session restored as failed, which has no sandbox,
// answers sandbox.ErrClosed.
func (s *Session) Start(ctx context.Context, cmd sandbox.Cmd, o StartOptions) (sandbox.Process, error) {
	if s.sandbox == nil {
		return nil, sandbox.ErrClosed
	}
	if err := s.secretsReady(); err != nil {
		return nil, err
	}
	unlock, err := s.running(ctx, o.Resume)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if env := s.env(); len(env) > 0 {
		cmd.Env = append(slices.Clip(cmd.Env), env...) // the session's win
	}
	p, err := s.sandbox.Start(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if !o.Record || cmd.Command == "" || cmd.Subsystem != "" {
		return p, nil
	}
	return s.record(ctx, cmd.Command, o, p), nil
}

// Sandbox is the session's sandbox as the session's processes must be
// started in it: its Start is the session's Start with SSHStart. Its
// optional interfaces are the driver's, behind the wrapper (sandbox.As).
func (s *Session) Sandbox() sandbox.Sandbox {
	if s.sandbox == nil { // a session restored as failed
		return nil
	}
	return sessionSandbox{s.sandbox, s}
}

// sessionSandbox starts processes through its session's Start.
type sessionSandbox struct {
	sandbox.Sandbox
	s *Session
}

// Unwrap is the driver's sandbox, for tests and tools that look at what
// the driver made (its init's pid).
func (sb sessionSandbox) Unwrap() sandbox.Sandbox { return sb.Sandbox }

// Start is the session's Start with SSHStart.
func (sb sessionSandbox) Start(ctx context.Context, cmd sandbox.Cmd) (sandbox.Process, error) {
	return sb.s.Start(ctx, cmd, SSHStart)
}

// env is what the session adds to every process's environment, as of now:
// each environment secret's value (looked up now, so a reloaded secrets
// file applies), each bound secret's placeholder, the proxy variables and
// the trust store's.
func (s *Session) env() []string {
	env := sortedEnv(s.Env) // first: what the gateway adds below wins
	for _, r := range s.Secrets {
		if r.Bound() {
			if s.secrets != nil {
				if _, isKey := secretKey(s.secrets, s.Tenant, r.Name); isKey {
					continue // the agent's: no placeholder
				}
			}
			env = append(env, r.Name+"="+egress.Placeholder(r.Name))
			continue
		}
		if s.secrets == nil {
			continue
		}
		if _, pinned := secretPins(s.secrets, s.Tenant, r.Name); pinned {
			continue // pinned to hosts by a reload since: never in the environment
		}
		if v, ok := s.secrets.Lookup(s.Tenant, r.Name); ok {
			env = append(env, r.Name+"="+v)
		}
	}
	if addr := s.ProxyAddr(); addr != "" {
		u := "http://" + addr
		env = append(env, "HTTP_PROXY="+u, "HTTPS_PROXY="+u, "http_proxy="+u, "https_proxy="+u,
			"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
	}
	if p := s.agentSocket(); p != "" {
		env = append(env, AgentEnv+"="+p)
	}
	if s.egressCA != nil {
		for _, k := range caEnv {
			env = append(env, k+"="+sandbox.TrustBundle)
		}
	}
	return env
}

// EgressAllow is the session's egress allow-list in force.
func (s *Session) EgressAllow() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.egressAllow)
}

// setEgressAllow sets the allow-list; it returns the previous one.
func (s *Session) setEgressAllow(allow []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.egressAllow
	s.egressAllow = allow
	return old
}

// ProxyAddr is where the session's processes reach its egress proxy, ""
// when it has none.
func (s *Session) ProxyAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxyAddr
}

// egressProxy is the session's proxy, nil when it has none.
func (s *Session) egressProxy() *egress.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxy
}

func (s *Session) setProxy(p *egress.Session, addr string, agent io.Closer, agentPath string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proxy, s.proxyAddr, s.agent, s.agentPath = p, addr, agent, agentPath
}

// agentSocket is where the sandbox reaches the session's SSH agent, ""
// when it has none.
func (s *Session) agentSocket() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agentPath
}

// egressUnsaved reports whether the proxy carried bytes since the record
// was last written.
func (s *Session) egressUnsaved() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proxy == nil {
		return false
	}
	in, out := s.proxy.Bytes()
	return in != s.recIn || out != s.recOut
}

// egressSaved notes the byte totals a written record holds.
func (s *Session) egressSaved(v *EgressView) {
	if v == nil {
		return
	}
	s.mu.Lock()
	s.recIn, s.recOut = v.BytesIn, v.BytesOut
	s.mu.Unlock()
}

// savedEgressBytes are the egress byte totals as last recorded.
func (s *Session) savedEgressBytes() (in, out int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.savedIn, s.savedOut
}

// closeProxy stops the session's egress proxy, keeping its byte totals.
func (s *Session) closeProxy() {
	s.mu.Lock()
	p, ag := s.proxy, s.agent
	s.proxy, s.agent, s.agentPath = nil, nil, ""
	if p != nil {
		s.savedIn, s.savedOut = p.Bytes()
	}
	s.mu.Unlock()
	if ag != nil {
		_ = ag.Close()
	}
	if p != nil {
		_ = p.Close()
	}
}

// LastActivity is when the session was last used over REST or SSH.
func (s *Session) LastActivity() time.Time {
	return time.Unix(0, s.lastActivity.Load()).UTC()
}

// Touch records activity at now. It is cheap enough to call per SSH packet.
func (s *Session) Touch(now time.Time) {
	n := now.UnixNano()
	for {
		old := s.lastActivity.Load()
		if n <= old || s.lastActivity.CompareAndSwap(old, n) {
			return
		}
	}
}

// Hold marks the session in use until release is called: a call that
// lasts (a REST command, a followed output stream, a file transfer, an
// SSH command or shell, a forwarded connection) counts as activity for as
// long as it runs, not only when it starts, so the idle timeout never
// ends a session under a call in progress. The idle clock starts again
// when the last hold is released. release may be called more than once.
func (s *Session) Hold() (release func()) {
	s.holds.Add(1)
	s.Touch(time.Now())
	var once sync.Once
	return func() {
		once.Do(func() {
			s.Touch(time.Now())
			s.holds.Add(-1)
		})
	}
}

// Held reports whether a call holds the session (see Hold).
func (s *Session) Held() bool { return s.holds.Load() > 0 }

// ExpiresAt is when the session's TTL runs out.
func (s *Session) ExpiresAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expiresAt
}

// setExpiry sets the session's ttl and expiry; it returns the previous
// values, so a caller that cannot record the change can put them back.
func (s *Session) setExpiry(ttl int, at time.Time) (oldTTL int, oldAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	oldTTL, oldAt = s.ttl, s.expiresAt
	s.ttl, s.expiresAt = ttl, at
	return oldTTL, oldAt
}

// Live reports whether the session still accepts connections: it is
// running, or stopped or paused (its next use starts it again).
func (s *Session) Live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return live(s.status)
}

// live reports whether status is that of a session that holds its
// sandbox.
func live(status string) bool {
	return status == StatusRunning || status == StatusStopped || status == StatusPaused
}

// Status is the session's status now.
func (s *Session) Status() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// CheckPassword reports whether pw is the session's SSH password, in
// constant time.
func (s *Session) CheckPassword(pw string) bool {
	h := sha256.Sum256([]byte(pw))
	return subtle.ConstantTimeCompare(h[:], s.passwordHash[:]) == 1
}

// AddConn registers a connection to close when the session ends. It returns
// a function that unregisters it, and false when the session has already ended.
func (s *Session) AddConn(closeFn func()) (remove func(), ok bool) {
	return s.addConn(&connEntry{close: closeFn})
}

// AddPausedConn is AddConn for a connection from outside that a pause
// ends as well (a CONNECT tunnel: the processes it talks to stop
// answering). What AddConn registers (kernels, shells, background
// processes) outlives a pause.
func (s *Session) AddPausedConn(closeFn func()) (remove func(), ok bool) {
	return s.addConn(&connEntry{close: closeFn, paused: true})
}

// AddPauseNotice registers notify, which a pause calls (once, and before
// it closes the connections AddPausedConn registered) to tell a client
// why its connection is about to end: an SSH channel writes the reason
// (ConnClosedPaused) to its stderr.
// A pause waits at most PauseNoticeWait for them; an end or a stop does
// not call them.
func (s *Session) AddPauseNotice(notify func()) (remove func(), ok bool) {
	return s.addConn(&connEntry{close: notify, paused: true, notice: true})
}

func (s *Session) addConn(e *connEntry) (remove func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !live(s.status) {
		return func() {}, false
	}
	s.conns[e] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.conns, e)
		s.mu.Unlock()
	}, true
}

// end marks the session ended with status and closes its connections. It
// reports false if the session had already ended.
func (s *Session) end(status, reason string) bool {
	s.mu.Lock()
	if !live(s.status) {
		s.mu.Unlock()
		return false
	}
	s.status, s.statusReason = status, reason
	conns := s.conns
	s.conns = nil
	s.wakeResumedLocked()
	s.mu.Unlock()
	for e := range conns {
		if !e.notice && !e.pauseOnly { // a pause's notice says "paused": not this
			e.close()
		}
	}
	s.closeProxy()
	return true
}
