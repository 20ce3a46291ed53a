package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/internal/kubetest"
	"github.com/sandgate/sandgate/kube"
	"github.com/sandgate/sandgate/tunnel"
)

// sandgate is the binary the tests run: $SANDGATE_BIN, or one built once
// (binDir) by the first test that needs it.
var (
	buildOnce   sync.Once
	binDir      string
	sandgateBin string
	buildErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if sandgateBin = os.Getenv("SANDGATE_BIN"); sandgateBin != "" {
			return
		}
		if binDir, buildErr = os.MkdirTemp("", "sandgate-bin-"); buildErr != nil {
			return
		}
		sandgateBin = filepath.Join(binDir, "sandgate")
		build := exec.Command("go", "build", "-o", sandgateBin, "../cmd/sandgate")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build sandgate: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return sandgateBin
}

// gatewayProc is a node agent: `sandgate serve` as the chart runs it,
// here on loopback with the workdir driver.
type gatewayProc struct {
	*gwtest.Binary
	DataDir, Token string
}

func startGateway(t *testing.T, token string, args ...string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{DataDir: t.TempDir(), Token: token}
	full := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", "workdir",
		"--keep-sandboxes-on-exit=false", "--teardown-queue=0"}, args...)
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--warm-pool") }) {
		full = append(full, "--warm-pool=0")
	}
	g.Binary = gwtest.StartBinary(t, binary(t), full...)
	t.Cleanup(func() {
		_ = g.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.Done:
		case <-time.After(30 * time.Second):
			_ = g.Cmd.Process.Kill()
			<-g.Done
			t.Errorf("sandgate serve ignored SIGTERM for 30s")
		}
		if code := g.Cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("sandgate serve exited %d: %s", code, g.Stderr.String())
		}
		entries, _ := os.ReadDir(filepath.Join(g.DataDir, "sessions"))
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				t.Errorf("session %s left behind", e.Name())
			}
		}
	})
	return g
}

func (g *gatewayProc) api(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	return gwtest.DoJSON(t, g.URL, g.Token, method, path, body, out)
}

// agentNS is the node agents' namespace (their service account, the Lease).
const agentNS = "sandgate-system"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// kubeEnv is a control plane with sandgate's CRDs (and agent-sandbox's,
// as the tests write them) and one node agent running the controller.
type kubeEnv struct {
	srv  *kubetest.Server
	core kubernetes.Interface
	dyn  dynamic.Interface
	gw   *gatewayProc
	ns   string
	key  string // the tenant's API key (tenant = namespace)
	kc   string // the node agents' kubeconfig
}

func startKube(t *testing.T, extra ...string) *kubeEnv {
	t.Helper()
	return startKubeCRDs(t, []string{"../deploy/helm/sandgate/crds/sessions.sandgate.dev.yaml", "testdata/agent-sandbox-crds.yaml"}, extra...)
}

// startKubeCRDs is startKube with only crds installed before the node
// agent starts.
func startKubeCRDs(t *testing.T, crds []string, extra ...string) *kubeEnv {
	t.Helper()
	srv := kubetest.Start(t, kubetest.Options{})
	e := &kubeEnv{srv: srv, core: srv.Client(t), ns: "team-a", key: "team-a-key"}
	var err error
	if e.dyn, err = dynamic.NewForConfig(srv.Config); err != nil {
		t.Fatal(err)
	}
	applyCRDs(t, e.dyn, crds...)
	srv.Namespace(t, e.ns)
	// The node agent runs as the service account deploy/rbac-controller.yaml
	// binds, as the chart's pods do: a rule missing there fails the tests.
	srv.ApplyRBAC(t, "../deploy/rbac-controller.yaml", agentNS)
	kc := srv.TokenKubeconfig(t, srv.ServiceAccountToken(t, agentNS, "sandgate"), "")
	e.kc = kc
	args := append([]string{"--kube-controller", "--kubeconfig", kc, "--kube-identity", "node-a", "--kube-lease-namespace", agentNS,
		"--api-key", e.ns + ":" + e.key}, extra...)
	e.gw = startGateway(t, e.key, args...)
	kubeWait(t, 60*time.Second, "the node agent to lead", func() bool {
		l, err := e.core.CoordinationV1().Leases(agentNS).Get(context.Background(), kube.LeaseName, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "node-a" &&
			strings.Contains(e.gw.Stderr.String(), "kube_controller_synced")
	})
	return e
}

// applyCRDs creates the CustomResourceDefinitions in files and waits until
// they are established.
func applyCRDs(t *testing.T, dyn dynamic.Interface, files ...string) {
	t.Helper()
	ctx := context.Background()
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var o map[string]any
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o == nil {
				continue
			}
			u := &unstructured.Unstructured{Object: o}
			if _, err := dyn.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: create %s: %v", f, u.GetName(), err)
			}
			names = append(names, u.GetName())
		}
	}
	for _, n := range names {
		kubeWait(t, 30*time.Second, "CRD "+n+" established", func() bool {
			u, err := dyn.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return true
				}
			}
			return false
		})
	}
}

func kubeWait(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *kubeEnv) create(t *testing.T, gvr schema.GroupVersionResource, obj map[string]any) *unstructured.Unstructured {
	t.Helper()
	u, err := e.dyn.Resource(gvr).Namespace(e.ns).Create(context.Background(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %v: %v", gvr.Resource, err)
	}
	return u
}

// waitStatus waits until name's status satisfies ok, and returns it.
func (e *kubeEnv) waitStatus(t *testing.T, gvr schema.GroupVersionResource, name string, ok func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	kubeWait(t, 60*time.Second, gvr.Resource+" "+name+"'s status", func() bool {
		var err error
		u, err = e.dyn.Resource(gvr).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && ok(u)
	})
	return u
}

func (e *kubeEnv) secret(t *testing.T, name string) map[string]string {
	t.Helper()
	s, err := e.core.CoreV1().Secrets(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("secret %s: %v", name, err)
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out
}

// ssh runs cmd in session id over the tunnel with the password.
func (e *kubeEnv) ssh(t *testing.T, id, password, cmd string) string {
	t.Helper()
	d := &tunnel.Dialer{APIURL: e.gw.URL, Token: e.key, Timeout: 10 * time.Second}
	conn, err := d.Dial(context.Background(), id)
	if err != nil {
		t.Fatalf("tunnel to %s: %v", id, err)
	}
	cfg := &gossh.ClientConfig{User: "sandbox", Auth: []gossh.AuthMethod{gossh.Password(password)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second} // the host key is checked apart (knownHosts)
	cc, chans, reqs, err := gossh.NewClientConn(conn, id, cfg)
	if err != nil {
		conn.Close()
		t.Fatalf("ssh to %s: %v", id, err)
	}
	c := gossh.NewClient(cc, chans, reqs)
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.Output(cmd)
	if err != nil {
		t.Fatalf("ssh %q: %v", cmd, err)
	}
	return string(out)
}

// command runs cmd in session id through REST and returns its stdout.
func (e *kubeEnv) command(t *testing.T, id, cmd string) string {
	t.Helper()
	var out struct {
		Stdout   string `json:"stdout"`
		ExitCode *int   `json:"exitCode"`
	}
	if code := e.gw.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": cmd}, &out); code != http.StatusOK {
		t.Fatalf("command in %s: %d", id, code)
	}
	return out.Stdout
}

func phase(u *unstructured.Unstructured) string {
	p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	return p
}

func readyCond(u *unstructured.Unstructured) (status, reason string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Ready" {
			s, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			return s, r
		}
	}
	return "", ""
}

// TestKubeSession: a Session becomes a session of the namespace's tenant,
// with its Kubernetes Secret in the environment, credentials in a Secret
// the Session owns and a status kubectl shows; REST and SSH reach it;
// deleting the Session ends the session and takes the Secret away.
func TestKubeSession(t *testing.T) {
	e := startKube(t)
	ctx := context.Background()
	if _, err := e.core.CoreV1().Secrets(e.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gh"}, StringData: map[string]string{"token": "s3cret-from-k8s"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(t, kube.SessionGVR, map[string]any{
		"apiVersion": "sandgate.dev/v1alpha1", "kind": "Session",
		"metadata": map[string]any{"name": "work"},
		"spec": map[string]any{
			"ttl": 600, "labels": map[string]any{"team": "a"},
			"resources": map[string]any{"memoryMiB": 256},
			"secrets":   []any{map[string]any{"name": "GH_TOKEN", "secretRef": map[string]any{"name": "gh", "key": "token"}}},
		},
	})
	u := e.waitStatus(t, kube.SessionGVR, "work", func(u *unstructured.Unstructured) bool { return phase(u) != "" && phase(u) != kube.PhasePending })
	if phase(u) != kube.PhaseRunning {
		t.Fatalf("phase %q, status %v", phase(u), u.Object["status"])
	}
	id, _, _ := unstructured.NestedString(u.Object, "status", "sessionId")
	node, _, _ := unstructured.NestedString(u.Object, "status", "node")
	secretName, _, _ := unstructured.NestedString(u.Object, "status", "credentialsSecret")
	if st, reason := readyCond(u); st != "True" || node != "node-a" || secretName == "" {
		t.Fatalf("Ready %s (%s), node %q, secret %q", st, reason, node, secretName)
	}
	if !slices.Contains(u.GetFinalizers(), "sandgate.dev/session") {
		t.Errorf("finalizers %v", u.GetFinalizers())
	}
	creds := e.secret(t, secretName)
	if creds["sessionId"] != id || creds["password"] == "" || !strings.HasSuffix(creds["endpoint"], "/v1/sessions/"+id) {
		t.Fatalf("credentials secret: %v", slices.Sorted(func(yield func(string) bool) {
			for k := range creds {
				if !yield(k) {
					return
				}
			}
		}))
	}
	// REST, as the namespace's tenant: the session and its labels.
	var got struct {
		Metadata  map[string]any `json:"metadata"`
		Resources struct {
			MemoryMiB int `json:"memoryMiB"`
		} `json:"resources"`
		TTL int `json:"ttl"`
	}
	if code := e.gw.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &got); code != http.StatusOK {
		t.Fatalf("GET session: %d", code)
	}
	if got.Metadata["team"] != "a" || got.Resources.MemoryMiB != 256 || got.TTL != 600 {
		t.Errorf("session as REST shows it: %+v", got)
	}
	if out := e.command(t, id, "echo rest-ok"); out != "rest-ok\n" {
		t.Errorf("REST command: %q", out)
	}
	// SSH with the Secret's password; the Kubernetes Secret's value is in
	// the environment.
	if out := e.ssh(t, id, creds["password"], "printf %s \"$GH_TOKEN\""); out != "s3cret-from-k8s" {
		t.Errorf("GH_TOKEN over SSH: %q", out)
	}

	// Deleting the Session ends the session and its Secret.
	if err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).Delete(ctx, "work", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeWait(t, 60*time.Second, "the Session to be gone", func() bool {
		_, err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).Get(ctx, "work", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if code := e.gw.api(t, http.MethodGet, "/v1/sessions/"+id, nil, nil); code == http.StatusOK {
		t.Errorf("session %s still there after its Session was deleted", id)
	}
	if _, err := e.core.CoreV1().Secrets(e.ns).Get(ctx, secretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("credentials Secret after delete: %v", err)
	}
}

// TestKubeSessionRefused: a Session the gateway refuses (an image it does
// not have) is Failed with the error code as its reason, and nothing is
// left once it is deleted.
func TestKubeSessionRefused(t *testing.T) {
	e := startKube(t)
	e.create(t, kube.SessionGVR, map[string]any{
		"apiVersion": "sandgate.dev/v1alpha1", "kind": "Session",
		"metadata": map[string]any{"name": "bad"},
		"spec":     map[string]any{"image": "no-such-image:1"},
	})
	u := e.waitStatus(t, kube.SessionGVR, "bad", func(u *unstructured.Unstructured) bool { return phase(u) == kube.PhaseFailed })
	if st, reason := readyCond(u); st != "False" || reason == "" {
		t.Errorf("Ready %s %s", st, reason)
	}
	ctx := context.Background()
	if err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).Delete(ctx, "bad", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeWait(t, 60*time.Second, "the Session to be gone", func() bool {
		_, err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).Get(ctx, "bad", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// TestKubeSandboxClaim: a claim on a warm pool marked for sandgate is
// fulfilled by a session (no Pod), with the claim's env in it, Ready as
// agent-sandbox's API has it, and its endpoint and token in a Secret the
// claim owns; a claim on an unmarked pool is left to agent-sandbox.
func TestKubeSandboxClaim(t *testing.T) {
	e := startKube(t, "--warm-pool=2")
	ctx := context.Background()
	e.create(t, kube.TemplateGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": "py"},
		"spec":     map[string]any{"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "python:3.12-slim"}}}}},
	})
	for _, p := range []struct {
		name   string
		marked bool
	}{{"sg-pool", true}, {"pod-pool", false}} {
		meta := map[string]any{"name": p.name}
		if p.marked {
			meta["labels"] = map[string]any{kube.RuntimeKey: kube.RuntimeValue}
		}
		e.create(t, kube.WarmPoolGVR, map[string]any{
			"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool", "metadata": meta,
			"spec": map[string]any{"replicas": 2, "sandboxTemplateRef": map[string]any{"name": "py"}},
		})
	}
	e.create(t, kube.ClaimGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "agent-1"},
		"spec": map[string]any{
			"warmPoolRef": map[string]any{"name": "sg-pool"},
			"env":         []any{map[string]any{"name": "TASK", "value": "claim-env"}},
		},
	})
	e.create(t, kube.ClaimGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "other"},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "pod-pool"}},
	})
	u := e.waitStatus(t, kube.ClaimGVR, "agent-1", func(u *unstructured.Unstructured) bool { st, _ := readyCond(u); return st != "" })
	if st, reason := readyCond(u); st != "True" || reason != "DependenciesReady" {
		t.Fatalf("Ready %s (%s): %v", st, reason, u.Object["status"])
	}
	id, _, _ := unstructured.NestedString(u.Object, "status", "sandbox", "name")
	creds := e.secret(t, "agent-1-sandgate")
	if creds["sandboxId"] != id || creds["token"] == "" || creds["endpoint"] == "" {
		t.Fatalf("claim secret: sandboxId %q token set %v endpoint %q", creds["sandboxId"], creds["token"] != "", creds["endpoint"])
	}
	if out := e.ssh(t, id, creds["token"], "printf %s \"$TASK\""); out != "claim-env" {
		t.Errorf("claim env over SSH: %q", out)
	}
	if out := e.command(t, id, "printf %s \"$TASK\""); out != "claim-env" {
		t.Errorf("claim env over REST: %q", out)
	}
	// The sandbox-router's way in: X-Sandbox-ID and the claim's token.
	if code, body := routerExec(t, e.gw.URL, id, creds["token"], `printf %s "$TASK"`); code != http.StatusOK || body["stdout"] != "claim-env" || body["exit_code"] != float64(0) {
		t.Errorf("router /execute: %d %v", code, body)
	}
	if code, _ := routerExec(t, e.gw.URL, id, "wrong-token", "true"); code != http.StatusUnauthorized {
		t.Errorf("router /execute with a wrong token: %d, want 401", code)
	}
	// The unmarked pool's claim is not sandgate's.
	o, err := e.dyn.Resource(kube.ClaimGVR).Namespace(e.ns).Get(ctx, "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.GetFinalizers()) > 0 || o.Object["status"] != nil {
		t.Errorf("a claim of an unmarked pool was touched: finalizers %v status %v", o.GetFinalizers(), o.Object["status"])
	}

	if err := e.dyn.Resource(kube.ClaimGVR).Namespace(e.ns).Delete(ctx, "agent-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeWait(t, 60*time.Second, "the claim to be gone", func() bool {
		_, err := e.dyn.Resource(kube.ClaimGVR).Namespace(e.ns).Get(ctx, "agent-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if code := e.gw.api(t, http.MethodGet, "/v1/sessions/"+id, nil, nil); code == http.StatusOK {
		t.Errorf("session %s still there after its claim was deleted", id)
	}
	if _, err := e.core.CoreV1().Secrets(e.ns).Get(ctx, "agent-1-sandgate", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claim Secret after delete: %v", err)
	}
}

// benchConfig is what bench/run's row 13 asks of TestKubeBench
// ($SANDGATE_KUBE_BENCH, JSON); without it the test runs a few of each
// and only logs the times.
type benchConfig struct {
	N    int `json:"n"`    // creates per way (13a, 13b)
	Many int `json:"many"` // Sessions held at once (13c); 0: not run
}

// benchOut prints one result line for bench/run (samples in seconds).
func benchOut(t *testing.T, v map[string]any) {
	b, _ := json.Marshal(v)
	fmt.Printf("SGBENCH %s\n", b)
	t.Logf("%s", b)
}

// TestKubeBench: a Session's create, and a SandboxClaim's fulfilment, to
// the first command answered (REST), through the API server; and many
// Sessions held by one node agent. It asserts nothing of the times.
func TestKubeBench(t *testing.T) {
	cfg := benchConfig{N: 5}
	if v := os.Getenv("SANDGATE_KUBE_BENCH"); v != "" {
		if err := json.Unmarshal([]byte(v), &cfg); err != nil {
			t.Fatalf("SANDGATE_KUBE_BENCH: %v", err)
		}
	}
	limit := strconv.Itoa(max(cfg.Many+50, 200))
	e := startKube(t, "--warm-pool=4", "--max-sessions="+limit, "--max-sessions-per-tenant="+limit)
	ctx := context.Background()
	e.create(t, kube.WarmPoolGVR, map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": "sg", "annotations": map[string]any{kube.RuntimeKey: kube.RuntimeValue}},
		"spec":     map[string]any{"replicas": 4},
	})
	sessionID := func(u *unstructured.Unstructured) string {
		s, _, _ := unstructured.NestedString(u.Object, "status", "sessionId")
		return s
	}
	claimID := func(u *unstructured.Unstructured) string {
		s, _, _ := unstructured.NestedString(u.Object, "status", "sandbox", "name")
		return s
	}
	session := func(name string) map[string]any {
		return map[string]any{"apiVersion": "sandgate.dev/v1alpha1", "kind": "Session", "metadata": map[string]any{"name": name}, "spec": map[string]any{}}
	}
	claim := func(name string) map[string]any {
		return map[string]any{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"warmPoolRef": map[string]any{"name": "sg"}}}
	}
	// fulfil creates obj and waits (a watch) until idOf finds its session.
	fulfil := func(gvr schema.GroupVersionResource, obj map[string]any, idOf func(*unstructured.Unstructured) string) string {
		name := obj["metadata"].(map[string]any)["name"].(string)
		res := e.dyn.Resource(gvr).Namespace(e.ns)
		l, err := res.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		w, err := res.Watch(ctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		e.create(t, gvr, obj)
		timeout := time.After(120 * time.Second)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok { // the watch ended: read it instead
					w.Stop()
					kubeWait(t, 120*time.Second, name+" fulfilled", func() bool {
						g, err := res.Get(ctx, name, metav1.GetOptions{})
						return err == nil && idOf(g) != ""
					})
					g, _ := res.Get(ctx, name, metav1.GetOptions{})
					return idOf(g)
				}
				if g, ok := ev.Object.(*unstructured.Unstructured); ok && g.GetName() == name {
					if id := idOf(g); id != "" {
						return id
					}
				}
			case <-timeout:
				u, _ := res.Get(ctx, name, metav1.GetOptions{})
				t.Fatalf("%s %s not fulfilled in 120s: %v\ngateway log:\n%s", gvr.Resource, name, u, lastLog(e.gw.Stderr.String(), 30))
			}
		}
	}
	measure := func(gvr schema.GroupVersionResource, obj func(string) map[string]any, idOf func(*unstructured.Unstructured) string, prefix string) []float64 {
		var xs []float64
		for i := range cfg.N {
			name := fmt.Sprintf("%s-%d", prefix, i)
			start := time.Now()
			id := fulfil(gvr, obj(name), idOf)
			e.command(t, id, "true")
			xs = append(xs, time.Since(start).Seconds())
			_ = e.dyn.Resource(gvr).Namespace(e.ns).Delete(ctx, name, metav1.DeleteOptions{})
			time.Sleep(200 * time.Millisecond) // the warm pool refills
		}
		return xs
	}
	benchOut(t, map[string]any{"row": "13a", "samples": measure(kube.SessionGVR, session, sessionID, "lat")})
	benchOut(t, map[string]any{"row": "13b", "samples": measure(kube.ClaimGVR, claim, claimID, "claim")})
	if cfg.Many == 0 {
		return
	}
	// 13c: Many Sessions at once, created by a pool of clients; each
	// one's create -> Running, the agent's and the API server's memory.
	apiPid := pidOf(t, "kube-apiserver", e.srv.Dir)
	rss0, api0 := rssKiB(e.gw.Cmd.Process.Pid), rssKiB(apiPid)
	ids := make([]string, cfg.Many)
	lat := make([]float64, cfg.Many)
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				t0 := time.Now()
				ids[i] = fulfil(kube.SessionGVR, session(fmt.Sprintf("many-%d", i)), sessionID)
				lat[i] = time.Since(t0).Seconds()
			}
		})
	}
	for i := range cfg.Many {
		next <- i
	}
	close(next)
	wg.Wait()
	all := time.Since(start).Seconds()
	// The first command of a few, with all of them held.
	var cmds []float64
	for i := 0; i < cfg.Many; i += max(cfg.Many/20, 1) {
		t0 := time.Now()
		e.command(t, ids[i], "true")
		cmds = append(cmds, time.Since(t0).Seconds())
	}
	rss1, api1 := rssKiB(e.gw.Cmd.Process.Pid), rssKiB(apiPid)
	benchOut(t, map[string]any{"row": "13c", "samples": lat, "commands": cmds, "seconds": all, "many": cfg.Many,
		"agentRSSKiB": []int64{rss0, rss1}, "apiserverRSSKiB": []int64{api0, api1}})
	if err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeWait(t, 10*time.Minute, "every Session to be gone", func() bool {
		l, err := e.dyn.Resource(kube.SessionGVR).Namespace(e.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

// pidOf is the process named comm whose command line holds arg (0: none).
func pidOf(t *testing.T, comm, arg string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if strings.Contains(string(cl), comm) && strings.Contains(string(cl), arg) {
			return pid
		}
	}
	return 0
}

// rssKiB is pid's resident set (VmRSS), 0 when unknown.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// routerExec sends POST /execute as agent-sandbox's sandbox-router does.
func routerExec(t *testing.T, base, id, token, cmd string) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"command": cmd})
	req, err := http.NewRequest(http.MethodPost, base+"/execute", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Sandbox-ID", id)
	req.Header.Set("X-Sandbox-Namespace", "team-a")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// lastLog is the last n lines of a log.
func lastLog(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
