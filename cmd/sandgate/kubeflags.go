package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/kube"
	"github.com/sandgate/sandgate/rest/compat"
)

// kubeFlags are the flags of the Kubernetes controller (docs/kubernetes.md).
type kubeFlags struct {
	controller     bool
	tenantLabel    string
	leaseNamespace string
	identity       string
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&k.controller, "kube-controller", false, "run the Kubernetes controller: Session resources (sessions.sandgate.dev) and SandboxClaims of warm pools marked sandgate.dev/runtime=sandgate become sessions of this gateway; the node agents elect one to run it (a Lease)")
	fs.StringVar(&k.tenantLabel, "kube-tenant-label", kube.DefaultTenantLabel, "namespace label whose value names the sandgate tenant of the namespace's Sessions and claims; without the label, the tenant is the namespace's name")
	fs.StringVar(&k.leaseNamespace, "kube-lease-namespace", "", "namespace of the controller's election Lease (default: --kubeconfig's namespace, else the pod's, else default)")
	fs.StringVar(&k.identity, "kube-identity", "", "this node agent's name in the election and in Session statuses (default: $NODE_NAME, else the host name)")
}

// secrets wraps src so the controller can add the values of Kubernetes
// Secrets (nil without --kube-controller).
func (k *kubeFlags) secrets(src gateway.SecretSource) (gateway.SecretSource, *kube.SecretOverlay) {
	if !k.controller {
		return src, nil
	}
	o := kube.NewSecretOverlay(src)
	return o, o
}

// open makes the controller (nil without --kube-controller); run starts it.
// kubeconfig is --kubeconfig ("": the pod's in-cluster config).
func (k *kubeFlags) open(kubeconfig string, mgr *gateway.Manager, overlay *kube.SecretOverlay, hostKey string, log *slog.Logger) (*kube.Controller, error) {
	if !k.controller {
		return nil, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kube-controller: no API server to reach (give --kubeconfig outside a pod): %w", err)
	}
	// The Lease's namespace is found as the cluster store's is
	// (--cluster-kube-namespace): the kubeconfig's namespace, else the
	// pod's; the chart's Role grants Leases there only.
	ns := k.leaseNamespace
	if ns == "" && kubeconfig != "" {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		if n, _, err := loader.Namespace(); err == nil && n != "default" {
			ns = n
		}
	}
	if ns == "" {
		ns = "default"
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
			ns = strings.TrimSpace(string(b))
		}
	}
	id := k.identity
	if id == "" {
		if id = os.Getenv("NODE_NAME"); id == "" {
			id, _ = os.Hostname()
		}
	}
	ctl, err := kube.New(kube.Config{
		REST: rc, Sessions: mgr, Secrets: overlay, TenantLabel: k.tenantLabel, Identity: id, LeaseNamespace: ns,
		SSHUsername: "sandbox", HostKey: hostKey, Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("--kube-controller: %w", err)
	}
	log.Info("kube_controller_configured", "identity", id, "lease_namespace", ns, "tenant_label", k.tenantLabel)
	return ctl, nil
}

// runKube runs ctl (if any) with publicURL as its endpoints' base until
// ctx ends; stop ends it and returns once it has let the Lease go.
func runKube(ctx context.Context, ctl *kube.Controller, publicURL string, log *slog.Logger) (stop func()) {
	if ctl == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ctl.Run(ctx, publicURL); err != nil {
			log.Error("kube_controller_failed", "err", err)
		}
	}()
	return func() { cancel(); <-done }
}

// sandboxRouter serves agent-sandbox's sandbox-router requests (they name
// a session in X-Sandbox-ID and carry the runtime's paths at the root)
// under compat.SandboxRouterPrefix; every other request goes to next, a
// preview origin's (preview) included.
func sandboxRouter(next http.Handler, preview func(*http.Request) (string, bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, isPreview := preview(r); isPreview {
			next.ServeHTTP(w, r)
			return
		}
		if p := compat.RouterPath(r); p != "" {
			r = r.Clone(r.Context())
			r.URL.Path, r.URL.RawPath = p, ""
		}
		next.ServeHTTP(w, r)
	})
}
