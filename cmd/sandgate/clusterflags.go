package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandgate/sandgate/cluster"
	"github.com/sandgate/sandgate/cluster/kubestore"
	"github.com/sandgate/sandgate/gateway"
)

// clusterFlags are the flags of cluster mode (docs/cluster.md).
type clusterFlags struct {
	etcd         listFlag
	kube         bool
	kubeconfig   string
	kubeNS       string
	etcdCA       string
	etcdCert     string
	etcdKey      string
	etcdUser     string
	etcdPassFile string
	advertise    string
	nodeID       string
	tokenFile    string
	peerCA       string
	leaseTTL     time.Duration
	restartGrace time.Duration
	// forceEgress lets --egress-allow-cidr contain an etcd endpoint.
	forceEgress bool
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.Var(&c.etcd, "cluster-etcd", "etcd client URLs (comma-separated or repeated): run as a node of the cluster they hold; unset, the gateway stands alone")
	fs.BoolVar(&c.kube, "cluster-kube", false, "run as a node of the cluster whose shared store is the Kubernetes API (instead of --cluster-etcd): Leases and Secrets in --cluster-kube-namespace (docs/kubernetes.md; RBAC: deploy/rbac-store.yaml)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "with --cluster-kube or --kube-controller: kubeconfig file to reach the API server with (default: the pod's in-cluster service account)")
	fs.StringVar(&c.kubeNS, "cluster-kube-namespace", "", "with --cluster-kube: namespace of the store (default: the kubeconfig context's namespace, else the pod's, else \"sandgate\")")
	fs.StringVar(&c.etcdCA, "cluster-etcd-ca", "", "PEM CA that signed etcd's server certificates")
	fs.StringVar(&c.etcdCert, "cluster-etcd-cert", "", "PEM client certificate for etcd (with --cluster-etcd-key)")
	fs.StringVar(&c.etcdKey, "cluster-etcd-key", "", "PEM client key for etcd")
	fs.StringVar(&c.etcdUser, "cluster-etcd-user", "", "etcd user (with --cluster-etcd-password-file)")
	fs.StringVar(&c.etcdPassFile, "cluster-etcd-password-file", "", "file holding the etcd user's password")
	fs.StringVar(&c.advertise, "cluster-advertise", "", "URL other nodes reach this node at (its --listen as they see it, e.g. http://10.0.0.5:8080)")
	fs.StringVar(&c.nodeID, "cluster-node-id", "", "node id (default: one made once and kept in the data dir)")
	fs.StringVar(&c.tokenFile, "cluster-token-file", "", "file holding the token nodes authenticate their relays with (the same on every node, at least 16 characters)")
	fs.StringVar(&c.peerCA, "cluster-peer-ca", "", "PEM CA that signed the other nodes' certificates, when they serve https")
	fs.DurationVar(&c.leaseTTL, "cluster-lease-ttl", cluster.DefaultLeaseTTL, "the node's etcd lease: this long after the node stops renewing it, its sessions are marked failed (node lost)")
	fs.BoolVar(&c.forceEgress, "force-egress-to-etcd", false, "let --egress-allow-cidr contain a --cluster-etcd endpoint's address (by default refused: sandboxes could then reach the cluster's state)")
	fs.DurationVar(&c.restartGrace, "cluster-restart-grace", cluster.DefaultRestartGrace, "how long a node drained by SIGTERM (with --keep-sandboxes-on-exit) may take to come back before its sessions are marked failed")
}

func (c *clusterFlags) enabled() bool { return len(c.etcd) > 0 || c.kube }

// kubeServer is the API server --cluster-kube reaches ("": unknown yet;
// opening the store says why).
func (c *clusterFlags) kubeServer() string {
	if c.kubeconfig == "" {
		if h, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); h != "" && p != "" {
			return "https://" + net.JoinHostPort(h, p)
		}
		return ""
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return ""
	}
	return cfg.Host
}

// kubeStore opens the Kubernetes store (--cluster-kube).
func (c *clusterFlags) kubeStore() (*kubestore.Store, error) {
	var cfg *rest.Config
	ns := c.kubeNS
	if c.kubeconfig != "" {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.kubeconfig}, &clientcmd.ConfigOverrides{})
		var err error
		if cfg, err = loader.ClientConfig(); err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		if ns == "" {
			if n, _, err := loader.Namespace(); err == nil && n != "default" {
				ns = n
			}
		}
	} else {
		var err error
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("--cluster-kube without --kubeconfig needs the pod's service account: %w", err)
		}
	}
	if ns == "" {
		ns = kubestore.InClusterNamespace()
	}
	if ns == "" {
		ns = "sandgate"
	}
	cfg.UserAgent = "sandgate/" + version
	return kubestore.Open(cfg, ns)
}

// checkEgress refuses egress CIDRs (--egress-allow-cidr) that contain the
// address of an etcd endpoint, unless --force-egress-to-etcd: sandboxes
// would reach the store every node trusts. Endpoints named by host are
// resolved (within a few seconds); one that does not resolve is left to
// fail where the node connects.
func (c *clusterFlags) checkEgress(ctx context.Context, cidrs []string) error {
	if !c.enabled() || c.forceEgress || len(cidrs) == 0 {
		return nil
	}
	var prefixes []netip.Prefix
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			prefixes = append(prefixes, p.Masked())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	type endpoint struct{ what, url string }
	var eps []endpoint
	for _, ep := range etcdEndpoints(c.etcd) {
		eps = append(eps, endpoint{"etcd endpoint", ep})
	}
	if c.kube {
		// The store is the API server: the kubeconfig's, or the pod's.
		if api := c.kubeServer(); api != "" {
			eps = append(eps, endpoint{"the Kubernetes API server (--cluster-kube's store)", api})
		}
	}
	for _, e := range eps {
		ep := e.url
		host := ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host = u.Hostname()
		} else if h, _, err := net.SplitHostPort(ep); err == nil {
			host = h
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else if ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host); err == nil {
			addrs = ips
		}
		for _, a := range addrs {
			for _, p := range prefixes {
				if p.Contains(a.Unmap()) {
					return fmt.Errorf("--egress-allow-cidr %s contains %s %s (%s): sandboxes could reach the cluster's state; narrow the range, or pass --force-egress-to-etcd if the store refuses them by other means", p, e.what, ep, a.Unmap())
				}
			}
		}
	}
	return nil
}

func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("no certificate in %s", path)
	}
	return pool, nil
}

// etcdEndpoints splits --cluster-etcd's values at commas.
func etcdEndpoints(flags []string) []string {
	var out []string
	for _, e := range flags {
		for _, u := range strings.Split(e, ",") {
			if u = strings.TrimSpace(u); u != "" {
				out = append(out, u)
			}
		}
	}
	return out
}

// config builds the node's configuration from the flags.
func (c *clusterFlags) config(dataDir string, maxSessions, maxPerTenant int, log *slog.Logger) (cluster.Config, error) {
	cc := cluster.Config{
		NodeID: c.nodeID, DataDir: dataDir, Advertise: c.advertise, LeaseTTL: c.leaseTTL,
		RestartGrace: c.restartGrace, MaxSessions: maxSessions, MaxSessionsPerTenant: maxPerTenant, Log: log,
	}
	cc.Endpoints = etcdEndpoints(c.etcd)
	if c.kube && len(cc.Endpoints) > 0 {
		return cc, errors.New("--cluster-kube and --cluster-etcd are two stores: pass one")
	}
	if !c.kube && (c.kubeconfig != "" || c.kubeNS != "") {
		return cc, errors.New("--kubeconfig and --cluster-kube-namespace go with --cluster-kube")
	}
	if c.tokenFile == "" {
		return cc, errors.New("cluster mode (--cluster-etcd, --cluster-kube) needs --cluster-token-file")
	}
	b, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return cc, fmt.Errorf("--cluster-token-file: %w", err)
	}
	cc.Token = strings.TrimSpace(string(b))
	if c.etcdCA != "" || c.etcdCert != "" {
		t := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.etcdCA != "" {
			if t.RootCAs, err = readPool(c.etcdCA); err != nil {
				return cc, fmt.Errorf("--cluster-etcd-ca: %w", err)
			}
		}
		if (c.etcdCert == "") != (c.etcdKey == "") {
			return cc, errors.New("--cluster-etcd-cert and --cluster-etcd-key go together")
		}
		if c.etcdCert != "" {
			kp, err := tls.LoadX509KeyPair(c.etcdCert, c.etcdKey)
			if err != nil {
				return cc, fmt.Errorf("--cluster-etcd-cert: %w", err)
			}
			t.Certificates = []tls.Certificate{kp}
		}
		cc.TLS = t
	}
	if c.etcdUser != "" {
		b, err := os.ReadFile(c.etcdPassFile)
		if err != nil {
			return cc, fmt.Errorf("--cluster-etcd-password-file: %w", err)
		}
		cc.Username, cc.Password = c.etcdUser, strings.TrimSpace(string(b))
	}
	return cc, nil
}

// peerTLS verifies other nodes served over https (nil: system roots).
func (c *clusterFlags) peerTLS() (*tls.Config, error) {
	if c.peerCA == "" {
		return nil, nil
	}
	pool, err := readPool(c.peerCA)
	if err != nil {
		return nil, fmt.Errorf("--cluster-peer-ca: %w", err)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// open joins the cluster; sessions counts the node's live sessions.
func (c *clusterFlags) open(ctx context.Context, cfg *serveConfig, log *slog.Logger, sessions func() int) (*cluster.Node, error) {
	cc, err := c.config(cfg.dataDir, cfg.maxSessions, cfg.maxPerTenant, log)
	if err != nil {
		return nil, err
	}
	if c.kube {
		kv, err := c.kubeStore()
		if err != nil {
			return nil, err
		}
		cc.KV = kv
		n, err := cluster.Open(ctx, cc, sessions)
		if err != nil {
			_ = kv.Close()
		}
		return n, err
	}
	return cluster.Open(ctx, cc, sessions)
}

// liveSessions counts m's running and stopped sessions (0 before m exists).
func liveSessions(m *gateway.Manager) int {
	if m == nil {
		return 0
	}
	c := m.SessionsByStatus()
	return c["running"] + c["stopped"]
}
