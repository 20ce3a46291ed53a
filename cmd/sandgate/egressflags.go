package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
)

// egressFlags are serve's flags for letting sessions out and for secrets.
type egressFlags struct {
	allow       listFlag
	allowCIDR   listFlag
	resolve     listFlag
	upstreamCA  string
	secretsFile string

	maxConnsSession, maxConnsTenant, maxConns int
	idleTimeout, halfCloseTimeout             time.Duration
	refusalsPerTenant                         int
	tripwireAction                            string
	askTimeout                                time.Duration
	askMaxPending, askMaxPendingTotal         int
	askMaxPendingTenant                       int
}

func (e *egressFlags) register(fs *flag.FlagSet) {
	fs.Var(&e.allow, "egress-allow", "the most any session's egress list may allow: `*` (any public host), *.suffix, a hostname or an IP, each with an optional :port (none: any port); repeatable (default *)")
	fs.Var(&e.allowCIDR, "egress-allow-cidr", "a non-public `CIDR` (10.0.0.0/8, 127.0.0.1/32) that egress may reach all the same, for on-prem services; repeatable")
	fs.Var(&e.resolve, "egress-resolve", "a static `NAME=IP` entry the egress proxy uses before DNS (as curl --resolve); the address is checked as any other; repeatable")
	fs.StringVar(&e.upstreamCA, "egress-upstream-ca", "", "PEM `file` of extra CAs that the egress proxy trusts, besides the system's, when it verifies a destination whose requests carry a bound secret")
	fs.StringVar(&e.secretsFile, "secrets-file", "", "`file` of secrets sessions may ask for by name: NAME=value, tenant/NAME=value, or either with @host,host after the name to pin the secret to those hosts; re-read on SIGHUP")
	fs.IntVar(&e.maxConnsSession, "egress-max-conns-per-session", egress.DefaultMaxConns, "connections one session may hold open through its egress proxy; past it: 503")
	fs.IntVar(&e.maxConnsTenant, "egress-max-conns-per-tenant", egress.DefaultMaxConnsPerTenant, "egress connections one tenant may hold open in all its sessions; past it: 503")
	fs.IntVar(&e.maxConns, "egress-max-conns", 0, fmt.Sprintf("egress connections on this gateway; past it: 503 (0: derived from the descriptor limit, a quarter of it at %d descriptors each, at most 4096)", egress.FDsPerConn))
	fs.DurationVar(&e.idleTimeout, "egress-idle-timeout", egress.DefaultIdleTimeout, "close an egress tunnel, or a plain http:// request (504), that moved no byte either way for this long")
	fs.IntVar(&e.refusalsPerTenant, "egress-refusals-per-tenant", egress.DefaultRefusalsPerTenant, "connections past an egress bound that one tenant's sessions answer 503 per second (after a burst of as many); beyond, a session accepts nothing until the next is due and new connections wait in its backlog")
	fs.StringVar(&e.tripwireAction, "tripwire-action", "block", "what a request carrying a bound secret's placeholder to a host the secret is not bound to does besides being refused and audited: `block` (nothing more) or stop (the session is stopped)")
	fs.DurationVar(&e.askTimeout, "egress-ask-timeout", egress.DefaultAskTimeout, "how long a connection of an egressMode \"ask\" session to a host outside its list waits for a decision (POST /v1/sessions/{id}/egress/pending/{pendingId}); a timeout is a denial")
	fs.IntVar(&e.askMaxPending, "egress-ask-max-pending", egress.DefaultMaxPending, "connections one session may have waiting for approval; past it: 429")
	fs.IntVar(&e.askMaxPendingTenant, "egress-ask-max-pending-per-tenant", egress.DefaultMaxPendingPerTenant, "connections one tenant's sessions may have waiting for approval in all (at most --egress-max-conns-per-tenant); past it: 429")
	fs.IntVar(&e.askMaxPendingTotal, "egress-ask-max-pending-total", egress.DefaultMaxPendingTotal, "connections waiting for approval on this gateway (at most --egress-max-conns); past it: 503")
	fs.DurationVar(&e.halfCloseTimeout, "egress-half-close-timeout", egress.DefaultHalfCloseTimeout, "close an egress tunnel once one side has closed and the other moved no byte for this long")
}

// config builds the egress proxy and its bounds.
func (e *egressFlags) config(log *slog.Logger, met egress.Metrics) (*gateway.EgressConfig, error) {
	allow := e.allow
	if len(allow) == 0 {
		allow = listFlag{"*"}
	}
	bounds, err := egress.ParseBounds(allow)
	if err != nil {
		return nil, fmt.Errorf("--egress-allow: %w", err)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"--egress-max-conns-per-session", e.maxConnsSession}, {"--egress-max-conns-per-tenant", e.maxConnsTenant}, {"--egress-max-conns", e.maxConns},
		{"--egress-refusals-per-tenant", e.refusalsPerTenant}, {"--egress-ask-max-pending", e.askMaxPending}, {"--egress-ask-max-pending-per-tenant", e.askMaxPendingTenant}, {"--egress-ask-max-pending-total", e.askMaxPendingTotal}} {
		if f.v < 0 {
			return nil, fmt.Errorf("%s %d: want a count, or 0 for the default", f.name, f.v)
		}
	}
	if e.tripwireAction != "block" && e.tripwireAction != "stop" {
		return nil, fmt.Errorf("--tripwire-action %q: want block or stop", e.tripwireAction)
	}
	if e.idleTimeout < 0 || e.halfCloseTimeout < 0 || e.askTimeout < 0 {
		return nil, errors.New("--egress-idle-timeout, --egress-half-close-timeout and --egress-ask-timeout must not be negative")
	}
	cfg := egress.Config{Log: log, Hosts: map[string][]netip.Addr{}, Metrics: met,
		MaxConns: e.maxConnsSession, MaxConnsPerTenant: e.maxConnsTenant, MaxConnsTotal: e.maxConns,
		IdleTimeout: e.idleTimeout, HalfCloseTimeout: e.halfCloseTimeout, RefusalsPerSecond: e.refusalsPerTenant,
		AskTimeout: e.askTimeout, MaxPending: e.askMaxPending, MaxPendingPerTenant: e.askMaxPendingTenant, MaxPendingTotal: e.askMaxPendingTotal}
	for _, c := range e.allowCIDR {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("--egress-allow-cidr: %w", err)
		}
		cfg.AllowCIDRs = append(cfg.AllowCIDRs, p.Masked())
	}
	for _, r := range e.resolve {
		name, ip, ok := strings.Cut(r, "=")
		addr, err := netip.ParseAddr(ip)
		if !ok || name == "" || err != nil {
			return nil, fmt.Errorf("--egress-resolve %q: want NAME=IP", r)
		}
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		cfg.Hosts[name] = append(cfg.Hosts[name], addr.Unmap())
	}
	if e.upstreamCA != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		b, err := os.ReadFile(e.upstreamCA)
		if err != nil {
			return nil, fmt.Errorf("--egress-upstream-ca: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, errors.New("--egress-upstream-ca: no PEM certificate in the file")
		}
		cfg.UpstreamRoots = pool
	}
	p, err := egress.New(cfg)
	if err != nil {
		return nil, err
	}
	l := p.Limits()
	cidrs := strings.Join(e.allowCIDR, ",")
	if cidrs == "" {
		cidrs = "none"
	}
	log.Info("egress", "allow", strings.Join(allow, ","), "allow_cidr", cidrs, "max_conns_per_session", l.MaxConns, "max_conns_per_tenant", l.MaxConnsPerTenant,
		"max_conns", l.MaxConnsTotal, "idle_timeout", l.IdleTimeout.String(), "half_close_timeout", l.HalfCloseTimeout.String(),
		"refusals_per_tenant", l.RefusalsPerSecond)
	// Approvals (egressMode "ask") on a line of their own: one summary
	// line stays short enough to read.
	log.Info("egress_ask", "timeout", l.AskTimeout.String(), "max_pending", l.MaxPending, "max_pending_per_tenant", l.MaxPendingPerTenant, "max_pending_total", l.MaxPendingTotal)
	return &gateway.EgressConfig{Proxy: p, Bounds: bounds, TripwireStop: e.tripwireAction == "stop"}, nil
}

// secrets opens the secrets file, if any, and re-reads it on SIGHUP until
// ctx is done. A reload that fails keeps the previous secrets.
func (e *egressFlags) secrets(ctx context.Context, log *slog.Logger) (gateway.SecretSource, error) {
	if e.secretsFile == "" {
		return nil, nil
	}
	f, err := gateway.OpenSecrets(e.secretsFile)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(e.secretsFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the secrets file can be read by other users", "path", e.secretsFile, "mode", fi.Mode().Perm().String())
	}
	log.Info("secrets_loaded", "path", e.secretsFile, "count", f.Count())
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := f.Reload(); err != nil {
					log.Error("secrets_reload_failed", "err", err)
					continue
				}
				log.Info("secrets_reloaded", "path", e.secretsFile, "count", f.Count())
			}
		}
	}()
	return f, nil
}
