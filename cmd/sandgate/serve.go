package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/cluster"
	"github.com/sandgate/sandgate/console"
	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/connlimit"
	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/procgov"
	"github.com/sandgate/sandgate/internal/readyfile"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sshd"
	"github.com/sandgate/sandgate/tunnel"
)

type serveConfig struct {
	listen            string
	publicURL         string
	previewDomain     string
	dataDir           string
	apiKeys           listFlag
	jwtSecretFile     string
	jwtPublicKeyFile  string
	jwtIssuer         string
	jwtAudience       string
	jwtTenantClaim    string
	jwtTenantPrefix   string
	maxSessions       int
	maxPerTenant      int
	idleTimeout       time.Duration
	idleAction        string
	pausedTTL         time.Duration
	tombstoneTTL      time.Duration
	rateLimit         int
	sshAuth           listFlag
	sshEnvAllow       listFlag
	sandboxDriver     string
	sandbox           *sandboxFlags
	resources         gateway.ResourceBounds
	tlsCert, tlsKey   string
	shutdownTimeout   time.Duration
	keepSandboxes     bool
	handshakeTimeout  time.Duration
	sshLocalForward   bool
	readHeaderTimeout time.Duration
	logFormat         string
	logLevel          string
	readyFile         string
	maxWaiting        int
	maxWaitingPerIP   int
	sshMaxStartups    startupsFlag
	sshStartupsEach   int
	imageAllow        listFlag
	imageAlias        listFlag
	imagePull         string
	insecureRegistry  listFlag
	images            imageFlags
	egress            egressFlags
	dataPlane         dataPlaneFlags
	workspaces        workspaceFlags
	agentSandbox      agentSandboxFlags
	metricsToken      string
	metricsListen     string
	audit             auditFlags
	cluster           clusterFlags
	kube              kubeFlags
	configFile        string
	printConfig       bool
	flags             *flag.FlagSet // as parsed: --print-config prints it
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sandgate")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "sandgate")
	}
	return filepath.Join(os.TempDir(), "sandgate")
}

const serveHelp = `Usage: sandgate serve [flags]

Runs the gateway: the REST API and the CONNECT tunnels to the sessions'
SSH servers, on one port. With no flags it serves http://127.0.0.1:8080,
keeps its state in the data dir and prints a generated API key once.
Every flag not given reads its environment twin, shown in brackets
(--max-sessions: $SANDGATE_MAX_SESSIONS), then the --config file (YAML,
one key per flag: "max-sessions: 200"). --print-config shows the result.
`

// parseServe parses serve's command line; -h or --help is flag.ErrHelp.
func parseServe(args []string, _ io.Writer) (*serveConfig, error) {
	c := &serveConfig{}
	fs := serveFlagSet(c)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return c.finish(fs)
}

// serveFlagSet declares serve's flags into c.
func serveFlagSet(c *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	quietFlags(fs)
	fs.StringVar(&c.configFile, "config", "", "YAML (or, named *.toml, TOML) file of settings, one key per flag without its dashes (max-sessions: 200; api-key: [a:KEY1, b:KEY2]); flags and SANDGATE_* twins override it")
	fs.BoolVar(&c.printConfig, "print-config", false, "print the effective settings, as a --config file with secrets masked, and exit")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address for the REST API and CONNECT tunnels")
	fs.StringVar(&c.publicURL, "public-url", "", "the gateway's URL as clients reach it (https://sandgate.example.com): the base of presigned links and preview URLs; without it, the address a client's connection reached (never the request's Host header)")
	fs.StringVar(&c.previewDomain, "preview-domain", rest.DefaultPreviewDomain, "domain under which each preview gets an origin of its own, p{port}-{label}.DOMAIN, served on --listen; needs a wildcard DNS record (and certificate) for *.DOMAIN unless it is localhost, which browsers and curl resolve to this host's loopback")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir(), "directory for host keys, the API key and session workdirs")
	fs.Var(&c.apiKeys, "api-key", "API key, `tenant:key` or a bare key for tenant default (repeatable)")
	fs.StringVar(&c.jwtSecretFile, "jwt-secret-file", "", "file holding the HS256 secret for JWT bearer tokens")
	fs.StringVar(&c.jwtPublicKeyFile, "jwt-public-key-file", "", "PEM public key (RSA for RS256, Ed25519 for EdDSA) for JWT bearer tokens")
	fs.StringVar(&c.jwtIssuer, "jwt-issuer", "", "required JWT iss")
	fs.StringVar(&c.jwtAudience, "jwt-audience", "", "required JWT aud")
	fs.StringVar(&c.jwtTenantClaim, "jwt-tenant-claim", gateway.DefaultJWTTenantClaim, "JWT claim (a string) that names the tenant")
	fs.StringVar(&c.jwtTenantPrefix, "jwt-tenant-prefix", gateway.DefaultJWTTenantPrefix, "prefix of JWT tenants, so they cannot collide with API-key tenants (\"\" shares the namespace on purpose)")
	fs.IntVar(&c.maxSessions, "max-sessions", 1000, "live sessions on this gateway")
	fs.IntVar(&c.maxPerTenant, "max-sessions-per-tenant", 100, "live sessions per tenant")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 30*time.Minute, "expire sessions idle for this long (0 disables)")
	fs.StringVar(&c.idleAction, "idle-action", gateway.IdleExpire, "what --idle-timeout does to an idle session: expire (delete it), or pause (pause it in place, memory kept, where the sandbox driver can: docs/pause.md; it expires after --paused-ttl paused)")
	fs.DurationVar(&c.pausedTTL, "paused-ttl", time.Hour, "with --idle-action pause, expire a session paused for being idle after this long still idle (0: only its ttl ends it)")
	fs.DurationVar(&c.tombstoneTTL, "tombstone-ttl", gateway.DefaultTombstoneTTL, "deleted or expired sessions answer 410 session_gone, saying when and why, for this long (0 disables)")
	fs.IntVar(&c.rateLimit, "rate-limit", 600, "requests per minute per principal (0 disables)")
	fs.Var(&c.sshAuth, "ssh-auth", "SSH auth methods accepted on an authorised tunnel (default none,password,publickey)")
	fs.Var(&c.sshEnvAllow, "ssh-env-allow", "extra environment names SSH clients may set (repeatable; NAME or PREFIX*)")
	fs.StringVar(&c.sandboxDriver, "sandbox", "auto", "sandbox driver: linux, workdir, or auto (linux where namespaces work)")
	c.sandbox = registerSandboxFlags(fs)
	fs.StringVar(&c.tlsCert, "tls-cert", "", "TLS certificate file (serve HTTPS)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "TLS key file")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long SIGTERM waits for running commands")
	fs.BoolVar(&c.keepSandboxes, "keep-sandboxes-on-exit", true, "on shutdown keep sessions for the next start (linux: sandboxes keep running; workdir: files are kept, processes end); false tears everything down")
	fs.DurationVar(&c.handshakeTimeout, "ssh-handshake-timeout", 30*time.Second, "SSH handshake and auth deadline")
	fs.BoolVar(&c.sshLocalForward, "ssh-allow-local-forward", true, "allow SSH local port forwarding (ssh -L) to the sandbox's own loopback, and preview URLs (/v1/sessions/{id}/ports/...), which reach the same ports; remote, agent and X11 forwarding are always refused")
	fs.DurationVar(&c.readHeaderTimeout, "read-header-timeout", 10*time.Second, "HTTP request header deadline")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.IntVar(&c.maxWaiting, "max-waiting-conns", 1024, "connections that have not sent a whole HTTP request, in total; past it the oldest are closed")
	fs.IntVar(&c.maxWaitingPerIP, "max-waiting-conns-per-ip", 128, "connections that have not sent a whole HTTP request, per source IP; past it that source's oldest are closed")
	c.sshMaxStartups = startupsFlag(sshd.DefaultStartups)
	fs.Var(&c.sshMaxStartups, "ssh-max-startups", "tunnels in SSH authentication at once, `start:rate:full` as OpenSSH's MaxStartups: from start on, rate% of new ones are dropped, rising to 100% at full")
	fs.IntVar(&c.sshStartupsEach, "ssh-max-startups-per-principal", sshd.DefaultStartupsPerPrincipal, "tunnels of one principal (tenant) in SSH authentication at once; past it a CONNECT answers 429 too_many_ssh_startups (--ssh-max-startups stays the gateway-wide bound; negative: no budget per principal)")
	fs.Var(&c.imageAllow, "image-allow", "images a create may pull on demand: an exact reference or a prefix ending in * (docker.io/library/*, ghcr.io/acme/*); repeatable")
	fs.Var(&c.imageAlias, "image-alias", "`NAME=REF`: a create asking for image NAME (python:3.11-slim) gets REF, an image present or allowed to be pulled, or default (the host-root image); repeatable")
	fs.StringVar(&c.imagePull, "image-pull", "missing", "on-demand pulls: missing (pull an allowed image a create asks for) or never")
	fs.Var(&c.insecureRegistry, "insecure-registry", "registry (HOST:PORT) reached over plain HTTP or unverified TLS; repeatable")
	fs.StringVar(&c.readyFile, "ready-file", "", "once listening, write the gateway's URL (one line, e.g. http://127.0.0.1:8080) to this file, atomically; removed on exit. With --listen 127.0.0.1:0 it is how supervisors and tests learn the port")
	fs.StringVar(&c.metricsToken, "metrics-token", "", "serve Prometheus metrics at GET /metrics on --listen to requests bearing this token (Authorization: Bearer TOKEN); without it, and without --metrics-listen, /metrics is 404")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve Prometheus metrics at GET /metrics on this second address (plain HTTP, no token: keep it private, e.g. 127.0.0.1:9090)")
	c.images.register(fs)
	c.egress.register(fs)
	c.dataPlane.register(fs)
	c.audit.register(fs)
	c.cluster.register(fs)
	c.kube.register(fs)
	c.workspaces.register(fs)
	c.agentSandbox.register(fs)
	return fs
}

// finish completes c once fs has parsed the command line: environment
// twins, defaults and checks.
func (c *serveConfig) finish(fs *flag.FlagSet) (*serveConfig, error) {
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := applyEnv(fs); err != nil {
		return nil, err
	}
	if c.configFile != "" {
		if err := applyConfigFile(fs, c.configFile); err != nil {
			return nil, err
		}
	}
	c.flags = fs
	if _, _, err := parseImageAliases(c.imageAlias); err != nil {
		return nil, err
	}
	if len(c.sshAuth) == 0 {
		c.sshAuth = listFlag{sshd.AuthNone, sshd.AuthPassword, sshd.AuthPublicKey}
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if c.idleAction != gateway.IdleExpire && c.idleAction != gateway.IdlePause {
		return nil, fmt.Errorf("--idle-action must be %s or %s, got %q", gateway.IdleExpire, gateway.IdlePause, c.idleAction)
	}
	if c.pausedTTL < 0 {
		return nil, errors.New("--paused-ttl must not be negative")
	}
	if c.publicURL != "" {
		if err := rest.CheckPublicURL(c.publicURL); err != nil {
			return nil, fmt.Errorf("--public-url: %w", err)
		}
	}
	if err := rest.CheckPreviewDomain(c.previewDomain); err != nil {
		return nil, fmt.Errorf("--preview-domain: %w", err)
	}
	res, err := c.sandbox.bounds()
	if err != nil {
		return nil, err
	}
	c.resources = res
	if err := c.workspaces.check(); err != nil {
		return nil, err
	}
	if err := c.dataPlane.check(); err != nil {
		return nil, err
	}
	if err := c.agentSandbox.check(); err != nil {
		return nil, err
	}
	if _, err := c.agentSandbox.checkImage(c); err != nil {
		return nil, err
	}
	if err := c.cluster.checkEgress(context.Background(), c.egress.allowCIDR); err != nil {
		return nil, err
	}
	return c, nil
}

func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	// audit.LogHandler: lines logged with a request's context name its id.
	switch format {
	case "text":
		return slog.New(audit.LogHandler(slog.NewTextHandler(w, opts))), nil
	case "json":
		return slog.New(audit.LogHandler(slog.NewJSONHandler(w, opts))), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, got %q", format)
}

func serveMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseServe(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		printHelp(stdout, serveFlagSet(&serveConfig{}), serveHelp, envName)
		return 0
	}
	if err != nil {
		printUsageError(stderr, "serve", err)
		return 2
	}
	if cfg.printConfig {
		if err := printConfig(stdout, cfg.flags); err != nil {
			fmt.Fprintln(stderr, "sandgate serve:", err)
			return 1
		}
		return 0
	}
	log, err := newLogger(cfg.logFormat, cfg.logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate serve:", err)
		return 2
	}
	// --sandbox linux refuses to start without its privileges, naming the
	// one missing (preflight_linux.go, docs/kubernetes.md).
	if cfg.sandboxDriver == "linux" {
		if err := checkLinuxPrivileges(cfg.sandbox.requireLimits); err != nil {
			fmt.Fprintln(stderr, "sandgate serve:", err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// x/crypto/ssh and pkg/sftp copy every packet they receive into a
	// fresh buffer. A lazy collector (GOGC 400) saves 10-20% of the
	// gateway's CPU on uploads (bench/ rows 3a, 3c, 4a); the governor
	// lowers it as the live heap grows, so the garbage stays near
	// 64 MiB, and sets a soft memory limit above that goal after
	// collections, so a live heap that jumps does not meet a GOGC set
	// for a smaller one (internal/procgov). GOGC, when set, wins.
	if _, ok := os.LookupEnv("GOGC"); !ok {
		heap := procgov.NewHeap(procgov.HeapConfig{Log: log})
		heapCtx, stopHeap := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); heap.Run(heapCtx) }()
		defer func() { stopHeap(); <-done }()
	}
	// GOMAXPROCS follows the gateway's load (internal/procgov), unless
	// the environment fixes it (as the runtime reads it: a number > 0).
	if n, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err != nil || n < 1 {
		gov := procgov.New(procgov.Config{Runtime: procgov.GoRuntime{}, CPU: procgov.ProcessCPU, Log: log})
		govCtx, stopGov := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); gov.Run(govCtx) }()
		defer func() { stopGov(); <-done }()
	}
	if err := serve(ctx, cfg, log, stdout); err != nil {
		log.Error("serve_failed", "err", err)
		var ue *usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

// authConfig builds token verification from the flags, generating and
// storing an API key when nothing else is configured.
func authConfig(cfg *serveConfig, stdout io.Writer, log *slog.Logger) (gateway.AuthConfig, error) {
	ac := gateway.AuthConfig{
		APIKeys: map[string]string{}, JWTIssuer: cfg.jwtIssuer, JWTAudience: cfg.jwtAudience,
		JWTTenantClaim: cfg.jwtTenantClaim, JWTTenantPrefix: &cfg.jwtTenantPrefix,
	}
	for _, k := range cfg.apiKeys {
		tenant, key, ok := strings.Cut(k, ":")
		if !ok {
			tenant, key = "default", k
		}
		if tenant == "" || key == "" {
			return ac, errors.New("--api-key must be tenant:key or a bare key")
		}
		ac.APIKeys[key] = tenant
	}
	if cfg.jwtSecretFile != "" {
		b, err := os.ReadFile(cfg.jwtSecretFile)
		if err != nil {
			return ac, fmt.Errorf("--jwt-secret-file: %w", err)
		}
		ac.JWTSecret = []byte(strings.TrimSpace(string(b)))
		if len(ac.JWTSecret) == 0 {
			return ac, errors.New("--jwt-secret-file: the file is empty")
		}
		if len(ac.JWTSecret) < 32 {
			log.Warn("the HS256 secret is shorter than 32 bytes; tokens signed with it are easier to forge", "bytes", len(ac.JWTSecret))
		}
	}
	if cfg.jwtPublicKeyFile != "" {
		b, err := os.ReadFile(cfg.jwtPublicKeyFile)
		if err != nil {
			return ac, fmt.Errorf("--jwt-public-key-file: %w", err)
		}
		if ac.JWTPublicKey, err = gateway.ParsePublicKeyPEM(b); err != nil {
			return ac, fmt.Errorf("--jwt-public-key-file: %w", err)
		}
	}
	if len(ac.APIKeys) > 0 || ac.JWTSecret != nil || ac.JWTPublicKey != nil {
		return ac, nil
	}
	path := filepath.Join(cfg.dataDir, "api-key")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		log.Info("using the API key stored in the data dir", "path", path)
	case errors.Is(err, fs.ErrNotExist):
		b = []byte(gateway.NewAPIKey())
		if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
			return ac, fmt.Errorf("store generated API key: %w", err)
		}
		fmt.Fprintf(stdout, "# sandgate generated an API key (stored in %s); it is printed only this once:\nexport SANDBOX_API_TOKEN=%s\n", path, b)
	default:
		return ac, fmt.Errorf("read API key: %w", err)
	}
	ac.APIKeys[strings.TrimSpace(string(b))] = "default"
	return ac, nil
}

// loadOrCreateLinkKey returns the key that signs presigned file links,
// kept in <data-dir>/link-key (mode 0600) so links survive a restart;
// removing the file revokes every link at the next start.
func loadOrCreateLinkKey(dataDir string, log *slog.Logger) ([]byte, error) {
	path := filepath.Join(dataDir, "link-key")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != rest.LinkKeyBytes {
			return nil, fmt.Errorf("link key %s: %d bytes, want %d (remove it to make a new one)", path, len(b), rest.LinkKeyBytes)
		}
		return b, nil
	case errors.Is(err, fs.ErrNotExist):
		b = rest.NewLinkKey()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("store link key: %w", err)
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return nil, fmt.Errorf("store link key: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("store link key: %w", err)
		}
		log.Info("generated the link signing key", "path", path)
		return b, nil
	default:
		return nil, fmt.Errorf("read link key: %w", err)
	}
}

func serve(ctx context.Context, cfg *serveConfig, log *slog.Logger, stdout io.Writer) error {
	raiseNofile(log)
	// Absolute, so that paths made from it stay right in processes that
	// start elsewhere (a workdir sandbox's commands and SFTP server run in
	// the session's directory).
	dataDir, err := filepath.Abs(cfg.dataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	cfg.dataDir = dataDir
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	unlock, err := lockDataDir(cfg.dataDir) // before the driver restores or removes sandboxes
	if err != nil {
		return err
	}
	defer unlock()
	ac, err := authConfig(cfg, stdout, log)
	if err != nil {
		return err
	}
	verifier, err := gateway.NewVerifier(ac)
	if err != nil {
		return err
	}
	signers, err := sshd.LoadOrCreateHostKeys(cfg.dataDir)
	if err != nil {
		return err
	}
	linkKey, err := loadOrCreateLinkKey(cfg.dataDir, log)
	if err != nil {
		return err
	}
	driver, err := openDriver(cfg.sandboxDriver, sandbox.Config{
		DataDir: cfg.dataDir, Log: log, Limits: cfg.sandbox.limits, AllowUserNS: cfg.sandbox.allowUserNS,
		Nofile: cfg.sandbox.nofile, Checkpoint: cfg.sandbox.checkpoint, CRIU: cfg.sandbox.criu, PauseFreeze: cfg.sandbox.pauseFreeze, EagerForks: cfg.sandbox.forkEager,
		// Restore below re-attaches what the store knows and removes the rest.
		KeepOrphans: true,
	})
	if err != nil {
		return err
	}
	var report map[string]any
	if r, ok := driver.(sandbox.Reporter); ok {
		report = r.Report()
	}
	logSandboxSummary(log, driver, report)
	if driver.Name() == "linux" {
		warnHostPools(log, readHostPools(), sandboxDemand{maxSessions: cfg.maxSessions,
			maxPids: cfg.resources.MaxPids(), nofile: cfg.sandbox.nofile.WithDefaults()})
	}
	store, err := gateway.OpenBoltStore(filepath.Join(cfg.dataDir, "sessions.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	if cfg.imagePull != "missing" && cfg.imagePull != "never" {
		return fmt.Errorf("--image-pull %q: want missing or never", cfg.imagePull)
	}
	met := metrics.New()
	auditLog, err := cfg.audit.open(cfg.dataDir, log, met)
	if err != nil {
		return err
	}
	var auditor audit.Auditor = audit.Discard
	var auditQuery rest.AuditLog
	if auditLog != nil {
		defer auditLog.Close()
		auditor, auditQuery = auditLog, auditLog
	}
	egressCfg, err := cfg.egress.config(log, met)
	if err != nil {
		return err
	}
	istore, err := cfg.images.open(cfg, egressCfg.Proxy, log)
	if err != nil {
		return err
	}
	isrc, err := newImageSource(istore, cfg.imageAllow, cfg.imagePull == "missing", cfg.insecureRegistry, log)
	if err != nil {
		return err
	}
	isrc.noImages = driver.Name() != "linux"
	isrc.pulls.max = cfg.images.pullsPerTenant
	defaultImages, err := isrc.setAliases(cfg.imageAlias)
	if err != nil {
		return err
	}
	if err := cfg.agentSandbox.checkImageIn(cfg, isrc); err != nil {
		return err
	}
	secrets, err := cfg.egress.secrets(ctx, log)
	if err != nil {
		return err
	}
	secrets, kubeSecrets := cfg.kube.secrets(secrets)
	wsvc, err := cfg.workspaces.open(cfg.dataDir, log)
	if err != nil {
		return err
	}
	mcfg := gateway.Config{
		MaxSessions: cfg.maxSessions, MaxSessionsPerTenant: cfg.maxPerTenant,
		IdleTimeout: idleOrDisabled(cfg.idleTimeout), IdleAction: cfg.idleAction, PausedTTL: idleOrDisabled(cfg.pausedTTL), Store: store, ImageSource: isrc,
		Resources: forDriver(cfg.resources, driver), Egress: egressCfg, Secrets: secrets,
		Metrics:      met,
		Audit:        auditor,
		TombstoneTTL: idleOrDisabled(cfg.tombstoneTTL),
		Workspaces:   wsvc,
		Images:       defaultImages,
		WarmPool:     cfg.sandbox.warmPoolFor(driver),
		// Sandboxes of ended sessions released in the background.
		TeardownQueue: cfg.sandbox.teardownQueue,
	}
	mcfg.WarmPoolImageTTL, mcfg.WarmPoolImages, mcfg.WarmPoolMemory = cfg.sandbox.warmImageTTL, cfg.sandbox.warmImages, cfg.sandbox.warmMemory
	var mgr *gateway.Manager
	var node *cluster.Node
	if cfg.cluster.enabled() {
		node, err = cfg.cluster.open(ctx, cfg, log, func() int { return liveSessions(mgr) })
		if err != nil {
			return err
		}
		if cfg.publicURL == "" {
			log.Warn("cluster node without --public-url: presigned links and preview URLs name the owner node's own address, which clients may not reach; give every node the same --public-url")
		}
		// After the manager's Shutdown: kept sessions wait for this node to come back.
		defer node.Close(cfg.keepSandboxes)
		mcfg.Store, mcfg.Directory = node.Store(store), node
		wsvc.SetLocks(node.WorkspaceLocks()) // one holder of a workspace in the cluster
	}
	mgr = gateway.NewManager(mcfg, driver, log)
	if err := mgr.Restore(ctx); err != nil {
		return err
	}
	releaseStaleImageRefs(istore, mgr, log)
	kubeCtl, err := cfg.kube.open(cfg.cluster.kubeconfig, mgr, kubeSecrets, sshd.AuthorizedKeys(signers)[0], log)
	if err != nil {
		return err
	}
	met.WatchSessions(mgr, gateway.StatusRunning, gateway.StatusStopped, gateway.StatusPaused, gateway.StatusFailed)
	met.WatchWarm(mgr)
	met.WatchTeardowns(mgr)
	ssh, err := sshd.New(sshd.Config{
		HostSigners: signers, AuthMethods: cfg.sshAuth, EnvAllow: cfg.sshEnvAllow,
		HandshakeTimeout: cfg.handshakeTimeout, MaxStartups: sshd.Startups(cfg.sshMaxStartups), Log: log,
		Metrics: met, LocalForward: cfg.sshLocalForward, Audit: auditor,
		MaxStartupsPerPrincipal: cfg.sshStartupsEach,
	})
	if err != nil {
		return err
	}
	iso, unenforced := isolation(driver)
	tun := tunnel.NewServer(mgr, ssh.ServeConnContext, rest.WriteGatewayError, log,
		tunnel.WithAdmitter(ssh), tunnel.WithMetrics(met), tunnel.WithAudit(auditor))
	stopping := make(chan struct{}) // closed at the drain's end: REST commands still running are answered
	// The data plane's state, shared by /v1 and the compat APIs.
	plane := dataplane.NewPlane(cfg.dataPlane.config(cfg, egressCfg.Proxy))
	// The seeds' own APIs (docs/compat.md), served beside /v1.
	presigner, _ := any(wsvc).(rest.ArtifactPresigner)
	agentSandbox, err := cfg.agentSandbox.config(&cfg.workspaces)
	if err != nil {
		return err
	}
	compatAPIs, closeCompat := compat.NewWithClose(compat.Deps{Sessions: mgr, Plane: plane, Log: log, AgentSandbox: agentSandbox,
		ImageAliases: imageAliasNames(cfg.imageAlias),
		Links:        rest.Links{Key: linkKey, PublicURL: cfg.publicURL, Artifacts: presigner, Log: log}})
	handler := rest.New(rest.Config{
		Sessions: mgr, Verifier: verifier, Log: log, RateLimit: cfg.rateLimit, Mounts: compatAPIs,
		SSHUsername: "sandbox", HostKeys: sshd.AuthorizedKeys(signers), Connect: tun, Images: isrc,
		Isolation: iso, Unenforced: unenforced,
		Ready: func() (map[string]any, error) {
			// Asked each time: sandboxes adopted without the filter come and go.
			return map[string]any{"sandbox": driver.Name(), "limits": report, "seccomp": seccompStatus(driver)}, nil
		},
		Plane:         plane,
		LinkKey:       linkKey,
		Metrics:       met,
		NoPorts:       !cfg.sshLocalForward, // preview URLs reach ports as -L does
		PublicURL:     cfg.publicURL,
		PreviewDomain: cfg.previewDomain,
		Audit:         auditor,
		AuditLog:      auditQuery,
		Workspaces:    wsvc,
		Stopping:      stopping,
		Console:       console.Handler(), // /ui/
		ServerTiming:  cfg.sandbox.serverTiming,
	})
	var front *cluster.Front
	if node != nil {
		peerTLS, err := cfg.cluster.peerTLS()
		if err != nil {
			return err
		}
		front = cluster.NewFront(cluster.FrontConfig{
			Node: node, Sessions: mgr, Verifier: verifier, Local: handler, WriteError: rest.WriteGatewayError,
			RateLimit: cfg.rateLimit, PeerTLS: peerTLS, CompatSession: compat.SessionOf, OwnerCredential: compat.OwnerCredential, Log: log,
			PreviewSession: rest.PreviewSession(cfg.previewDomain),
		})
		handler = front
	}
	if cfg.metricsToken != "" {
		// A preview origin's /metrics is its sandbox's server's.
		api, preview := handler, rest.PreviewSession(cfg.previewDomain)
		mounted := metrics.Mount(handler, met.Handler(cfg.metricsToken))
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := preview(r); ok {
				api.ServeHTTP(w, r)
				return
			}
			mounted.ServeHTTP(w, r)
		})
	}
	handler = sandboxRouter(handler, rest.PreviewSession(cfg.previewDomain))
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	waiting := connlimit.New(connlimit.Config{MaxWaiting: cfg.maxWaiting, MaxWaitingPerIP: cfg.maxWaitingPerIP, Log: log})
	waiting.Install(srv)
	defer waiting.Close() // logs the closings of the last window
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	scheme := "http"
	if cfg.tlsCert != "" {
		scheme = "https"
	}
	url := scheme + "://" + ln.Addr().String()
	var msrv *http.Server
	if cfg.metricsListen != "" {
		mln, err := net.Listen("tcp", cfg.metricsListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		msrv = &http.Server{
			Handler:           metrics.Mount(http.NotFoundHandler(), met.Handler("")),
			ReadHeaderTimeout: cfg.readHeaderTimeout,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
		go func() { _ = msrv.Serve(mln) }()
		defer msrv.Close()
		log.Info("metrics_listening", "url", "http://"+mln.Addr().String()+"/metrics")
	}
	if cfg.readyFile != "" {
		if err := readyfile.Write(cfg.readyFile, url); err != nil {
			ln.Close()
			return fmt.Errorf("--ready-file: %w", err)
		}
		defer os.Remove(cfg.readyFile)
	}
	reapCtx, stopReaper := context.WithCancel(context.Background())
	reaped := make(chan struct{})
	synced := make(chan struct{})
	go func() {
		defer close(reaped)
		mgr.Run(reapCtx)
	}()
	go func() {
		defer close(synced)
		wsvc.Run(reapCtx)
	}()
	go returnMemory(reapCtx, log)
	served := make(chan error, 1)
	go func() {
		if cfg.tlsCert != "" {
			served <- srv.ServeTLS(ln, cfg.tlsCert, cfg.tlsKey)
		} else {
			served <- srv.Serve(ln)
		}
	}()
	log.Info("listening", "url", url, "data_dir", cfg.dataDir, "sandbox", driver.Name())
	warnPreviewReach(log, cfg, ln.Addr())
	stopKube := runKube(ctx, kubeCtl, cmp.Or(cfg.publicURL, url), log)

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting_down", "timeout", cfg.shutdownTimeout)
		if node != nil {
			node.Drain() // no new sessions are placed here
		}
	case serveErr = <-served:
	}
	stopKube() // the Lease is let go; no create races the shutdown
	drain, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(drain); err != nil { // stop accepting; REST requests in flight finish
		// Some did not: commands still running are ended and answered,
		// which takes a moment (the end of their output is read).
		close(stopping)
		last, cancelLast := context.WithTimeout(context.Background(), answerGrace)
		_ = srv.Shutdown(last)
		cancelLast()
	}
	ssh.Shutdown(drain) // tell shells, let commands finish, then close
	tun.Shutdown(drain) // close tunnels still open
	if front != nil {
		front.Shutdown() // close relayed tunnels
	}
	plane.Close() // the idle SFTP servers of the REST data plane
	stopReaper()
	<-reaped
	<-synced
	mgr.Shutdown(context.Background(), cfg.keepSandboxes)
	compatDone, cancelCompat := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	if err := closeCompat(compatDone); err != nil { // the cleanups of ended sandboxes' stored files
		log.Warn("compat_close_failed", "err", err)
	}
	cancelCompat()
	flushWorkspaces(wsvc, cfg.shutdownTimeout, log)
	log.Info("stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// warnPreviewReach warns when preview URLs, under *.localhost, reach only
// clients on this host while the gateway serves others.
func warnPreviewReach(log *slog.Logger, cfg *serveConfig, addr net.Addr) {
	if cfg.previewDomain != rest.DefaultPreviewDomain || !cfg.sshLocalForward {
		return
	}
	host := ""
	if cfg.publicURL != "" {
		if u, err := url.Parse(cfg.publicURL); err == nil {
			host = u.Hostname()
		}
	} else if ta, ok := addr.(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
		host = ta.IP.String()
	}
	if host == "" || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return
	}
	log.Warn("preview URLs are under *.localhost, which reaches this gateway only from its own host; "+
		"set --preview-domain to a domain whose wildcard record points here", "public_host", host)
}

// answerGrace is how long, after the shutdown drain, REST commands still
// running have to be ended and answered (dataplane.OutputGrace and a
// write).
const answerGrace = 5 * time.Second

func idleOrDisabled(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
