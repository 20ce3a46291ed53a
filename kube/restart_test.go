package kube_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/kube"
)

// restartGateway stops e's node agent (its sessions kept) and starts
// another on the same data dir with the same flags, which restores them
// and leads again.
func (e *kubeEnv) restartGateway(t *testing.T) {
	t.Helper()
	old := e.gw
	_ = old.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-old.Done:
	case <-time.After(60 * time.Second):
		t.Fatal("sandgate serve ignored SIGTERM for 60s")
	}
	args := slices.Clone(old.Cmd.Args[1:])
	if i := slices.Index(args, "--ready-file"); i >= 0 {
		args = slices.Delete(args, i, i+2)
	}
	// This one tears the sessions down at its end.
	args = append(args, "--keep-sandboxes-on-exit=false")
	g := &gatewayProc{DataDir: old.DataDir, Token: old.Token}
	g.Binary = gwtest.StartBinary(t, binary(t), args...)
	t.Cleanup(func() {
		_ = g.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.Done:
		case <-time.After(30 * time.Second):
			_ = g.Cmd.Process.Kill()
			<-g.Done
			t.Errorf("sandgate serve ignored SIGTERM for 30s")
		}
	})
	e.gw = g
	kubeWait(t, 60*time.Second, "the restarted node agent's controller to sync", func() bool {
		return strings.Contains(g.Stderr.String(), "kube_controller_synced")
	})
}

// TestKubeSessionSecretsAfterRestart: a Session's Kubernetes Secret values
// were in the gateway's memory only; after the node agent restarts (same
// data dir, the session restored) the controller reads them again, and a
// new command in the session sees the Secret's value, never the
// --secrets-file value of the same name (before the fix it got that one).
// Until they are read again a command answers 503 secret_unavailable.
func TestKubeSessionSecretsAfterRestart(t *testing.T) {
	sf := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(sf, []byte("GH_TOKEN=operator-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startKube(t, "--secrets-file", sf, "--keep-sandboxes-on-exit=true")
	e.kubeSecret(t, "gh-one", "value-one")
	e.session(t, "one", ghSecret("gh-one"))
	id := e.running(t, "one")
	// A SandboxClaim's secrets annotation is the same.
	e.create(t, kube.WarmPoolGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": "sg-pool", "labels": map[string]any{kube.RuntimeKey: kube.RuntimeValue}},
		"spec":     map[string]any{"replicas": 0},
	})
	e.create(t, kube.ClaimGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "agent-1", "annotations": map[string]any{kube.AnnotationSecrets: "GH_TOKEN=gh-one/token"}},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "sg-pool"}},
	})
	u := e.waitStatus(t, kube.ClaimGVR, "agent-1", func(u *unstructured.Unstructured) bool { st, _ := readyCond(u); return st != "" })
	if st, reason := readyCond(u); st != "True" {
		t.Fatalf("claim Ready %s (%s): %v", st, reason, u.Object["status"])
	}
	claimID, _, _ := unstructured.NestedString(u.Object, "status", "sandbox", "name")
	for _, sid := range []string{id, claimID} {
		if out := e.command(t, sid, `printf %s "$GH_TOKEN"`); out != "value-one" {
			t.Fatalf("GH_TOKEN in %s before the restart: %q", sid, out)
		}
	}
	e.restartGateway(t)
	for _, sid := range []string{id, claimID} {
		e.waitSecret(t, sid)
	}
	if err := e.dyn.Resource(kube.ClaimGVR).Namespace(e.ns).Delete(context.Background(), "agent-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.deleteSession(t, "one")
}

// waitSecret waits until a command in session id sees GH_TOKEN's
// Kubernetes value; meanwhile it may only answer 503 secret_unavailable.
func (e *kubeEnv) waitSecret(t *testing.T, id string) {
	t.Helper()
	kubeWait(t, 60*time.Second, "the restored session "+id+"'s command to see the Secret's value", func() bool {
		var out struct {
			Stdout string `json:"stdout"`
			Error  struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		code := e.gw.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": `printf %s "$GH_TOKEN"`}, &out)
		switch {
		case code == http.StatusOK && out.Stdout == "value-one":
			return true
		case code == http.StatusOK:
			t.Fatalf("GH_TOKEN after the restart: %q, want value-one (never the operator's value)", out.Stdout)
		case code == http.StatusServiceUnavailable:
			if out.Error.Code != "secret_unavailable" {
				t.Fatalf("command after the restart: %d %q", code, out.Error.Code)
			}
		default:
			t.Fatalf("command after the restart: %d %q", code, out.Error.Code)
		}
		return false
	})
}
