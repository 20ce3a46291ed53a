package kube_test

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/kube"
)

func (e *kubeEnv) kubeSecret(t *testing.T, name, value string) {
	t.Helper()
	if _, err := e.core.CoreV1().Secrets(e.ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"token": value},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *kubeEnv) session(t *testing.T, name string, secrets ...any) {
	t.Helper()
	e.create(t, kube.SessionGVR, map[string]any{
		"apiVersion": "sandgate.dev/v1alpha1", "kind": "Session",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"ttl": 600, "secrets": secrets},
	})
}

func (e *kubeEnv) running(t *testing.T, name string) string {
	t.Helper()
	u := e.waitStatus(t, kube.SessionGVR, name, func(u *unstructured.Unstructured) bool { return phase(u) != "" && phase(u) != kube.PhasePending })
	if phase(u) != kube.PhaseRunning {
		t.Fatalf("Session %s: phase %q, status %v", name, phase(u), u.Object["status"])
	}
	id, _, _ := unstructured.NestedString(u.Object, "status", "sessionId")
	return id
}

func (e *kubeEnv) deleteSession(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeWait(t, 60*time.Second, "Session "+name+" to be gone", func() bool {
		_, err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func ghSecret(secret string) map[string]any {
	return map[string]any{"name": "GH_TOKEN", "secretRef": map[string]any{"name": secret, "key": "token"}}
}

// TestKubeSessionSecretsPerSession: two Sessions of one tenant that give
// one secret name different Kubernetes Secrets each get their own value
// (the values were the tenant's, the last read winning), and the
// tenant's REST creates see neither.
func TestKubeSessionSecretsPerSession(t *testing.T) {
	e := startKube(t)
	e.kubeSecret(t, "gh-one", "value-one")
	e.kubeSecret(t, "gh-two", "value-two")
	e.session(t, "one", ghSecret("gh-one"))
	one := e.running(t, "one")
	e.session(t, "two", ghSecret("gh-two"))
	two := e.running(t, "two")
	for id, want := range map[string]string{one: "value-one", two: "value-two"} {
		if out := e.command(t, id, `printf %s "$GH_TOKEN"`); out != want {
			t.Errorf("GH_TOKEN in %s: %q, want %q", id, out, want)
		}
	}
	var errBody struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if code := e.gw.api(t, http.MethodPost, "/v1/sessions", map[string]any{"secrets": []any{map[string]any{"name": "GH_TOKEN"}}}, &errBody); code != http.StatusBadRequest || errBody.Error.Code != "unknown_secret" {
		t.Errorf("a REST create naming a Session's Kubernetes secret: %d %q, want 400 unknown_secret", code, errBody.Error.Code)
	}
	e.deleteSession(t, "one")
	if out := e.command(t, two, `printf %s "$GH_TOKEN"`); out != "value-two" {
		t.Errorf("GH_TOKEN in %s after the other Session went: %q", two, out)
	}
	e.deleteSession(t, "two")
}

// TestKubeTenantRelabel: a namespace whose tenant label changes after a
// Session was created still has the session deleted with the Session (it
// was looked for as the new tenant, not found, and left running).
func TestKubeTenantRelabel(t *testing.T) {
	e := startKube(t)
	ctx := context.Background()
	e.session(t, "work")
	id := e.running(t, "work")
	ns, err := e.core.CoreV1().Namespaces().Get(ctx, e.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[kube.DefaultTenantLabel] = "team-z"
	if _, err := e.core.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller's namespace informer sees the label: a new Session
	// is team-z's (team-a's key does not find it).
	e.session(t, "probe")
	probe := e.running(t, "probe")
	if code := e.gw.api(t, http.MethodGet, "/v1/sessions/"+probe, nil, nil); code != http.StatusNotFound {
		t.Fatalf("a Session created after the relabel is still team-a's (GET %d): the label was not seen", code)
	}
	e.deleteSession(t, "probe")
	e.deleteSession(t, "work")
	if code := e.gw.api(t, http.MethodGet, "/v1/sessions/"+id, nil, nil); code == http.StatusOK {
		t.Errorf("session %s still there after its Session was deleted (namespace relabelled)", id)
	}
}

// TestKubeClaimCRDsLater: agent-sandbox's CRDs installed after the
// controller started leading are watched without a change of leader.
func TestKubeClaimCRDsLater(t *testing.T) {
	e := startKubeCRDs(t, []string{"../deploy/helm/sandgate/crds/sessions.sandgate.dev.yaml"})
	if !strings.Contains(e.gw.Stderr.String(), "kube_controller_no_agent_sandbox") {
		t.Fatalf("the controller saw agent-sandbox's API before it was installed")
	}
	applyCRDs(t, e.dyn, "testdata/agent-sandbox-crds.yaml")
	e.create(t, kube.WarmPoolGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": "sg-pool", "labels": map[string]any{kube.RuntimeKey: kube.RuntimeValue}},
		"spec":     map[string]any{"replicas": 1, "sandboxTemplateRef": map[string]any{"name": "none"}},
	})
	e.create(t, kube.ClaimGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "late"},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "sg-pool"}},
	})
	u := e.waitStatus(t, kube.ClaimGVR, "late", func(u *unstructured.Unstructured) bool { st, _ := readyCond(u); return st != "" })
	if st, reason := readyCond(u); st != "True" {
		t.Fatalf("claim Ready %s (%s)", st, reason)
	}
	ctx := context.Background()
	if err := e.dyn.Resource(kube.ClaimGVR).Namespace(e.ns).Delete(ctx, "late", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeWait(t, 60*time.Second, "the claim to be gone", func() bool {
		_, err := e.dyn.Resource(kube.ClaimGVR).Namespace(e.ns).Get(ctx, "late", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// TestKubeNodeLost: when the node agent that held a Session's session
// goes, the next leader marks the Session Failed (NodeLost), not Ended as
// if its TTL had passed.
func TestKubeNodeLost(t *testing.T) {
	e := startKube(t)
	e.session(t, "work")
	e.running(t, "work")
	b := startGateway(t, e.key, "--kube-controller", "--kubeconfig", e.kc, "--kube-identity", "node-b", "--kube-lease-namespace", agentNS,
		"--api-key", e.ns+":"+e.key)
	_ = e.gw.Cmd.Process.Signal(syscall.SIGTERM) // node-a goes, and its sessions with it
	<-e.gw.Done
	kubeWait(t, 90*time.Second, "node-b to lead", func() bool { return strings.Contains(b.Stderr.String(), "kube_controller_synced") })
	u := e.waitStatus(t, kube.SessionGVR, "work", func(u *unstructured.Unstructured) bool { return phase(u) != kube.PhaseRunning })
	if st, reason := readyCond(u); phase(u) != kube.PhaseFailed || st != "False" || reason != "NodeLost" {
		t.Errorf("Session after its node agent went: phase %q, Ready %s (%s)", phase(u), st, reason)
	}
	e.gw = b
	e.deleteSession(t, "work")
}

// TestKubeCredentialsSecretTaken: a Secret of the credentials Secret's
// name that is not the Session's (the user's own, or a SandboxClaim's of
// the same name) is neither overwritten nor deleted with the Session.
func TestKubeCredentialsSecretTaken(t *testing.T) {
	e := startKube(t)
	e.kubeSecret(t, "mine-sandgate", "the-users-own")
	e.session(t, "mine")
	u := e.waitStatus(t, kube.SessionGVR, "mine", func(u *unstructured.Unstructured) bool { return phase(u) != "" && phase(u) != kube.PhasePending })
	if st, reason := readyCond(u); phase(u) != kube.PhaseFailed || st != "False" || reason != "SecretConflict" {
		t.Errorf("Session whose credentials Secret name is taken: phase %q, Ready %s (%s)", phase(u), st, reason)
	}
	if got := e.secret(t, "mine-sandgate"); got["token"] != "the-users-own" || got["password"] != "" {
		t.Errorf("the user's Secret was overwritten: keys %d", len(got))
	}
	e.deleteSession(t, "mine")
	if got := e.secret(t, "mine-sandgate"); got["token"] != "the-users-own" {
		t.Errorf("the user's Secret after the Session was deleted: %v", got)
	}
	var list struct {
		Sessions []any `json:"sessions"`
	}
	if code := e.gw.api(t, http.MethodGet, "/v1/sessions", nil, &list); code != http.StatusOK || len(list.Sessions) != 0 {
		t.Errorf("sessions left: %d %d", code, len(list.Sessions))
	}
}
