package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/sandgate/sandgate/images"
)

// imageFlags are serve's bounds on the image store and on-demand pulls
// (the allow-list and --image-pull live with the other serve flags).
type imageFlags struct {
	storeMax     int64
	maxImage     int64
	pullTimeout  time.Duration
	stallTimeout time.Duration
	// pullsPerTenant bounds the images one tenant has being pulled on
	// demand at once.
	pullsPerTenant int
}

func (f *imageFlags) register(fs *flag.FlagSet) {
	fs.Var((*sizeFlag)(&f.storeMax), "image-store-max", "most the image store's layers may take on disk, blocks counted (holes are free); an unpack past it fails with 503 image_store_full: bytes or a size such as 100GiB (default: half the data dir's filesystem)")
	fs.Var((*sizeFlag)(&f.maxImage), "image-max-size", "largest image, uncompressed (its tar streams and its files' lengths); a larger one fails with 400 image_too_large: bytes or a size such as 16GiB (default 32GiB)")
	fs.DurationVar(&f.pullTimeout, "image-pull-timeout", images.DefaultPullTimeout, "deadline of a whole on-demand pull; past it the create fails with 502 image_pull_timeout")
	fs.IntVar(&f.pullsPerTenant, "image-pulls-per-tenant", DefaultImagePullsPerTenant, "distinct images one tenant may have being pulled on demand at once (creates of an image it is pulling already wait for that pull); a create past it is 429 too_many_image_pulls")
	fs.DurationVar(&f.stallTimeout, "image-pull-stall-timeout", images.DefaultStallTimeout, "an on-demand pull fails (502 image_pull_timeout) when a registry sends nothing for this long")
}

// open opens the image store under the gateway's bounds. Registries the
// operator named (in --image-allow patterns, --insecure-registry, and the
// proxy of the environment) are dialled as they are; any other host, the
// servers registries redirect to included, only at an address egress's
// rule allows (public, or inside --egress-allow-cidr). Through an HTTP
// proxy of the environment the rule is applied to a request's host before
// the proxy is given it.
func (f *imageFlags) open(cfg *serveConfig, eg registryGuard, log *slog.Logger) (*images.Store, error) {
	if f.pullTimeout <= 0 || f.stallTimeout <= 0 {
		return nil, fmt.Errorf("--image-pull-timeout and --image-pull-stall-timeout must be positive")
	}
	if f.pullsPerTenant <= 0 {
		return nil, fmt.Errorf("--image-pulls-per-tenant must be positive")
	}
	if f.storeMax < 0 || f.maxImage < 0 {
		return nil, fmt.Errorf("--image-store-max and --image-max-size must not be negative")
	}
	trusted := trustedRegistries(cfg.imageAllow, cfg.insecureRegistry)
	s, err := images.Open(cfg.dataDir,
		images.WithDialer(registryDialer(trusted, eg)),
		images.WithProxy(registryProxy(trusted, eg, httpproxy.FromEnvironment().ProxyFunc())),
		images.WithLimits(images.Limits{MaxImageBytes: f.maxImage, MaxLayerBytes: f.maxImage}),
		images.WithStoreLimits(images.StoreLimits{MaxBytes: f.storeMax}),
		images.WithPullTimeouts(f.pullTimeout, f.stallTimeout))
	if err != nil {
		return nil, err
	}
	lim := s.StoreLimits()
	allow := strings.Join(cfg.imageAllow, ",")
	if allow == "" || cfg.imagePull == "never" {
		allow = "none"
	}
	log.Info("images", "dir", s.Dir(), "pull", cfg.imagePull, "pull_allowed", allow,
		"store_max", ibytes(lim.MaxBytes), "min_free", ibytes(lim.MinFreeBytes), "pull_timeout", f.pullTimeout.String(),
		"stall_timeout", f.stallTimeout.String(), "trusted_registries", strings.Join(trusted, ","))
	return s, nil
}

// trustedRegistries are the registries (host or host:port) the operator
// named: each --image-allow pattern's that names one, each
// --insecure-registry, and the hosts of the environment's HTTP proxies.
func trustedRegistries(allow, insecure []string) []string {
	var out []string
	for _, p := range allow {
		if r := images.PatternRegistry(p); r != "" {
			out = append(out, r)
		}
	}
	out = append(out, insecure...)
	for _, v := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		if u, err := url.Parse(os.Getenv(v)); err == nil && u.Host != "" {
			out = append(out, u.Host)
		}
	}
	return out
}

// registryGuard is egress's address rule, to dial by and to check a
// host by without dialling it.
type registryGuard interface {
	publicDialer
	CheckPublic(ctx context.Context, addr string) error
}

// trustedAddrs are the host:port pairs of trusted: an entry without a
// port trusts its host on 443 and 80.
func trustedAddrs(trusted []string) map[string]bool {
	ok := map[string]bool{}
	for _, t := range trusted {
		t = strings.ToLower(t)
		if _, _, err := net.SplitHostPort(t); err == nil {
			ok[t] = true
			continue
		}
		ok[net.JoinHostPort(t, "443")] = true
		ok[net.JoinHostPort(t, "80")] = true
	}
	return ok
}

// registryProxy is the store's HTTP proxy: envProxy's answer, given only
// for a request to a trusted registry or to a host eg's address rule
// allows. The proxy's own host is trusted by the dialer, so without this
// a registry's redirect to e.g. 169.254.169.254 would be fetched by the
// proxy unchecked.
func registryProxy(trusted []string, eg registryGuard, envProxy func(*url.URL) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	ok := trustedAddrs(trusted)
	return func(req *http.Request) (*url.URL, error) {
		proxy, err := envProxy(req.URL)
		if err != nil || proxy == nil {
			return proxy, err
		}
		port := req.URL.Port()
		if port == "" {
			port = "80"
			if req.URL.Scheme == "https" {
				port = "443"
			}
		}
		addr := net.JoinHostPort(strings.ToLower(req.URL.Hostname()), port)
		if ok[addr] {
			return proxy, nil
		}
		if eg == nil {
			return nil, fmt.Errorf("%s is not a registry the gateway was told to trust", addr)
		}
		if err := eg.CheckPublic(req.Context(), addr); err != nil {
			return nil, fmt.Errorf("%s is not a registry the gateway was told to trust, so the egress address rule applies: %w", addr, err)
		}
		return proxy, nil
	}
}

// registryDialer dials a trusted registry as it is, and anything else
// through eg's address rule.
func registryDialer(trusted []string, eg publicDialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	ok := trustedAddrs(trusted)
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ok[strings.ToLower(addr)] {
			return d.DialContext(ctx, network, addr)
		}
		if eg == nil {
			return nil, fmt.Errorf("%s is not a registry the gateway was told to trust", addr)
		}
		c, err := eg.DialPublic(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("%s is not a registry the gateway was told to trust, so the egress address rule applies: %w", addr, err)
		}
		return c, nil
	}
}
