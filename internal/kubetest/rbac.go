package kubetest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
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
	rules := map[string][]rbacv1.PolicyRule{} // "Role/name" or "ClusterRole/name"
	type bound struct {
		ref       string
		namespace string // "" for a ClusterRoleBinding
		subjects  []rbacv1.Subject
	}
	var bindings []bound
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
				rules["Role/"+o.Name] = o.Rules
				_, err = c.Roles(namespace).Create(ctx, &o, metav1.CreateOptions{})
			}
		case "RoleBinding":
			var o rbacv1.RoleBinding
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				o.Namespace = namespace
				fix(o.Subjects)
				bindings = append(bindings, bound{o.RoleRef.Kind + "/" + o.RoleRef.Name, namespace, o.Subjects})
				_, err = c.RoleBindings(namespace).Create(ctx, &o, metav1.CreateOptions{})
			}
		case "ClusterRole":
			var o rbacv1.ClusterRole
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				rules["ClusterRole/"+o.Name] = o.Rules
				_, err = c.ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			if err == nil {
				fix(o.Subjects)
				bindings = append(bindings, bound{o.RoleRef.Kind + "/" + o.RoleRef.Name, "", o.Subjects})
				_, err = c.ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
			}
		default:
			err = fmt.Errorf("kind %s is not RBAC", head.Kind)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
	}
	// The API server's RBAC authorizer reads bindings through a cache: a
	// new binding takes effect a moment later. Wait until each binding's
	// subjects are allowed the first rule of its role.
	for _, b := range bindings {
		rs := rules[b.ref]
		if len(rs) == 0 || len(rs[0].Verbs) == 0 || len(rs[0].Resources) == 0 {
			continue
		}
		attrs := &authzv1.ResourceAttributes{Namespace: b.namespace, Verb: rs[0].Verbs[0], Resource: rs[0].Resources[0]}
		if len(rs[0].APIGroups) > 0 {
			attrs.Group = rs[0].APIGroups[0]
		}
		attrs.Resource, attrs.Subresource, _ = strings.Cut(attrs.Resource, "/")
		if len(rs[0].ResourceNames) > 0 {
			attrs.Name = rs[0].ResourceNames[0]
		}
		for _, sub := range b.subjects {
			s.waitAllowed(t, ctx, sub, attrs)
		}
	}
}

// waitAllowed waits until the API server allows subject what attrs say.
func (s *Server) waitAllowed(t testing.TB, ctx context.Context, sub rbacv1.Subject, attrs *authzv1.ResourceAttributes) {
	t.Helper()
	spec := authzv1.SubjectAccessReviewSpec{ResourceAttributes: attrs}
	switch sub.Kind {
	case "User":
		spec.User = sub.Name
	case "Group":
		spec.User, spec.Groups = "kubetest:probe", []string{sub.Name}
	case "ServiceAccount":
		spec.User = "system:serviceaccount:" + sub.Namespace + ":" + sub.Name
		spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + sub.Namespace, "system:authenticated"}
	default:
		return
	}
	c := s.Client(t).AuthorizationV1().SubjectAccessReviews()
	for {
		r, err := c.Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		if err == nil && r.Status.Allowed {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("RBAC: %s %s never allowed %+v: %v", sub.Kind, sub.Name, *attrs, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
