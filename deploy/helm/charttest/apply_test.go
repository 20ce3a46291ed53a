package charttest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/sandgate/sandgate/internal/kubetest"
)

// TestApplyDefaults renders the chart with its default values through the
// Helm SDK (lookup reading the API server, as `helm install` does), applies
// every object to a real kube-apiserver with RBAC on (server-side apply,
// CRDs first), and checks that each exists. Then, as the chart's service
// account (a TokenRequest token, the identity the agents' pods get), it
// does what a node agent does, through the chart's RBAC: the cluster
// store's Secrets and Leases in the release's namespace, Sessions and
// Secrets in a tenant's; and is refused what the chart does not grant.
// The DaemonSet's pods never run: there is no kubelet (docs/kubernetes.md
// says what that would take).
func TestApplyDefaults(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	const ns, release = "sandgate", "sg"
	srv.Namespace(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	objs, err := Render(ChartDir(), release, ns, nil, srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	cached := memory.NewMemCacheClient(dc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	apply := func(o Object) (dynamic.ResourceInterface, string) {
		t.Helper()
		u := &unstructured.Unstructured{Object: o.Body}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s (%s): %v", gvk, o.Name(), o.Source, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			n := o.Namespace()
			if n == "" {
				n = ns
			}
			ri = dyn.Resource(m.Resource).Namespace(n)
		}
		body, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		if _, err := ri.Patch(ctx, o.Name(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "sandgate-chart-test", Force: &force}); err != nil {
			t.Fatalf("apply %s %s (%s): %v", o.Kind(), o.Name(), o.Source, err)
		}
		return ri, o.Name()
	}

	var crds, rest []Object
	for _, o := range objs {
		if o.Kind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	crdRes := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, o := range crds {
		apply(o)
		waitEstablished(ctx, t, dyn.Resource(crdRes), o.Name())
	}
	cached.Invalidate()
	mapper.Reset()
	type applied struct {
		ri   dynamic.ResourceInterface
		kind string
		name string
	}
	var got []applied
	for _, o := range rest {
		ri, name := apply(o)
		got = append(got, applied{ri, o.Kind(), name})
	}
	for _, a := range got {
		if _, err := a.ri.Get(ctx, a.name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s %s not there after apply: %v", a.kind, a.name, err)
		}
	}
	kinds := map[string]bool{}
	for _, a := range got {
		kinds[a.kind] = true
	}
	for _, k := range []string{"DaemonSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "PodDisruptionBudget", "Secret"} {
		if !kinds[k] {
			t.Errorf("no %s applied", k)
		}
	}
	t.Logf("applied %d CRDs and %d objects", len(crds), len(got))

	// Chart.yaml's kubeVersion is checked against the server's, as
	// `helm install` does: a chart asking for a newer one is refused.
	ch, err := Load(ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renderChart(ch, "sg", ns, nil, srv.Config); err != nil {
		t.Fatalf("the chart's kubeVersion %q against the server's: %v", ch.Metadata.KubeVersion, err)
	}
	ch.Metadata.KubeVersion = ">=99.0.0-0"
	if _, err := renderChart(ch, "sg", ns, nil, srv.Config); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("a chart for kubeVersion >=99 rendered against %s: %v", kubetest.Version, err)
	}

	// A second render reads the cluster token back (lookup): an upgrade
	// keeps it.
	again, err := Render(ChartDir(), release, ns, nil, srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	tokSecret, err := admin.CoreV1().Secrets(ns).Get(ctx, release+"-sandgate-cluster-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range again {
		if o.Kind() == "Secret" && o.Name() == tokSecret.Name {
			data, _ := o.Body["data"].(map[string]any)
			if len(tokSecret.Data["token"]) < 16 || data["token"] == nil {
				t.Fatalf("cluster token %q, rendered %v", tokSecret.Data["token"], data["token"])
			}
			if base64.StdEncoding.EncodeToString(tokSecret.Data["token"]) != data["token"] {
				t.Errorf("a second render made a new cluster token: upgrades would change it under running agents")
			}
		}
	}

	// The chart's RBAC, as the agents' service account.
	sa := srv.ServiceAccountToken(t, ns, release+"-sandgate")
	agent, err := kubernetes.NewForConfig(srv.TokenConfig(sa))
	if err != nil {
		t.Fatal(err)
	}
	agentDyn, err := dynamic.NewForConfig(srv.TokenConfig(sa))
	if err != nil {
		t.Fatal(err)
	}
	const tenant = "tenant-a"
	srv.Namespace(t, tenant)
	allowed := []struct {
		what string
		do   func() error
	}{
		{"create a Lease in the release's namespace", func() error {
			_, err := agent.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}}, metav1.CreateOptions{})
			return err
		}},
		{"create a Secret (the cluster store) in the release's namespace", func() error {
			_, err := agent.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe-store"}}, metav1.CreateOptions{})
			return err
		}},
		{"write a credentials Secret in a tenant's namespace", func() error {
			_, err := agent.CoreV1().Secrets(tenant).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}}, metav1.CreateOptions{})
			return err
		}},
		{"read namespaces (tenant labels)", func() error {
			_, err := agent.CoreV1().Namespaces().Get(ctx, tenant, metav1.GetOptions{})
			return err
		}},
		{"record an event", func() error {
			_, err := agent.CoreV1().Events(tenant).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"},
				InvolvedObject: corev1.ObjectReference{Kind: "Secret", Namespace: tenant, Name: "rbac-probe"}, Reason: "Probe", Message: "rbac probe"}, metav1.CreateOptions{})
			return err
		}},
	}
	if len(crds) > 0 {
		sessions := schema.GroupVersionResource{Group: "sandgate.dev", Version: "v1alpha1", Resource: "sessions"}
		allowed = append(allowed, struct {
			what string
			do   func() error
		}{"list Sessions in every namespace", func() error {
			_, err := agentDyn.Resource(sessions).List(ctx, metav1.ListOptions{})
			return err
		}})
	}
	for _, a := range allowed {
		if err := a.do(); err != nil {
			t.Errorf("the agents' service account may not %s: %v", a.what, err)
		}
	}
	refused := []struct {
		what string
		do   func() error
	}{
		{"create a Lease in a tenant's namespace", func() error {
			_, err := agent.CoordinationV1().Leases(tenant).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}}, metav1.CreateOptions{})
			return err
		}},
		{"list Secrets in a tenant's namespace", func() error {
			_, err := agent.CoreV1().Secrets(tenant).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list Secrets in every namespace", func() error {
			_, err := agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create a ConfigMap in a tenant's namespace", func() error {
			_, err := agent.CoreV1().ConfigMaps(tenant).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}}, metav1.CreateOptions{})
			return err
		}},
		{"create a Pod", func() error {
			_, err := agent.CoreV1().Pods(tenant).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
			return err
		}},
		{"delete a namespace", func() error {
			return agent.CoreV1().Namespaces().Delete(ctx, tenant, metav1.DeleteOptions{})
		}},
	}
	for _, r := range refused {
		if err := r.do(); !apierrors.IsForbidden(err) {
			t.Errorf("the agents' service account could %s (err %v): the chart grants more than it needs", r.what, err)
		}
	}

	// The other shapes the values select, validated by the API server
	// too: a StatefulSet of unprivileged agents (capabilities, seccomp and
	// AppArmor profiles, host mounts), the NetworkPolicy, the Ingress, and
	// every Secret reference. (The ServiceMonitor's CRD is the Prometheus
	// Operator's, not installed here.)
	const ns2 = "sandgate-pool"
	srv.Namespace(t, ns2)
	vals := everything()
	vals["nodeAgent"] = map[string]any{"kind": "StatefulSet", "replicas": 2, "privileged": false, "hostDev": true,
		"nodeSelector": map[string]any{"sandgate.dev/pool": "agents"}}
	variant, err := Render(ChartDir(), "pool", ns2, vals, srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range variant {
		if o.Kind() == "CustomResourceDefinition" || o.Kind() == "ServiceMonitor" {
			continue
		}
		ri, name := apply(o)
		if _, err := ri.Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s %s not there after apply: %v", o.Kind(), name, err)
		}
		n++
	}
	t.Logf("applied %d objects of the StatefulSet/unprivileged/everything render", n)
}

// waitEstablished waits for CRD name's Established condition.
func waitEstablished(ctx context.Context, t *testing.T, ri dynamic.ResourceInterface, name string) {
	t.Helper()
	for {
		u, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("CRD %s not established: %v", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readObjects reads the YAML documents of file.
func readObjects(file string) ([]Object, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return split(file, string(b))
}

// applyCRDs applies CRDs (server-side, as the admin) and waits until each
// is established.
func applyCRDs(ctx context.Context, t *testing.T, cfg *rest.Config, crds []Object) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ri := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	force := true
	for _, o := range crds {
		body, err := json.Marshal(o.Body)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(ctx, o.Name(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "sandgate-chart-test", Force: &force}); err != nil {
			t.Fatalf("apply CRD %s (%s): %v", o.Name(), o.Source, err)
		}
	}
	for _, o := range crds {
		waitEstablished(ctx, t, ri, o.Name())
	}
}
