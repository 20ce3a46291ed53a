// Package kube is the gateway's Kubernetes controller: it turns Session
// resources (sessions.sandgate.dev, deploy/helm/sandgate/crds) and
// agent-sandbox SandboxClaims whose warm pool is marked for sandgate into
// sessions of this gateway's Manager, in process. It runs inside the node
// agents (sandgate serve --kube-controller); one of them at a time, the
// holder of a coordination.k8s.io Lease, reconciles.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"

	"github.com/sandgate/sandgate/gateway"
)

// The resources the controller reads and writes.
var (
	SessionGVR   = schema.GroupVersionResource{Group: "sandgate.dev", Version: "v1alpha1", Resource: "sessions"}
	ClaimGVR     = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	WarmPoolGVR  = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
	TemplateGVR  = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	agentSandbox = "extensions.agents.x-k8s.io/v1beta1"
)

const (
	// DefaultTenantLabel is the namespace label whose value, when set,
	// names the sandgate tenant of the namespace's Sessions and claims
	// (without it the tenant is the namespace's name).
	DefaultTenantLabel = "sandgate.dev/tenant"
	// RuntimeKey marks a SandboxWarmPool (or the SandboxTemplate it
	// names) for sandgate, as a label or an annotation whose value is
	// RuntimeValue: its claims become sandgate sessions, with no Pod.
	RuntimeKey   = "sandgate.dev/runtime"
	RuntimeValue = "sandgate"
	// LeaseName is the Lease the node agents elect the controller with.
	LeaseName = "sandgate-controller"

	sessionFinalizer = "sandgate.dev/session"
	claimFinalizer   = "sandgate.dev/claim"
	// principalMethod is the Principal.Method of what the controller
	// creates (the tenant's sessions, as by an API key or a JWT).
	principalMethod = "kubernetes"
)

// Sessions is what the controller needs of the gateway's Manager.
type Sessions interface {
	Create(ctx context.Context, p gateway.Principal, cp gateway.CreateParams) (*gateway.Session, string, error)
	Get(ctx context.Context, p gateway.Principal, id string) (*gateway.Session, error)
	Delete(ctx context.Context, p gateway.Principal, id string) error
	// Owner is the tenant of session id, if this gateway holds it.
	Owner(id string) (tenant string, ok bool)
}

// Config configures a Controller.
type Config struct {
	// REST is how to reach the API server.
	REST *rest.Config
	// Sessions is the gateway's Manager.
	Sessions Sessions
	// Secrets takes the values of the Kubernetes Secrets that Sessions
	// and claims refer to; the Manager's SecretSource must read it.
	Secrets *SecretOverlay
	// TenantLabel is the namespace label naming the tenant
	// (DefaultTenantLabel when empty).
	TenantLabel string
	// Identity is this node agent's name in the election (its node name).
	Identity string
	// LeaseNamespace holds the election's Lease.
	LeaseNamespace string
	// PublicURL is the gateway's URL as clients reach it: the base of
	// the endpoints written into statuses and Secrets (Run may set it).
	PublicURL string
	// SSHUsername and HostKey go into the credentials Secret.
	SSHUsername string
	HostKey     string
	// Workers reconcile at once (default 8).
	Workers int
	// LeaseDuration is the election's lease (default 15 s).
	LeaseDuration time.Duration
	// DiscoveryInterval is how often a leader that found agent-sandbox's
	// API not served looks again, so that CRDs installed later are
	// watched without a change of leader (default 10 s).
	DiscoveryInterval time.Duration
	Log               *slog.Logger
}

// Controller reconciles Sessions and sandgate's SandboxClaims.
type Controller struct {
	cfg  Config
	core kubernetes.Interface
	dyn  dynamic.Interface
	log  *slog.Logger

	leads   sync.WaitGroup // terms of leadership still winding down
	mu      sync.Mutex
	leading bool
	claims  bool // agent-sandbox's API is served
	nsInf   cache.SharedIndexInformer
	dynInf  dynamicinformer.DynamicSharedInformerFactory
}

// New checks cfg and makes the clients.
func New(cfg Config) (*Controller, error) {
	if cfg.REST == nil || cfg.Sessions == nil || cfg.Secrets == nil {
		return nil, errors.New("kube: REST, Sessions and Secrets are required")
	}
	if cfg.TenantLabel == "" {
		cfg.TenantLabel = DefaultTenantLabel
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.DiscoveryInterval <= 0 {
		cfg.DiscoveryInterval = 10 * time.Second
	}
	if cfg.LeaseNamespace == "" {
		cfg.LeaseNamespace = "default"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	rc := rest.CopyConfig(cfg.REST)
	if rc.QPS == 0 { // client-go's 5/s would cap creates far below the gateway's pace
		rc.QPS, rc.Burst = 500, 1000
	}
	core, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	return &Controller{cfg: cfg, core: core, dyn: dyn, log: cfg.Log.With("component", "kube-controller")}, nil
}

// Leading reports whether this node agent holds the Lease now.
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading
}

// Run takes part in the election until ctx ends, reconciling while it
// leads. It returns when ctx is done (and the Lease is released).
func (c *Controller) Run(ctx context.Context, publicURL string) error {
	if publicURL != "" {
		c.cfg.PublicURL = publicURL
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: c.cfg.LeaseNamespace},
		Client:     c.core.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
	}
	d := c.cfg.LeaseDuration
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: LeaseName, ReleaseOnCancel: true,
			LeaseDuration: d, RenewDeadline: d * 2 / 3, RetryPeriod: d / 7,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					c.leads.Add(1)
					defer c.leads.Done()
					c.setLeading(true)
					c.log.Info("kube_controller_leading", "identity", c.cfg.Identity)
					for {
						err := c.lead(ctx)
						if errors.Is(err, errRediscover) && ctx.Err() == nil {
							c.log.Info("kube_controller_rediscover", "group", agentSandbox, "detail", "SandboxClaims are served now: watching them")
							continue
						}
						if err != nil && ctx.Err() == nil {
							c.log.Error("kube_controller_failed", "err", err)
						}
						return
					}
				},
				OnStoppedLeading: func() {
					c.setLeading(false)
					c.log.Info("kube_controller_stopped_leading", "identity", c.cfg.Identity)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("kube: leader election: %w", err)
		}
		le.Run(ctx)    // returns when ctx ends or the lease is lost
		c.leads.Wait() // no reconcile outlives its term
	}
	return nil
}

func (c *Controller) setLeading(v bool) {
	c.mu.Lock()
	c.leading = v
	c.mu.Unlock()
}

// lead runs the informers and the workers until ctx ends.
func (c *Controller) lead(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.claims = c.served(agentSandbox, "sandboxclaims")
	if !c.claims {
		c.log.Info("kube_controller_no_agent_sandbox", "group", agentSandbox, "detail", "SandboxClaims are not served: only Sessions are reconciled")
	}
	nsf := informers.NewSharedInformerFactory(c.core, 10*time.Minute)
	c.nsInf = nsf.Core().V1().Namespaces().Informer()
	c.dynInf = dynamicinformer.NewDynamicSharedInformerFactory(c.dyn, 30*time.Second)

	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[item](20*time.Millisecond, 30*time.Second))
	defer q.ShutDown()
	add := func(kind string) cache.ResourceEventHandlerFuncs {
		enq := func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				q.Add(item{kind, key})
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: enq, UpdateFunc: func(_, o any) { enq(o) }, DeleteFunc: enq}
	}
	sessInf := c.dynInf.ForResource(SessionGVR).Informer()
	if _, err := sessInf.AddEventHandler(add(kindSession)); err != nil {
		return err
	}
	if c.claims {
		if _, err := c.dynInf.ForResource(ClaimGVR).Informer().AddEventHandler(add(kindClaim)); err != nil {
			return err
		}
		c.dynInf.ForResource(WarmPoolGVR).Informer()
		c.dynInf.ForResource(TemplateGVR).Informer()
	}
	nsf.Start(ctx.Done())
	c.dynInf.Start(ctx.Done())
	nsf.WaitForCacheSync(ctx.Done())
	c.dynInf.WaitForCacheSync(ctx.Done())
	if ctx.Err() != nil {
		return nil
	}
	c.log.Info("kube_controller_synced", "claims", c.claims)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for {
				it, shutdown := q.Get()
				if shutdown {
					return
				}
				err := c.reconcile(ctx, it)
				if err != nil && ctx.Err() == nil {
					c.log.Warn("kube_reconcile_failed", "kind", it.kind, "key", it.key, "err", err)
					q.AddRateLimited(it)
				} else {
					q.Forget(it)
				}
				q.Done(it)
			}
		})
	}
	appeared := make(chan struct{})
	if !c.claims {
		go func() {
			t := time.NewTicker(c.cfg.DiscoveryInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if c.served(agentSandbox, "sandboxclaims") {
						close(appeared)
						return
					}
				}
			}
		}()
	}
	select {
	case <-ctx.Done():
	case <-appeared:
	}
	q.ShutDown()
	wg.Wait()
	if ctx.Err() == nil {
		return errRediscover // lead again, with the claims' informers
	}
	return nil
}

// errRediscover ends a term's lead when agent-sandbox's API appeared.
var errRediscover = errors.New("kube: agent-sandbox's API appeared")

// served reports whether the API server serves resource in groupVersion.
func (c *Controller) served(groupVersion, resource string) bool {
	l, err := c.core.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false
	}
	for _, r := range l.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}

type item struct{ kind, key string }

const (
	kindSession = "Session"
	kindClaim   = "SandboxClaim"
)

func (c *Controller) reconcile(ctx context.Context, it item) error {
	ns, name, err := cache.SplitMetaNamespaceKey(it.key)
	if err != nil {
		return nil // never valid
	}
	switch it.kind {
	case kindSession:
		return c.reconcileSession(ctx, ns, name)
	case kindClaim:
		return c.reconcileClaim(ctx, ns, name)
	}
	return nil
}

// tenant is the sandgate tenant of namespace ns: its TenantLabel's value,
// or its name.
func (c *Controller) tenant(ns string) string {
	if obj, ok, _ := c.nsInf.GetStore().GetByKey(ns); ok {
		if n, ok := obj.(*corev1.Namespace); ok {
			if v := n.Labels[c.cfg.TenantLabel]; v != "" {
				return v
			}
		}
	}
	return ns
}

func (c *Controller) principal(ns string) gateway.Principal {
	return gateway.Principal{Tenant: c.tenant(ns), Method: principalMethod}
}

// scopeOf is obj's idempotency key and the scope of its secret values:
// one per object (its UID), never reused.
func scopeOf(obj *unstructured.Unstructured) string {
	return "k8s-" + string(obj.GetUID())
}

// principalFor is the principal of obj, whose session is id: the tenant
// the session was created for (its owner, when the session is obj's own
// by its idempotency key), so that a namespace relabelled since still
// finds it; otherwise the namespace's tenant now.
func (c *Controller) principalFor(ctx context.Context, obj *unstructured.Unstructured, id string) gateway.Principal {
	if id != "" {
		if t, ok := c.cfg.Sessions.Owner(id); ok {
			p := gateway.Principal{Tenant: t, Method: principalMethod}
			if s, err := c.cfg.Sessions.Get(ctx, p, id); err == nil && s.IdempotencyKey == scopeOf(obj) {
				return p
			}
		}
	}
	return c.principal(obj.GetNamespace())
}
