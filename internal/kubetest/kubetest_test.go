package kubetest_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandgate/sandgate/internal/kubetest"
)

// The control plane authenticates by token, enforces RBAC for a test
// identity and for a service account, and its kubeconfig files load.
func TestControlPlane(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{Users: []kubetest.User{{Name: "alice", Groups: []string{"testers"}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := s.Client(t)
	s.Namespace(t, "kt")

	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig(t, "alice", "kt"))
	if err != nil {
		t.Fatal(err)
	}
	alice := kubernetes.NewForConfigOrDie(cfg)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Data: map[string]string{"a": "b"}}
	if _, err := alice.CoreV1().ConfigMaps("kt").Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice without a role: want forbidden, got %v", err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get"}}}}
	if _, err := admin.RbacV1().Roles("kt").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cm"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm"},
		Subjects: []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "testers"}, {Kind: "ServiceAccount", Name: "agent", Namespace: "kt"}}}
	if _, err := admin.RbacV1().RoleBindings("kt").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server's RBAC authorizer reads bindings through a cache:
	// a new binding takes effect a moment later (CI once saw forbidden).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := alice.CoreV1().ConfigMaps("kt").Create(ctx, cm, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("alice with a role: %v", err)
		}
	}
	if _, err := alice.CoreV1().ConfigMaps("default").Get(ctx, "x", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice outside her namespace: want forbidden, got %v", err)
	}

	sa := kubernetes.NewForConfigOrDie(s.TokenConfig(s.ServiceAccountToken(t, "kt", "agent")))
	if got, err := sa.CoreV1().ConfigMaps("kt").Get(ctx, "x", metav1.GetOptions{}); err != nil || got.Data["a"] != "b" {
		t.Fatalf("service account with a role: %v %v", got, err)
	}
	if _, err := sa.CoreV1().Secrets("kt").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("service account listing secrets: want forbidden, got %v", err)
	}
}
