package charttest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLint is `helm lint --strict` on the chart, with its default values
// and with the other shapes the values select.
func TestLint(t *testing.T) {
	for _, c := range []struct {
		name string
		vals map[string]any
	}{
		{"defaults", nil},
		{"statefulset", map[string]any{"nodeAgent": map[string]any{"kind": "StatefulSet", "nodeSelector": map[string]any{"sandgate.dev/pool": "agents"}}}},
		{"unprivileged", map[string]any{"nodeAgent": map[string]any{"privileged": false, "hostDev": true}}},
		{"everything", everything()},
	} {
		t.Run(c.name, func(t *testing.T) {
			msgs, err := Lint(ChartDir(), c.vals)
			for _, m := range msgs {
				t.Log(m)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// everything turns on every optional object and every Secret.
func everything() map[string]any {
	return map[string]any{
		"auth": map[string]any{
			"apiKeys": map[string]any{"existingSecret": "sg-keys"},
			"jwt": map[string]any{"existingSecret": "sg-jwt", "secretKey": "hs256", "issuer": "https://issuer.test",
				"audience": "sandgate"},
			"metricsTokenSecret": "sg-metrics",
		},
		"sessionSecrets": map[string]any{"existingSecret": "sg-session-secrets"},
		"metrics":        map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
		"networkPolicy":  map[string]any{"enabled": true},
		"ingress":        map[string]any{"enabled": true, "className": "nginx", "tlsSecret": "sg-tls"},
		"cluster":        map[string]any{"leaseTTL": "15s", "tokenSecret": "sg-token"},
	}
}

// TestRenderDefaults renders the chart with its default values and checks
// the node agent as docs/kubernetes.md describes it.
func TestRenderDefaults(t *testing.T) {
	objs, err := Render(ChartDir(), "sg", "sandgate", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]Object{}
	for _, o := range objs {
		t.Logf("%s %s/%s (%s)", o.Kind(), o.Namespace(), o.Name(), o.Source)
		kinds[o.Kind()] = o
	}
	for _, k := range []string{"DaemonSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "PodDisruptionBudget", "Secret"} {
		if _, ok := kinds[k]; !ok {
			t.Errorf("no %s rendered with the default values", k)
		}
	}
	for _, k := range []string{"StatefulSet", "Ingress", "NetworkPolicy", "ServiceMonitor"} {
		if _, ok := kinds[k]; ok {
			t.Errorf("%s rendered with the default values; it is optional", k)
		}
	}
	// A DaemonSet has no scale: its budget must be minAvailable (an
	// integer), which the disruption controller counts pods against.
	pdb := kinds["PodDisruptionBudget"]
	if got := dig(pdb.Body, "spec", "minAvailable"); got != float64(1) || dig(pdb.Body, "spec", "maxUnavailable") != nil {
		t.Errorf("DaemonSet's PodDisruptionBudget spec %v, want minAvailable 1 only", pdb.Body["spec"])
	}
	ds := kinds["DaemonSet"]
	spec := dig(ds.Body, "spec", "template", "spec").(map[string]any)
	c := spec["containers"].([]any)[0].(map[string]any)
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"serve", "--sandbox=linux", "--sandbox-require-limits", "--cluster-kube", "--kube-controller",
		"--cluster-advertise=http://$(POD_IP):8080", "--cluster-token-file=/etc/sandgate/cluster/token", "--shutdown-timeout=10s"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	if got := dig(c, "readinessProbe", "httpGet", "path"); got != "/readyz" {
		t.Errorf("readiness probe path %v, want /readyz", got)
	}
	if got := dig(c, "livenessProbe", "httpGet", "path"); got != "/healthz" {
		t.Errorf("liveness probe path %v, want /healthz", got)
	}
	if got := dig(c, "lifecycle", "preStop", "sleep", "seconds"); got != float64(5) {
		t.Errorf("preStop sleep %v, want 5", got)
	}
	// 5 s preStop + 3 x 10 s shutdown-timeout + 15 s.
	if got := spec["terminationGracePeriodSeconds"]; got != float64(50) {
		t.Errorf("terminationGracePeriodSeconds %v, want 50", got)
	}
	if got := dig(c, "securityContext", "privileged"); got != true {
		t.Errorf("privileged %v, want true by default", got)
	}
	if spec["hostPID"] != true {
		t.Errorf("hostPID %v, want true (sessions outlive a restart)", spec["hostPID"])
	}
	// The image make dist builds: sandgate:VERSION, VERSION the appVersion.
	if got := c["image"]; got != "sandgate:dev" {
		t.Errorf("image %v, want sandgate:dev (internal/ociimage's tag, appVersion)", got)
	}
}

// TestRoleCoversStore: the chart's Role (release namespace) grants every
// rule of deploy/rbac-store.yaml, the Role the cluster store's tests run
// their nodes under (cluster/kubestore, cmd/sandgate TestClusterKube).
func TestRoleCoversStore(t *testing.T) {
	objs, err := Render(ChartDir(), "sg", "sandgate", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{}
	for _, o := range objs {
		if o.Kind() == "Role" {
			for _, r := range rules(o.Body) {
				granted[r] = true
			}
		}
	}
	ref, err := os.ReadFile(filepath.Join(ChartDir(), "..", "..", "rbac-store.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := split("rbac-store.yaml", string(ref))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range docs {
		if d.Kind() != "Role" {
			continue
		}
		for _, r := range rules(d.Body) {
			n++
			if !granted[r] {
				t.Errorf("deploy/rbac-store.yaml grants %s; the chart's Role does not", r)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules read from deploy/rbac-store.yaml")
	}
}

// rules flattens a Role's rules to group/resource:verb strings.
func rules(body map[string]any) []string {
	var out []string
	rs, _ := body["rules"].([]any)
	for _, r := range rs {
		m := r.(map[string]any)
		for _, g := range toStrings(m["apiGroups"]) {
			for _, res := range toStrings(m["resources"]) {
				for _, v := range toStrings(m["verbs"]) {
					out = append(out, g+"/"+res+":"+v)
				}
			}
		}
	}
	return out
}

// TestRenderStatefulSet checks the StatefulSet shape: a headless service,
// replicas, and one agent per node.
func TestRenderStatefulSet(t *testing.T) {
	objs, err := Render(ChartDir(), "sg", "sandgate", map[string]any{"nodeAgent": map[string]any{
		"kind": "StatefulSet", "replicas": 2, "nodeSelector": map[string]any{"sandgate.dev/pool": "agents"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sts *Object
	for i, o := range objs {
		if o.Kind() == "DaemonSet" {
			t.Errorf("DaemonSet rendered with kind StatefulSet")
		}
		if o.Kind() == "StatefulSet" {
			sts = &objs[i]
		}
	}
	if sts == nil {
		t.Fatal("no StatefulSet")
	}
	for _, o := range objs {
		if o.Kind() == "PodDisruptionBudget" && dig(o.Body, "spec", "maxUnavailable") != float64(1) {
			t.Errorf("StatefulSet's PodDisruptionBudget spec %v, want maxUnavailable 1", o.Body["spec"])
		}
	}
	if got := dig(sts.Body, "spec", "serviceName"); got != "sg-sandgate-nodes" {
		t.Errorf("serviceName %v", got)
	}
	if got := dig(sts.Body, "spec", "template", "spec", "affinity", "podAntiAffinity"); got == nil {
		t.Error("no anti-affinity: two agents could share a node")
	}
	if got := dig(sts.Body, "spec", "template", "spec", "nodeSelector", "sandgate.dev/pool"); got != "agents" {
		t.Errorf("nodeSelector %v", got)
	}
}

// TestRenderBadKind: a kind other than DaemonSet or StatefulSet is refused
// with a message naming the value.
func TestRenderBadKind(t *testing.T) {
	_, err := Render(ChartDir(), "sg", "sandgate", map[string]any{"nodeAgent": map[string]any{"kind": "Deployment"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "nodeAgent.kind") {
		t.Fatalf("err %v, want one naming nodeAgent.kind", err)
	}
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
