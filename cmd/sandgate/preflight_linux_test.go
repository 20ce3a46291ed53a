package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestServePreflight_Root: `serve --sandbox linux` checks the driver's
// privileges before anything starts, and refuses with exit status 2 and
// one line on stderr naming what is missing and what grants it (in a
// Kubernetes pod, the Helm chart's value): no root, a capability dropped,
// a namespace type refused, cgroups read-only under
// --sandbox-require-limits. With them all, it
// starts.
func TestServePreflight_Root(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (it drops privileges from a root gateway); run the suite as root")
	}
	for _, tool := range []string{"setpriv", "unshare", "sh", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s (util-linux) is needed in CI: %v", tool, err)
			}
			t.Skipf("no %s: %v", tool, err)
		}
	}
	serve := func(dir string) []string {
		return []string{sandgateBin, "serve", "--sandbox", "linux", "--sandbox-require-limits", "--listen", "127.0.0.1:0",
			"--data-dir", dir, "--api-key", "test-token", "--warm-pool=0"}
	}
	// Read-only cgroup hierarchies, in a mount namespace of the test's own.
	roCgroups := `mount -o remount,bind,ro /sys/fs/cgroup 2>/dev/null
for m in /sys/fs/cgroup/*/; do mount -o remount,bind,ro "$m" 2>/dev/null; done
exec "$@"`
	for _, c := range []struct {
		name string
		wrap []string
		env  []string
		want []string
	}{
		{"not root", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, nil,
			[]string{"needs root", "uid 65534"}},
		{"no CAP_SYS_ADMIN", []string{"setpriv", "--bounding-set=-sys_admin"}, nil,
			[]string{"CAP_SYS_ADMIN", "dist/sandgate.service"}},
		{"no CAP_SYS_ADMIN in a pod", []string{"setpriv", "--bounding-set=-sys_admin,-setuid"}, []string{"KUBERNETES_SERVICE_HOST=10.0.0.1"},
			[]string{"CAP_SYS_ADMIN, CAP_SETUID", "Helm chart's nodeAgent.privileged=true"}},
		// In a user namespace of the test's own, whose limit on new
		// namespaces of one type is 0: root there with every capability,
		// but the kernel refuses that namespace (as seccomp would).
		{"no user namespaces", []string{"unshare", "--user", "--map-root-user", "sh", "-c",
			`echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"`, "sh"}, nil,
			[]string{"cannot create user namespaces", "max_user_namespaces"}},
		{"no network namespaces in a pod", []string{"unshare", "--user", "--map-root-user", "sh", "-c",
			`echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"`, "sh"}, []string{"KUBERNETES_SERVICE_HOST=10.0.0.1"},
			[]string{"cannot create network namespaces", "sysctl user.max_net_namespaces"}},
		{"read-only cgroups in a pod", []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", roCgroups, "sh"},
			[]string{"KUBERNETES_SERVICE_HOST=10.0.0.1"},
			[]string{"--sandbox-require-limits", "memory", "nodeAgent.hostCgroup=true"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			args := append(append([]string{}, c.wrap...), serve(dir)...)
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = append(cleanEnv(), c.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("serve did not refuse to start within 60s; stderr: %s", stderr.String())
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("serve: %v, want exit status 2; stderr: %s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 {
				t.Fatalf("stderr has %d lines, want one:\n%s", len(lines), stderr.String())
			}
			for _, w := range c.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("stderr %q lacks %q", lines[0], w)
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q: nothing should start", stdout.String())
			}
			t.Log(lines[0])
		})
	}
	t.Run("all present", func(t *testing.T) {
		// Where the linux driver runs at all (CI: always), the check passes
		// and the gateway starts.
		requireLinuxDriver(t)
		g := startGateway(t, "--sandbox", "linux", "--sandbox-require-limits")
		if code := g.api(t, "GET", "/readyz", nil, nil); code != 200 {
			t.Fatalf("readyz %d", code)
		}
	})
}
