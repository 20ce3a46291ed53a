package kubetest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// ApplyRBAC creates the Roles, RoleBindings, ClusterRoles and
// ClusterRoleBindings of a multi-document YAML file (such as
// deploy/rbac-store.yaml) in namespace (for the namespaced ones, and for
// ServiceAccount subjects that name none).
func (s *Server) ApplyRBAC(t testing.TB, path, namespace string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Namespace(t, namespace)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := s.Client(t).RbacV1()
	for i, doc := range strings.Split("\n"+string(b), "\n---") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		fix := func(subjects []rbacv1.Subject) {
			for j := range subjects {
				if subjects[j].Kind == "ServiceAccount" && subjects[j].Namespace == "" {
					subjects[j].Namespace = namespace
				}
			}
		}
		switch head.Kind {
		case "":
			continue
		case "Role":
			var o rbacv1.Role
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				o.Namespace = namespace
				_, err = c.Roles(namespace).Create(ctx, &o, metav1.CreateOptions{})
			}
		case "RoleBinding":
			var o rbacv1.RoleBinding
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				o.Namespace = namespace
				fix(o.Subjects)
				_, err = c.RoleBindings(namespace).Create(ctx, &o, metav1.CreateOptions{})
			}
		case "ClusterRole":
			var o rbacv1.ClusterRole
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				_, err = c.ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				fix(o.Subjects)
				_, err = c.ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
			}
		default:
			err = fmt.Errorf("kind %s is not RBAC", head.Kind)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
	}
}
