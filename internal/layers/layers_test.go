// Package layers holds no code: its test checks the import graph that
// docs/architecture.md ("Import graph") describes.
package layers

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/sandgate/sandgate/"

// forbidden maps a package (and the packages below it) to what none of
// them may import, directly or not: "X" is X and every package below it,
// "X/" only the packages below X, "=X" X alone.
var forbidden = map[string][]string{
	"sandbox":               {"gateway", "rest", "tunnel", "sshd", "cmd", "sftpd", "egress"},
	"sandbox/linuxns/initd": {"=sandbox/linuxns", "sandbox/workdir", "internal/cgroup"},
	"sandbox/linuxns/ctl":   {"=sandbox/linuxns", "sandbox/linuxns/initd", "sandbox/workdir", "internal/cgroup"},
	// seccompprog assembles the filter in the gateway; the init only loads it.
	"sandbox/linuxns/seccompprog": {"=sandbox/linuxns", "sandbox/linuxns/initd", "sandbox/linuxns/ctl", "sandbox/workdir", "internal"},
	"sandbox/workdir":             {"sandbox/linuxns"},
	// initexe only carries the small init's bytes: it links none of its code.
	"sandbox/linuxns/initexe": {"sandbox/linuxns/initd", "sftpd", "=sandbox/linuxns", "sandbox/linuxns/ctl", "internal"},
	// cmd/sandgate-init is the small binary every sandbox's init runs: the
	// sandbox side and sftp-server, none of the gateway (each package it
	// links adds its init() to every sandbox's start; initexe).
	"cmd/sandgate-init": {"gateway", "rest", "tunnel", "sshd", "=cmd/sandgate", "=sandbox/linuxns", "sandbox/workdir",
		"sandbox/linuxns/initexe", "sandbox/linuxns/seccompprog", "internal/cgroup", "images", "egress", "audit", "cluster", "workspace", "dataplane", "mcpserver",
		"console", "api-spec"},
	"gateway": {"rest", "tunnel", "sshd", "cmd", "sandbox/", "images"},
	// rest serves /v1 and knows nothing of the compat APIs mounted on it.
	"rest": {"tunnel", "sshd", "cmd", "sandbox/", "images", "rest/compat"},
	// rest/compat maps the seeds' APIs onto the engines /v1 serves, through
	// rest's exported seams (Mount, Links, WriteGatewayError...).
	"rest/compat":        {"tunnel", "sshd", "cmd", "sandbox/", "images", "cluster"},
	"tunnel":             {"rest", "sshd", "cmd", "sandbox/"},
	"sshd":               {"rest", "tunnel", "cmd", "sandbox/"},
	"sftpd":              {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal"},
	"internal/cgroup":    {"sandbox/", "gateway", "rest", "tunnel", "sshd", "cmd"},
	"internal/procio":    {"sandbox/", "gateway", "rest", "tunnel", "sshd", "cmd"},
	"internal/mountinfo": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"images":             {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "sftpd"},
	"dataplane":          {"rest", "tunnel", "sshd", "cmd", "sandbox/", "images"},
	"workspace":          {"rest", "tunnel", "sshd", "cmd", "sandbox/", "images", "dataplane"},
	"egress":             {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "sftpd", "images", "internal"},
	"audit":              {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "sftpd", "images", "internal", "egress", "dataplane"},
	// cluster wraps the gateway's store and relays requests by HTTP: it
	// reaches sessions only through gateway, never the API's or SSH's code.
	"cluster": {"rest", "tunnel", "sshd", "cmd", "sftpd", "sandbox/", "images", "dataplane", "workspace"},
	// kube is the gateway's Kubernetes controller: it drives the Manager
	// in process, never the API or the tunnel.
	"kube":             {"rest", "tunnel", "sshd", "cmd", "sftpd", "sandbox/", "dataplane", "cluster"},
	"internal/metrics": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "sftpd", "images", "egress", "audit", "cluster", "workspace"},
	// connlimit may import droplog (a leaf), and no other internal package.
	"internal/connlimit": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/cgroup", "internal/procio",
		"internal/mountinfo", "internal/metrics", "internal/readyfile", "internal/rawio", "internal/procgov",
		"internal/piperelay", "internal/tcptest", "internal/s3test", "internal/gwtest"},
	"internal/droplog":   {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"internal/readyfile": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"internal/rawio":     {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"internal/procgov":   {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"internal/piperelay": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"internal/tcptest":   {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},
	"internal/sbom":      {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/"},           // make dist: the standard library only
	"internal/ociimage":  {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "internal/", "images"}, // make dist
	"internal/s3test":    {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "workspace", "cluster"},
	// kubetest runs a control plane (etcd, kube-apiserver) for tests: none of the gateway's code.
	"internal/kubetest": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "workspace", "cluster", "internal/"},
	// console is static files a browser runs: they call the REST API like
	// any client, so the package needs none of the gateway's code.
	"console": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "sftpd", "egress", "dataplane", "images", "internal", "api-spec",
		"audit", "cluster", "workspace", "mcpserver"},
	// mcpserver is a client of the REST API: none of the gateway's code.
	"mcpserver": {"sandbox", "gateway", "rest", "tunnel", "sshd", "cmd", "sftpd", "egress", "dataplane", "images", "internal", "api-spec"},
}

// allowedSelf lists what a package under a forbidden prefix may still
// import: itself and its own children.
func allowedSelf(pkg, dep string) bool {
	return dep == pkg || strings.HasPrefix(dep, pkg+"/")
}

// banned reports whether package d matches ban (see forbidden).
func banned(d, ban string) bool {
	if exact, ok := strings.CutPrefix(ban, "="); ok {
		return d == exact
	}
	if parent, ok := strings.CutSuffix(ban, "/"); ok {
		return strings.HasPrefix(d, parent+"/")
	}
	return d == ban || strings.HasPrefix(d, ban+"/")
}

func TestImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-json", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkg := strings.TrimPrefix(p.ImportPath, module)
		for prefix, bans := range forbidden {
			if pkg != prefix && !strings.HasPrefix(pkg, prefix+"/") {
				continue
			}
			checked++
			for _, dep := range p.Deps {
				d, ok := strings.CutPrefix(dep, module)
				if !ok || allowedSelf(pkg, d) {
					continue
				}
				for _, ban := range bans {
					// A package inside a banned subtree may import its
					// siblings there (rest/compat/e2b/envd's generated
					// packages import each other; "rest" bans rest/compat
					// for rest's own code).
					if banned(d, ban) && !banned(pkg, ban) {
						t.Errorf("%s imports %s (directly or not): docs/architecture.md forbids %s -> %s", pkg, d, prefix, ban)
					}
				}
			}
		}
	}
	if checked < len(forbidden) {
		t.Fatalf("checked %d packages, want at least %d: did the layout change?", checked, len(forbidden))
	}
}
