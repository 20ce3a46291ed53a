package charttest

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/kubetest"
)

// TestAgentAsChartRunsIt runs `sandgate serve` as a process on this host
// with the arguments and environment the chart's default render gives the
// node agent's container, as the chart's service account (RBAC applied
// from the same render): the pod's paths become temp dirs, $(POD_IP)
// loopback, the in-cluster config a kubeconfig holding the service
// account's token. The agent must pass its startup check, become ready
// (/readyz), and hold its node Lease in the release's namespace. A flag
// the chart passes that the binary does not know fails here, and so does
// the controller (--kube-controller) failing to start: the chart's CRDs
// and agent-sandbox's (the test copy kube/ uses, which the chart does not
// install) are applied first, as on a cluster running agent-sandbox.
func TestAgentAsChartRunsIt(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the node agent's linux driver needs root in CI")
		}
		t.Skip("the node agent's linux driver needs root")
	}
	srv := kubetest.Start(t, kubetest.Options{})
	const ns, release = "sandgate", "sg"
	srv.Namespace(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	objs, err := Render(ChartDir(), release, ns, nil, srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC and the service account, from the render.
	rbac := filepath.Join(t.TempDir(), "rbac.yaml")
	var docs []string
	var container map[string]any
	var token []byte
	var crds []Object
	for _, o := range objs {
		switch o.Kind() {
		case "CustomResourceDefinition":
			crds = append(crds, o)
		case "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			b, err := yamlOf(o.Body)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, b)
		case "DaemonSet":
			container = dig(o.Body, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
		case "Secret":
			if strings.HasSuffix(o.Name(), "-cluster-token") {
				token, _ = base64.StdEncoding.DecodeString(dig(o.Body, "data", "token").(string))
			}
		}
	}
	if err := os.WriteFile(rbac, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.ApplyRBAC(t, rbac, ns)
	sandboxCRDs, err := readObjects(filepath.Join(ChartDir(), "..", "..", "..", "kube", "testdata", "agent-sandbox-crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applyCRDs(ctx, t, srv.Config, append(crds, sandboxCRDs...))
	kubeconfig := srv.TokenKubeconfig(t, srv.ServiceAccountToken(t, ns, release+"-sandgate"), ns)

	// The pod's files and addresses, on this host.
	dir := t.TempDir()
	data, tokenFile := filepath.Join(dir, "data"), filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, token, 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	var args []string
	for _, a := range toStrings(container["args"]) {
		a = strings.ReplaceAll(a, "$(POD_IP)", "127.0.0.1")
		a = strings.ReplaceAll(a, "/var/lib/sandgate", data)
		a = strings.ReplaceAll(a, "/etc/sandgate/cluster/token", tokenFile)
		a = regexp.MustCompile(`^--listen=0\.0\.0\.0:\d+$`).ReplaceAllString(a, "--listen=127.0.0.1:"+port)
		a = regexp.MustCompile(`:8080$`).ReplaceAllString(a, ":"+port)
		a = regexp.MustCompile(`^--metrics-listen=0\.0\.0\.0:`).ReplaceAllString(a, "--metrics-listen=127.0.0.1:")
		if strings.HasPrefix(a, "--metrics-listen=") {
			a = "--metrics-listen=127.0.0.1:" + freePort(t)
		}
		args = append(args, a)
	}
	ready := filepath.Join(dir, "ready")
	args = append(args, "--kubeconfig="+kubeconfig, "--ready-file="+ready, "--api-key=test-token", "--warm-pool=0")
	cmd := exec.Command(sandgateBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "POD_NAME=sg-sandgate-abcde", "POD_NAMESPACE=" + ns, "POD_IP=127.0.0.1", "NODE_NAME=node-1"}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("the agent ignored SIGTERM for 60s")
		}
	})
	t.Logf("sandgate %s", strings.Join(args, " "))
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the agent exited before it was ready: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("the agent was not ready in time:\n%s", stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	resp, err := http.Get("http://127.0.0.1:" + port + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz %d", resp.StatusCode)
	}
	// Its node Lease, renewed under the chart's Role, and the controller's
	// election Lease (kube.LeaseName), won by this agent: the controller
	// started under the chart's RBAC.
	admin := srv.Client(t)
	for {
		leases, err := admin.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		var node, leader bool
		if err == nil {
			for _, l := range leases.Items {
				node = node || strings.HasPrefix(l.Name, "sgkv-lease-")
				leader = leader || l.Name == "sandgate-controller" && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
			}
		}
		if node && leader {
			t.Logf("the agent holds its node Lease and leads the controller")
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no Lease in %s: %v\n%s", ns, err, stderr.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sandgateBinary is $SANDGATE_BIN, or the binary built from this tree.
func sandgateBinary(t *testing.T) string {
	if b := os.Getenv("SANDGATE_BIN"); b != "" {
		return b
	}
	out := filepath.Join(t.TempDir(), "sandgate")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/sandgate")
	cmd.Dir = filepath.Join(ChartDir(), "..", "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build sandgate: %v\n%s", err, b)
	}
	return out
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}
