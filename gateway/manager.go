package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/sandbox"
)

// Driver is the part of sandbox.Driver the Manager uses: tests hand it
// drivers that wrap a real one.
type Driver interface {
	Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error)
}

// Config bounds the Manager. Zero values get the defaults noted.
type Config struct {
	// MaxSessions caps live sessions on the gateway (default 1000).
	MaxSessions int
	// MaxSessionsPerTenant caps live sessions per tenant (default 100).
	MaxSessionsPerTenant int
	// IdleTimeout expires a session with no REST or SSH activity for this
	// long (default 30m; negative disables).
	IdleTimeout time.Duration
	// IdleAction is what happens to an idle session (pause.go): IdleExpire
	// (default) or IdlePause, which pauses a running one whose driver can
	// pause (others expire as before).
	IdleAction string
	// PausedTTL, with IdleAction IdlePause, expires a paused session
	// after this long with no activity past its idle limit, that is, this
	// long after an idle pause (default 1h; negative: only its TTL ends it).
	PausedTTL time.Duration
	// ReapInterval is how often the reaper looks for expired sessions (default 1s).
	ReapInterval time.Duration
	// Images are the names of the default root, accepted at create
	// (default ["default"]); the first is what an omitted image means.
	Images []string
	// ImageSource resolves every other image name (nil: none exists).
	ImageSource ImageSource
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Store keeps sessions across restarts (default: in memory only).
	Store Store
	// Resources are the defaults and caps of session resources.
	Resources ResourceBounds
	// Egress lets sessions out through an egress proxy (nil: sessions
	// have no network, and asking for egress is egress_unavailable).
	Egress *EgressConfig
	// Secrets resolves the secrets sessions ask for (nil: none exists).
	Secrets SecretSource
	// Metrics receives counts and latencies (nil: none kept; metrics.go).
	Metrics Metrics
	// Audit receives the audit trail's events (nil: none kept; audit.go).
	Audit audit.Auditor
	// TombstoneTTL is how long an ended session answers session_gone
	// rather than not_found (default 24h; negative disables tombstones).
	TombstoneTTL time.Duration
	// MaxTombstones bounds the tombstones kept, oldest dropped first
	// (default 10000).
	MaxTombstones int
	// Directory, in cluster mode, holds the sessions of every node (nil:
	// this gateway's sessions are all there are; directory.go).
	Directory Directory
	// Workspaces keeps workspaces beyond sessions (nil: none; a create
	// that names a workspace or snapshot is workspaces_unavailable).
	Workspaces Workspaces
	// WarmPool is how many sandboxes of the default root are kept built
	// and idle for creates to claim, once Run runs (0: none; warmpool.go).
	WarmPool int
	// WarmPoolImageTTL, with WarmPool, gives each image other than the
	// default root that a create used within this long a pool of its own
	// (0: none; warmimages.go).
	WarmPoolImageTTL time.Duration
	// WarmPoolImages bounds the images with a pool at once (0:
	// DefaultWarmPoolImages).
	WarmPoolImages int
	// WarmPoolMemory bounds the memory of the warm sandboxes: an image's
	// pool adds one only while all of them stay within it (0:
	// DefaultWarmPoolMemory).
	WarmPoolMemory int64
	// TeardownQueue is how many ended sessions' sandboxes may be released
	// in the background at once: a Delete answers once the session cannot
	// be reached (and its named workspace is synced), and a Delete past
	// this bound releases its own sandbox before it answers (0: every
	// Delete does, as before).
	TeardownQueue int
}

// Manager owns every live session.
type Manager struct {
	cfg    Config
	driver Driver
	log    *slog.Logger

	mu       sync.Mutex
	sessions map[string]*Session
	pending  map[string]int       // creates in progress per tenant
	inflight map[idemKey][32]byte // idempotency keys of creates in progress, to their payload's fingerprint
	naming   map[nameKey]struct{} // names of creates in progress (names.go)
	stopping bool                 // Shutdown has begun: sandboxes end on purpose
	// followers counts the streams of pending connections per tenant
	// and in all (approvals.go).
	followers followers
	// forking counts the forks under way (MaxConcurrentForks), and those
	// answered whose images are being removed.
	forking atomic.Int32
	// adopter takes the commands a pause by checkpoint hands over
	// (SetAdopter, handoff.go).
	adopter atomic.Pointer[Adopter]
	// forkMu guards forkRemoving, the forks answered whose images are
	// being removed (their slots held), and forkFreed, closed (then
	// replaced) when one of those removals ends (takeForkSlot).
	forkMu       sync.Mutex
	forkRemoving int
	forkFreed    chan struct{}
	// writeMu orders the writes of records that Update and saveActivity
	// make from snapshots, so an older snapshot never overwrites a newer one.
	writeMu sync.Mutex
	// undestroyed are ended sessions whose sandbox Destroy failed; Run
	// retries them so nothing of a deleted session survives.
	undestroyed []*Session
	// tomb are the tombstones of ended sessions (tombstone.go).
	tomb     *tombstones
	tombOnce sync.Once
	// pool holds the warm sandboxes (nil: Config.WarmPool is 0).
	pool *warmPool
	// imagePools hold the warm sandboxes of images (nil: none;
	// warmimages.go).
	imagePools *imagePools
	// releasing holds a slot per sandbox being released in the
	// background (cap Config.TeardownQueue); released waits for them.
	releasing chan struct{}
	released  sync.WaitGroup
	// The releases deferred during a burst of creates (teardown.go):
	// tdQueue, oldest first, is run by one runReleases while tdRunning;
	// creating and lastCreate (unix ns) say whether creates are under way.
	tdMu       sync.Mutex
	tdQueue    []deferredRelease
	tdRunning  bool
	tdKick     chan struct{}
	creating   atomic.Int32
	lastCreate atomic.Int64
}

// watch marks s failed if its sandbox ends while the session still runs.
func (m *Manager) watch(s *Session) {
	d, ok := s.sandbox.(sandbox.Ender)
	if !ok {
		return
	}
	go func() {
		<-d.Done()
		m.mu.Lock()
		stopping, managed := m.stopping, m.sessions[s.ID] == s
		m.mu.Unlock()
		// An unmanaged session is being deleted or reaped: that path owns
		// its record, which must not be written back.
		if stopping || !managed || !s.end(StatusFailed, "the sandbox exited unexpectedly") {
			return
		}
		m.log.Error("session_failed", "session", s.ID, "tenant", s.Tenant, "reason", "sandbox exited")
		m.auditSession(context.Background(), s, "failed", "the sandbox exited unexpectedly", "")
		if err := m.cfg.Store.Put(s.Snapshot()); err != nil {
			m.log.Error("store_failed", "session", s.ID, "err", err)
		}
		m.detachWorkspace(context.Background(), s)
		if err := s.sandbox.Destroy(context.Background()); err != nil {
			m.log.Error("sandbox_destroy_failed", "session", s.ID, "err", err)
		}
	}()
}

// NewManager returns a Manager that creates sandboxes with driver.
func NewManager(cfg Config, driver Driver, log *slog.Logger) *Manager {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 1000
	}
	if cfg.MaxSessionsPerTenant <= 0 {
		cfg.MaxSessionsPerTenant = 100
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 30 * time.Minute
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.IdleAction == "" {
		cfg.IdleAction = IdleExpire
	}
	if cfg.PausedTTL == 0 {
		cfg.PausedTTL = time.Hour
	}
	if len(cfg.Images) == 0 {
		cfg.Images = []string{"default"}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Store == nil {
		cfg.Store = NewMemStore()
	}
	cfg.Resources = cfg.Resources.withDefaults()
	m := &Manager{cfg: cfg, driver: driver, log: log, sessions: map[string]*Session{}, pending: map[string]int{}, inflight: map[idemKey][32]byte{},
		releasing: make(chan struct{}, max(cfg.TeardownQueue, 0)), tdKick: make(chan struct{}, 1)}
	if cfg.WarmPool > 0 {
		m.pool = newWarmPool(cfg.WarmPool, func(ctx context.Context, id string) (sandbox.Sandbox, error) {
			return driver.Create(ctx, sandbox.Spec{ID: id, Warm: true})
		}, m.destroyWarm, log)
	}
	m.imagePools = newImagePools(m)
	return m
}

// CreateParams are the caller's choices for a new session.
type CreateParams struct {
	// TTL in seconds; 0 means DefaultTTL.
	TTL      int
	Image    string
	Metadata map[string]any
	// SSHPublicKey is one authorized_keys line without options, or "".
	SSHPublicKey string
	// IdempotencyKey, when set, makes the create idempotent for the
	// tenant (see IdempotencyWindow).
	IdempotencyKey string
	// Resources, when set, are the sandbox's limits; nil fields get the
	// gateway's defaults (Config.Resources).
	Resources *ResourceRequest
	// Egress is the allow-list of destinations the session may reach
	// through its egress proxy; empty means no network.
	Egress []string
	// EgressMode is what a connection outside Egress meets: "deny" (or
	// "", refused) or "ask" (parked for approval, approvals.go).
	EgressMode string
	// Secrets are the operator's secrets (by name) the session gets.
	Secrets []SecretRef
	// Name, when set, names the session: unique among the tenant's live
	// sessions (see checkName).
	Name string
	// Workspace, when set, is what /workspace starts from (workspaces.go).
	Workspace WorkspaceRef
	// Env is put into every process's environment (env.go: at most
	// MaxEnvVars, not the gateway's own variables); a SandboxClaim's env.
	Env map[string]string
	// SecretScope, when set and the SecretSource is ScopedSecrets, is
	// where the session's secrets are looked up: values given for this
	// session alone (a Kubernetes Session's Secrets), not the tenant's.
	SecretScope string
}

// Create makes a session and its sandbox for p. It returns the session and
// its SSH password, which is not kept and cannot be read again.
//
// With an IdempotencyKey the tenant used before for a session that still
// exists, Create makes nothing: it returns that session and an empty
// password (a replay), or an error if the key came with another payload
// (idempotency_key_reused) or its first create is still running
// (idempotency_key_in_progress).
func (m *Manager) Create(ctx context.Context, p Principal, cp CreateParams) (*Session, string, error) {
	return m.create(ctx, p, cp, nil)
}

// create is Create; from, when set, makes the sandbox from a fork's
// checkpoint instead of the driver (fork.go).
func (m *Manager) create(ctx context.Context, p Principal, cp CreateParams, from *forkSource) (*Session, string, error) {
	start := time.Now()
	tr := sandbox.TraceOf(ctx)
	c, err := m.checkCreate(p, &cp)
	if err != nil {
		return nil, "", err
	}
	key := idemKey{p.Tenant, cp.IdempotencyKey}
	prior, err := m.reserve(key, c.fp)
	if err != nil {
		return nil, "", err
	}
	tr.Mark("check")
	if prior != nil {
		m.log.InfoContext(ctx, "session_create_replayed", "session", prior.ID, "tenant", p.Tenant)
		return prior, "", nil
	}
	// Only a create that will build holds teardowns back: one refused
	// above (a tenant's invalid creates, or a replay) does not.
	m.createActivity(true)
	defer m.createActivity(false)
	// Each step that holds something pushes its undoing; a create that
	// fails (or panics) takes them back in reverse, one that succeeds
	// disarms them.
	var u undo
	defer u.run()
	u.push(func() { m.release(key) })
	name := nameKey{p.Tenant, cp.Name}
	if err := m.claimName(name); err != nil {
		return nil, "", err
	}
	u.push(func() { m.unclaimName(name) })

	lim := m.cfg.Resources.limits(cp.Resources)
	var img *sandbox.Image
	if !slices.Contains(m.cfg.Images, c.image) {
		// The principal goes along: the source bounds each tenant's pulls.
		if img, err = m.cfg.ImageSource.Resolve(WithPrincipal(ctx, p), c.image); err != nil {
			return nil, "", err
		}
	}
	// The egress CA intercepts HTTPS to hosts with bound secrets, and to
	// hosts only rules per request allow, whose requests it reads.
	rulesOnlyCA := !slices.ContainsFunc(c.secrets, SecretRef.Bound) && slices.ContainsFunc(c.allow.Entries(), egress.IsObjectEntry)
	withCA := slices.ContainsFunc(c.secrets, SecretRef.Bound) || rulesOnlyCA
	var w warm
	warmed := false
	if from == nil {
		w, warmed = m.takeWarm(img, lim, withCA)
	}
	id := "" // a fresh one
	if warmed {
		id = w.id
	}
	s, pw := m.newSession(p, cp, c, id)
	if warmed {
		u.push(func() {
			if s.sandbox == nil { // it never became the session's
				m.destroyWarm(w)
			}
		})
	}
	if err := m.claimWorkspace(ctx, s); err != nil {
		return nil, "", err
	}
	u.push(func() { m.detachWorkspace(ctx, s) })
	tr.Mark("session")
	spec := sandbox.Spec{ID: s.ID, Limits: lim}
	if from != nil {
		// A fork's trust store is its source's, restored with it.
		if err := from.shareCA(s); err != nil {
			return nil, "", err
		}
		spec.TrustPEM = s.egressCAPEM
	} else if withCA {
		if err := s.newEgressCA(); err != nil {
			return nil, "", &Error{Kind: KindInternal, Code: "egress_failed", Message: "could not make the session's egress CA", Err: err}
		}
		spec.TrustPEM = s.egressCAPEM
	}
	if img != nil {
		// A warm sandbox of the image holds it under its id already, as a
		// warm hold: Hold makes it the session's (an image removal then
		// waits for the session).
		if err := m.cfg.ImageSource.Hold(s.ID, img); err != nil {
			if !w.held {
				return nil, "", &Error{Kind: KindUnavailable, Code: "image_failed", Message: "could not hold the image for the session", Err: err}
			}
			// The warm hold stays: the layers are kept all the same.
			m.log.Warn("image_hold_failed", "session", s.ID, "image", img.Name, "err", err)
		}
		spec.Image, s.ImageDigest = img, img.Digest
	}
	var sb sandbox.Sandbox
	u.push(func() {
		if w.held && sb == nil {
			return // the warm sandbox's destroy (destroyWarm) lets go of it
		}
		// The image is let go once no sandbox uses it: none was made, or
		// it was destroyed.
		if sb == nil || sb.Destroy(context.WithoutCancel(ctx)) == nil {
			m.releaseImage(s)
		}
	})
	if from != nil {
		sb, err = from.restore(ctx, spec)
	} else {
		sb, err = m.sandboxFor(ctx, spec, w, warmed)
	}
	if err != nil && from == nil && rulesOnlyCA && errors.Is(err, sandbox.ErrNoTrust) {
		// A driver with no trust store (workdir, whose sessions share the
		// host's network): rules are read on plain http:// only. The warm
		// sandbox, if any, is gone already (only linux rebinds).
		s.egressCA, s.egressCAPEM, s.egressCAKey = nil, nil, nil
		spec.TrustPEM = nil
		sb, err = m.driver.Create(ctx, spec)
	}
	if err != nil {
		sb = nil
		return nil, "", m.sandboxCreateFailed(ctx, s, err)
	}
	s.sandbox = sb
	if err := m.attachWorkspace(ctx, s, true); err != nil {
		m.logCreateStep(ctx, "workspace_attach_failed", s, err)
		return nil, "", err
	}
	tr.Mark("workspace_attach")
	if s.needsProxy() {
		if err := m.openProxy(ctx, s); err != nil {
			m.logCreateStep(ctx, "egress_proxy_failed", s, err)
			m.auditSession(ctx, s, "create_failed", "egress proxy: "+err.Error(), "")
			return nil, "", err
		}
		u.push(s.closeProxy)
		if s.hasSSHKey() && s.agentSocket() == "" {
			if _, ok := sandbox.As[sandbox.AgentListener](s.sandbox); !ok {
				return nil, "", Invalid("egress_unsupported", "ssh-key secrets need a sandbox driver that can give sessions an SSH agent; the linux driver can")
			}
			return nil, "", &Error{Kind: KindUnavailable, Code: "egress_failed", Message: "could not start the session's SSH agent (ssh-key secrets)"}
		}
		tr.Mark("egress_proxy")
	}
	// The record is durable before the client hears of the session; a crash
	// before this point leaves only a sandbox without a record, which the
	// next start removes.
	if err := m.cfg.Store.Put(s.Snapshot()); err != nil {
		m.log.Error("store_failed", "session", s.ID, "err", err)
		if ge, ok := errors.AsType[*Error](err); ok { // a cluster store's refusal (quota, no quorum)
			return nil, "", ge
		}
		return nil, "", &Error{Kind: KindUnavailable, Code: "store_failed", Message: "could not record the session", Err: err}
	}
	u.push(func() { _ = m.cfg.Store.Delete(s.ID) })
	tr.Mark("store")
	s.savedActivity.Store(s.CreatedAt.UnixNano())
	if err := m.publish(s, key, name); err != nil {
		return nil, "", err
	}
	u.disarm()
	m.watch(s)
	m.auditSession(ctx, s, "created", "", "")
	source := SandboxCold
	switch {
	case from != nil:
		source = SandboxFork
	case warmed && s.sandbox == w.sb:
		source = SandboxWarm
	}
	m.log.InfoContext(ctx, "session_created", "session", s.ID, "tenant", p.Tenant, "name", cp.Name, "ttl", cp.TTL, "image", c.image,
		"egress", len(s.egressAllow), "secrets", len(c.secrets), "warm", source == SandboxWarm)
	m.metrics().SessionCreated(time.Since(start), source)
	return s, pw, nil
}

// undo is a stack of steps that take back what a create has done so far.
type undo []func()

// push adds f, to run before every step pushed earlier.
func (u *undo) push(f func()) { *u = append(*u, f) }

// disarm forgets the steps: what they would take back is kept.
func (u *undo) disarm() { *u = nil }

// run runs the steps, the last pushed first (deferred by the create).
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
}

// createChecked is what checkCreate made of a create's parameters.
type createChecked struct {
	image, sshKey string
	res           Resources
	allow         egress.List
	secrets       []SecretRef
	egressMode    string   // EgressModeAsk or ""
	fp            [32]byte // the payload's fingerprint (idempotency.go)
}

// checkCreate checks a create's parameters, filling cp's defaults (TTL,
// Metadata), before anything is reserved.
func (m *Manager) checkCreate(p Principal, cp *CreateParams) (c createChecked, err error) {
	if cp.TTL == 0 {
		cp.TTL = DefaultTTL
	}
	if cp.TTL < MinTTL || cp.TTL > MaxTTL {
		return c, Invalid("invalid_ttl", fmt.Sprintf("ttl must be between %d and %d seconds, got %d", MinTTL, MaxTTL, cp.TTL))
	}
	if c.image, err = m.image(cp.Image); err != nil {
		return c, err
	}
	if err := checkIdempotencyKey(cp.IdempotencyKey); err != nil {
		return c, err
	}
	if err := checkName(cp.Name); err != nil {
		return c, err
	}
	if c.sshKey, err = checkSSHPublicKey(cp.SSHPublicKey); err != nil {
		return c, err
	}
	if cp.Metadata == nil {
		cp.Metadata = map[string]any{}
	}
	if err := checkMetadata(cp.Metadata); err != nil {
		return c, err
	}
	if c.res, err = m.cfg.Resources.resolve(cp.Resources); err != nil {
		return c, err
	}
	if c.allow, err = m.checkEgress(cp.Egress); err != nil {
		return c, err
	}
	if c.secrets, err = m.checkSecrets(m.secretSource(cp.SecretScope), p.Tenant, cp.Secrets, c.allow); err != nil {
		return c, err
	}
	if err := checkEnv(cp.Env, c.secrets); err != nil {
		return c, err
	}
	if c.egressMode, err = m.checkEgressMode(cp.EgressMode); err != nil {
		return c, err
	}
	var fpRes *Resources // the defaults fingerprint as before resources existed
	if c.res != m.cfg.Resources.Default {
		fpRes = &c.res
	}
	c.fp = fingerprint(cp.TTL, c.image, cp.Metadata, c.sshKey, fpRes, c.allow.Entries(), c.secrets, cp.Name, cp.Workspace)
	if c.egressMode != "" { // counted only when given: older fingerprints stay the same
		c.fp = sha256.Sum256(append(c.fp[:], "egressMode="+c.egressMode...))
	}
	return c, nil
}

// newSession is the session a create makes, and its SSH password.
// id is the session's id ("": a new one).
func (m *Manager) newSession(p Principal, cp CreateParams, c createChecked, id string) (*Session, string) {
	now := m.cfg.Now().UTC()
	pw := newPassword()
	res := c.res
	if id == "" {
		id = newID()
	}
	s := &Session{
		ID: id, Tenant: p.Tenant, Name: cp.Name, Image: c.image, Metadata: cp.Metadata,
		CreatedAt: now, expiresAt: now.Add(time.Duration(cp.TTL) * time.Second), ttl: cp.TTL,
		SSHPublicKey: c.sshKey, IdempotencyKey: cp.IdempotencyKey, Resources: &res, secretScope: cp.SecretScope,
		Secrets: c.secrets, egressAllow: c.allow.Entries(), egressMode: c.egressMode,
		passwordHash: sha256.Sum256([]byte(pw)),
		status:       StatusRunning,
		conns:        map[*connEntry]struct{}{},
	}
	m.own(s)
	if cp.IdempotencyKey != "" {
		s.requestHash = c.fp
	}
	s.lastActivity.Store(now.UnixNano())
	s.Workspace = cp.Workspace
	s.Env = maps.Clone(cp.Env)
	return s, pw
}

// own gives s what it asks of the manager that holds it, as values: the
// secrets, the auditor, the metrics, and the resume of a stopped session.
// The session keeps no pointer to m.
func (m *Manager) own(s *Session) {
	s.secrets, s.auditor, s.metrics = m.secretSource(s.secretScope), m.cfg.Audit, m.cfg.Metrics
	s.resume = func(ctx context.Context) error { return m.resume(ctx, s) }
	s.unpause = func(ctx context.Context) error { return m.unpause(ctx, s) }
}

// sandboxCreateFailed logs and audits a driver's failure to make s's
// sandbox, and is the error the client gets.
func (m *Manager) sandboxCreateFailed(ctx context.Context, s *Session, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		// The client went away while its sandbox was built (whatever
		// step noticed it first): nothing failed that an operator must
		// look at.
		m.log.InfoContext(ctx, "sandbox_create_abandoned", "session", s.ID, "tenant", s.Tenant, "reason", "client disconnected", "err", err)
		m.auditSession(ctx, s, "create_failed", "client disconnected", "")
		return &Error{Kind: KindUnavailable, Code: "sandbox_failed", Message: "the create was abandoned: the client disconnected", Err: err}
	}
	m.log.ErrorContext(ctx, "sandbox_create_failed", "session", s.ID, "tenant", s.Tenant, "err", err)
	m.auditSession(ctx, s, "create_failed", err.Error(), "")
	if bad, ok := errors.AsType[*sandbox.BadImageError](err); ok {
		return Invalid("unusable_image", bad.Error())
	}
	if errors.Is(err, sandbox.ErrNoImages) {
		return Invalid("images_unsupported", sandbox.ErrNoImages.Error())
	}
	if errors.Is(err, sandbox.ErrNoTrust) {
		return Invalid("egress_unsupported", "secrets bound to hosts need the linux sandbox driver: "+sandbox.ErrNoTrust.Error())
	}
	return &Error{Kind: KindUnavailable, Code: "sandbox_failed", Message: "could not create the sandbox", Err: err}
}

// publish makes s one of the manager's sessions, unless the gateway is
// shutting down; from then on the session itself counts towards its
// tenant's quota and holds its name, in place of the create's reservations.
func (m *Manager) publish(s *Session, key idemKey, name nameKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping { // Shutdown already took the sessions it will end or keep
		return &Error{Kind: KindUnavailable, Code: "shutting_down", Message: "the gateway is shutting down"}
	}
	m.sessions[s.ID] = s
	m.releaseLocked(key)
	m.unclaimNameLocked(name)
	return nil
}

// image is the image name a create asked for, "" meaning the default
// root: a name of the default root, or one the image source knows (it is
// resolved, and pulled if need be, later).
func (m *Manager) image(name string) (string, error) {
	if name == "" {
		return m.cfg.Images[0], nil
	}
	if slices.Contains(m.cfg.Images, name) {
		return name, nil
	}
	if m.cfg.ImageSource != nil {
		if err := m.cfg.ImageSource.Check(name); err != nil {
			return "", err
		}
		return name, nil
	}
	return "", Invalid("unknown_image", fmt.Sprintf("unknown image %q; available images: %s", name, strings.Join(m.cfg.Images, ", ")))
}

// releaseImage lets go of the image s's sandbox used, once the sandbox is
// gone.
func (m *Manager) releaseImage(s *Session) {
	if s.ImageDigest != "" && m.cfg.ImageSource != nil {
		m.cfg.ImageSource.Release(s.ID)
	}
}

// capacityRetry is the Retry-After of a create refused because the gateway is full.
const capacityRetry = 30 * time.Second

// reserve takes a quota slot for k's tenant, counting creates still in
// progress, and marks k's idempotency key (if any) as in progress. When
// the key already made a session with the payload fp, it returns that
// session and takes nothing.
func (m *Manager) reserve(k idemKey, fp [32]byte) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping {
		return nil, &Error{Kind: KindUnavailable, Code: "shutting_down", Message: "the gateway is shutting down"}
	}
	if k.key != "" {
		if s := m.replayLocked(k, m.cfg.Now()); s != nil {
			if s.requestHash != fp {
				return nil, errKeyReused()
			}
			return s, nil
		}
		if h, ok := m.inflight[k]; ok {
			if h != fp {
				return nil, errKeyReused()
			}
			return nil, errKeyInProgress()
		}
	}
	total, mine := 0, m.pending[k.tenant]
	for _, p := range m.pending {
		total += p
	}
	for _, s := range m.sessions {
		if !s.Live() {
			continue // failed sessions hold no sandbox
		}
		total++
		if s.Tenant == k.tenant {
			mine++
		}
	}
	// The tenant's own limit first: it may name it. The gateway's limit is
	// not named, as it would tell a tenant how many sessions others hold.
	if mine >= m.cfg.MaxSessionsPerTenant {
		return nil, &Error{Kind: KindQuota, Code: "quota_exceeded", Message: fmt.Sprintf("tenant session limit reached (max-sessions-per-tenant=%d)", m.cfg.MaxSessionsPerTenant)}
	}
	if total >= m.cfg.MaxSessions {
		return nil, &Error{Kind: KindUnavailable, Code: "capacity", Message: "the gateway cannot take more sessions now; retry later", RetryAfter: capacityRetry}
	}
	m.pending[k.tenant]++
	if k.key != "" {
		m.inflight[k] = fp
	}
	return nil, nil
}

func (m *Manager) release(k idemKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseLocked(k)
}

func (m *Manager) releaseLocked(k idemKey) {
	if m.pending[k.tenant]--; m.pending[k.tenant] <= 0 {
		delete(m.pending, k.tenant)
	}
	if k.key != "" {
		delete(m.inflight, k)
	}
}

// Get returns p's session id (or name, see Resolve), running or failed.
// Another tenant's session is ErrNotFound.
func (m *Manager) Get(ctx context.Context, p Principal, id string) (*Session, error) {
	id = m.Resolve(ctx, p, id)
	m.mu.Lock()
	s, ok := m.sessions[id]
	m.mu.Unlock()
	if !ok || s.Tenant != p.Tenant {
		if rs := m.remote(ctx, p, id); rs != nil {
			return rs, nil
		}
		return nil, m.notFound(p, id)
	}
	return s, nil
}

// List returns p's sessions, oldest first, and how many there are in all.
func (m *Manager) List(ctx context.Context, p Principal, limit, offset int) ([]*Session, int) {
	m.mu.Lock()
	var mine []*Session
	for _, s := range m.sessions {
		if s.Tenant == p.Tenant {
			mine = append(mine, s)
		}
	}
	m.mu.Unlock()
	mine = m.withRemote(ctx, p, mine)
	sort.Slice(mine, func(i, j int) bool {
		if !mine[i].CreatedAt.Equal(mine[j].CreatedAt) {
			return mine[i].CreatedAt.Before(mine[j].CreatedAt)
		}
		return mine[i].ID < mine[j].ID
	})
	total := len(mine)
	if offset >= total {
		return []*Session{}, total
	}
	end := min(offset+limit, total)
	return mine[offset:end], total
}

// UpdateParams are the changes an update makes to a session; nil fields
// stay as they are.
type UpdateParams struct {
	// TTL, when set, makes the session expire TTL seconds from now
	// (MinTTL..MaxTTL), and becomes the session's ttl.
	TTL *int
	// Egress, when set, replaces the session's egress allow-list; new
	// connections through its proxy follow it at once.
	Egress *[]string
}

// Update changes p's session id as up says and records the change in the
// store before it answers. Another tenant's session is ErrNotFound; a
// session that is not running (failed) is session_not_running.
func (m *Manager) Update(ctx context.Context, p Principal, id string, up UpdateParams) (*Session, error) {
	if up.TTL != nil && (*up.TTL < MinTTL || *up.TTL > MaxTTL) {
		return nil, Invalid("invalid_ttl", fmt.Sprintf("ttl must be between %d and %d seconds, got %d", MinTTL, MaxTTL, *up.TTL))
	}
	var allow egress.List
	if up.Egress != nil {
		var err error
		if allow, err = m.checkEgress(*up.Egress); err != nil {
			return nil, err
		}
	}
	s, err := m.Get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if !s.Live() {
		return nil, &Error{Kind: KindConflict, Code: "session_not_running", Message: "the session is not running; delete it"}
	}
	if up.TTL == nil && up.Egress == nil {
		return s, nil
	}
	s.life.RLock() // a stopped session opens its proxy when it resumes
	defer s.life.RUnlock()
	stopped := s.Status() == StatusStopped
	// Writes of this session's record are ordered: no activity save may
	// put back the old expiry (writeMu), and a Delete or the reaper, which
	// take the session out of the map before they delete its record,
	// either did so already or wait until this write is done (m.mu).
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[s.ID] != s || !s.Live() {
		return nil, ErrNotFound
	}
	var undo []func()
	if up.TTL != nil {
		now := m.cfg.Now().UTC()
		oldTTL, oldAt := s.setExpiry(*up.TTL, now.Add(time.Duration(*up.TTL)*time.Second))
		undo = append(undo, func() { s.setExpiry(oldTTL, oldAt) })
	}
	if up.Egress != nil {
		old := s.setEgressAllow(allow.Entries())
		undo = append(undo, func() { s.setEgressAllow(old) })
		if ps := s.egressProxy(); ps != nil {
			ps.SetPolicy(m.policy(s))
			undo = append(undo, func() { ps.SetPolicy(m.policy(s)) })
		} else if !allow.Empty() && !stopped {
			if err := m.openProxy(ctx, s); err != nil {
				s.setEgressAllow(old)
				if up.TTL != nil {
					undo[0]()
				}
				return nil, err
			}
		}
	}
	if err := m.cfg.Store.Put(s.Snapshot()); err != nil {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		// A store that keeps a failed write to retry it (a cluster node
		// without etcd) must keep the unchanged record instead.
		_ = m.cfg.Store.Put(s.Snapshot())
		m.log.Error("store_failed", "session", s.ID, "err", err)
		return nil, storeError(err)
	}
	args := []any{"session", s.ID, "tenant", p.Tenant}
	if up.TTL != nil {
		args = append(args, "ttl", *up.TTL)
	}
	if up.Egress != nil {
		args = append(args, "egress", allow.Entries())
	}
	m.log.Info("session_updated", args...)
	return s, nil
}

// Known reports whether the manager holds session id, of any tenant and
// in any state (running or failed).
func (m *Manager) Known(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.sessions[id]
	return ok
}

// Delete ends p's session id (or name, see Resolve) and destroys its sandbox.
func (m *Manager) Delete(ctx context.Context, p Principal, id string) error {
	id = m.Resolve(ctx, p, id)
	m.mu.Lock()
	s, ok := m.sessions[id]
	if !ok || s.Tenant != p.Tenant {
		m.mu.Unlock()
		return m.deleteRemote(ctx, p, id) // directory.go
	}
	delete(m.sessions, id)
	m.mu.Unlock()
	if err := m.end(ctx, s, GoneDeleted, &p, StatusDeleted, ""); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "session_deleted", "session", id, "tenant", p.Tenant)
	m.auditSession(ctx, s, "deleted", "", p.Tenant)
	m.metrics().SessionDeleted()
	return nil
}

// end buries s (gone, by: bury), forgets it, closes its connections and
// destroys its sandbox (status, reason: its last status). s must already
// be out of the sessions map. The tombstone and the record's removal go
// first, in one write when the store can (keepTombstone): a crash half-way
// through leaves a sandbox without a record, which the next start removes.
func (m *Manager) end(ctx context.Context, s *Session, gone string, by *Principal, status, reason string) error {
	if !m.keepTombstone(s, gone, by, true) {
		if err := m.cfg.Store.Delete(s.ID); err != nil {
			m.log.Error("store_failed", "session", s.ID, "err", err)
		}
	}
	if !s.end(status, reason) || s.sandbox == nil {
		return nil
	}
	m.detachWorkspace(ctx, s)
	// The session is unreachable now (no record, no connections, its
	// workspace synced): its sandbox may go in the background.
	select {
	case m.releasing <- struct{}{}:
		// Not once Shutdown has begun: it may have waited for the
		// releases already, and the process would end with this one
		// half done.
		if !m.releaseLater() {
			<-m.releasing
			break
		}
		release := func() {
			defer m.released.Done()
			defer func() { <-m.releasing }()
			_ = m.destroy(context.WithoutCancel(ctx), s)
		}
		// Its processes end now; the rest waits for the creates to
		// pause (teardown.go). A sandbox that cannot end them apart
		// is released at once: they would run on meanwhile.
		if !halt(s.sandbox) {
			go release()
			return nil
		}
		m.deferRelease(release)
		return nil
	default: // none configured, or all busy: this caller waits
	}
	return m.destroy(ctx, s)
}

// releaseLater counts a release about to run in the background, which
// Shutdown waits for; false once Shutdown has begun (the caller releases
// now). Under m.mu, as Shutdown sets stopping: every Add comes before its
// Wait.
func (m *Manager) releaseLater() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping {
		return false
	}
	m.released.Add(1)
	return true
}

// destroy destroys the sandbox of the ended session s; one that fails is
// retried by Run.
func (m *Manager) destroy(ctx context.Context, s *Session) error {
	if err := s.sandbox.Destroy(context.WithoutCancel(ctx)); err != nil {
		m.log.Error("sandbox_destroy_failed", "session", s.ID, "err", err)
		m.mu.Lock()
		m.undestroyed = append(m.undestroyed, s)
		m.mu.Unlock()
		return &Error{Kind: KindInternal, Code: "sandbox_failed", Message: "could not destroy the sandbox; it will be retried", Err: err}
	}
	m.releaseImage(s)
	return nil
}

// retryDestroy tries again to destroy the sandboxes whose Destroy failed.
func (m *Manager) retryDestroy(ctx context.Context) {
	m.mu.Lock()
	todo := m.undestroyed
	m.undestroyed = nil
	m.mu.Unlock()
	for _, s := range todo {
		if err := s.sandbox.Destroy(context.WithoutCancel(ctx)); err != nil {
			m.metrics().TeardownRetried(false)
			m.mu.Lock()
			m.undestroyed = append(m.undestroyed, s)
			m.mu.Unlock()
			continue
		}
		m.metrics().TeardownRetried(true)
		m.releaseImage(s)
		m.log.Info("sandbox_destroyed_on_retry", "session", s.ID)
	}
}

// Run expires sessions past their TTL or idle limit, and keeps the warm
// pool full, until ctx is done.
func (m *Manager) Run(ctx context.Context) {
	if m.pool != nil {
		m.pool.start(ctx)
	}
	m.imagePools.start(ctx)
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Reap(ctx)
			m.retryDestroy(ctx)
			m.saveActivity()
			m.PruneTombstones()
			m.imagePools.tend(m.cfg.Now())
		}
	}
}

// Reap expires every session past its TTL or idle limit now.
func (m *Manager) Reap(ctx context.Context) {
	now := m.cfg.Now()
	type victim struct {
		s      *Session
		reason string
	}
	var victims []victim
	var toPause []*Session
	pauseIdle := m.cfg.IdleAction == IdlePause
	m.mu.Lock()
	for id, s := range m.sessions {
		reason := ""
		idle := m.cfg.IdleTimeout > 0 && !s.Held() && now.Sub(s.LastActivity()) >= m.cfg.IdleTimeout
		switch {
		case !now.Before(s.ExpiresAt()):
			reason = "ttl"
		case idle && pauseIdle && s.Status() == StatusPaused:
			// Paused, it expires PausedTTL after its idle pause.
			if m.cfg.PausedTTL < 0 || now.Sub(s.LastActivity()) < m.cfg.IdleTimeout+m.cfg.PausedTTL {
				continue
			}
			reason = "idle"
		case idle && pauseIdle && s.Status() == StatusRunning && s.canPause():
			toPause = append(toPause, s)
			continue
		case idle:
			reason = "idle"
		default:
			continue
		}
		delete(m.sessions, id)
		victims = append(victims, victim{s, reason})
	}
	m.mu.Unlock()
	for _, s := range toPause {
		stillIdle := func() bool {
			now := m.cfg.Now()
			return !s.Held() && now.Sub(s.LastActivity()) >= m.cfg.IdleTimeout
		}
		if _, err := m.pause(context.WithoutCancel(ctx), s, "idle", stillIdle); err != nil && !errors.Is(err, errNotIdle) {
			m.log.Warn("session_idle_pause_failed", "session", s.ID, "err", err)
		}
	}
	for _, v := range victims {
		_ = m.end(ctx, v.s, map[string]string{"ttl": GoneTTL, "idle": GoneIdle}[v.reason], nil, StatusExpired, v.reason)
		m.log.Info("session_expired", "session", v.s.ID, "tenant", v.s.Tenant, "reason", v.reason)
		m.auditSession(context.WithoutCancel(ctx), v.s, "expired", v.reason, "")
		m.metrics().SessionExpired(v.reason)
	}
}

// saveActivity writes the activity times that moved since the last write,
// in one transaction, so idle clocks continue from them after a restart.
func (m *Manager) saveActivity() {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	var recs []Record
	var moved []*Session
	m.mu.Lock()
	for _, s := range m.sessions {
		if (s.lastActivity.Load() != s.savedActivity.Load() || s.egressUnsaved()) && s.Live() {
			recs = append(recs, s.Snapshot())
			moved = append(moved, s)
		}
	}
	m.mu.Unlock()
	if len(recs) == 0 {
		return
	}
	if err := m.cfg.Store.Put(recs...); err != nil {
		m.log.Error("store_failed", "err", err)
		return
	}
	for i, s := range moved {
		s.savedActivity.Store(recs[i].LastActivityAt.UnixNano())
		s.egressSaved(recs[i].Egress)
	}
}

// IdleTimeout is the configured idle limit (0 or negative: none).
func (m *Manager) IdleTimeout() time.Duration { return m.cfg.IdleTimeout }

// logCreateStep logs a create step's failure: an error, unless the client
// went away meanwhile (then at info, as sandbox_create_abandoned).
func (m *Manager) logCreateStep(ctx context.Context, what string, s *Session, err error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		m.log.InfoContext(ctx, "sandbox_create_abandoned", "session", s.ID, "step", what, "reason", "client disconnected", "err", err)
		return
	}
	m.log.ErrorContext(ctx, what, "session", s.ID, "err", err)
}
