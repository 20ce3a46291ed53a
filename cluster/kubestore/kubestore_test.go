package kubestore_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/cluster/kubestore"
	"github.com/sandgate/sandgate/cluster/kvtest"
	"github.com/sandgate/sandgate/internal/kubetest"
)

// The store conformance suite against a real kube-apiserver, as the
// service account deploy/rbac-store.yaml binds: a rule missing there
// fails it.
func TestConformance(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{})
	s.ApplyRBAC(t, "../../deploy/rbac-store.yaml", "sandgate")
	kv, err := kubestore.Open(s.TokenConfig(s.ServiceAccountToken(t, "sandgate", "sandgate")), "sandgate")
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	kvtest.Run(t, kv, "/kvtest/")
}

// The store's values (session records hold the egress CA's private key)
// are not readable by who may only view the namespace: Kubernetes'
// built-in view role reads ConfigMaps, not Secrets.
func TestValuesHiddenFromViewRole(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{{Name: "viewer"}}})
	const ns = "sandgate"
	s.Namespace(t, ns)
	ctx := context.Background()
	// Kubernetes' view ClusterRole is aggregated by kube-controller-manager,
	// which does not run here: its rules for these two kinds, as it has
	// them (ConfigMaps read; Secrets not, by design).
	admin := s.Client(t)
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "view"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "viewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "viewer"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := kubestore.Open(s.Config, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	const secret = "egress-ca-key-4f1c"
	if err := kv.Put(ctx, "/sessions/t/s1", secret, 0); err != nil {
		t.Fatal(err)
	}
	viewer, err := kubernetes.NewForConfig(s.UserConfig("viewer"))
	if err != nil {
		t.Fatal(err)
	}
	var seen []any
	// (RBAC takes a moment to see the binding.)
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		l, err := viewer.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			seen = append(seen, l)
			break
		}
		if !apierrors.IsForbidden(err) || time.Since(start) > 30*time.Second {
			t.Fatalf("the viewer cannot list ConfigMaps: %v", err)
		}
	}
	if l, err := viewer.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err == nil {
		seen = append(seen, l)
	} else if !apierrors.IsForbidden(err) {
		t.Fatal(err)
	}
	b, _ := json.Marshal(seen)
	if strings.Contains(string(b), secret) || strings.Contains(string(b), base64.StdEncoding.EncodeToString([]byte(secret))) {
		t.Fatal("the view role reads the store's values")
	}
}
