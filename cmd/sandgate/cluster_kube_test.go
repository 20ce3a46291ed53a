package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/internal/kubetest"
)

// startKubeCluster runs a real kube-apiserver (internal/kubetest) and
// nodes as processes with --cluster-kube, each with a kubeconfig for the
// service account that deploy/rbac-store.yaml binds, as the chart runs
// them.
func startKubeCluster(t *testing.T, nodes int, extra ...string) []*clusterNode {
	t.Helper()
	s := kubetest.Start(t, kubetest.Options{})
	s.ApplyRBAC(t, "../../deploy/rbac-store.yaml", "sandgate")
	kubeconfig := s.TokenKubeconfig(t, s.ServiceAccountToken(t, "sandgate", "sandgate"), "sandgate")
	tok := filepath.Join(t.TempDir(), "cluster-token")
	if err := os.WriteFile(tok, []byte("cluster-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	extra = append([]string{"--api-key", "test-token", "--api-key", "other:other-token"}, extra...)
	var out []*clusterNode
	for range nodes {
		n := &clusterNode{port: gwtest.FreePort(t)}
		n.args = append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(n.port),
			"--cluster-kube", "--kubeconfig", kubeconfig, "--cluster-token-file", tok,
			"--cluster-advertise", "http://127.0.0.1:" + strconv.Itoa(n.port)}, extra...)
		n.gatewayProc = startGateway(t, n.args...)
		out = append(out, n)
	}
	return out
}

// Two node agents on the Kubernetes API as their store: a session made on
// A is served through B (REST and OpenSSH), the tenant quota is exact
// across them, and when A is killed its session, only, is marked failed
// within its lease.
func TestClusterKube(t *testing.T) {
	const quota = 3
	n := startKubeCluster(t, 2, "--cluster-lease-ttl", "3s", "--max-sessions-per-tenant", strconv.Itoa(quota))
	a, b := n[0], n[1]
	lost := a.createSession(t)
	if _, err := os.Stat(filepath.Join(a.DataDir, "sessions", lost.SessionID)); err != nil {
		t.Fatalf("node A did not keep the session it was asked for")
	}
	if code, out := runCommand(t, b.gatewayProc, lost.SessionID, "echo hello > note && cat note"); code != http.StatusOK || strings.TrimSpace(out) != "hello" {
		t.Fatalf("command through B: %d %q", code, out)
	}
	if out, errOut, code := sshRun(t, b.gatewayProc, lost, "cat note"); code != 0 || strings.TrimSpace(out) != "hello" {
		t.Fatalf("ssh through B: %d %q %s", code, out, errOut)
	}
	kept := b.createSession(t)
	if ids := listIDs(t, a.gatewayProc); len(ids) != 2 {
		t.Fatalf("list through A: %v", ids)
	}

	// Concurrent creates on both nodes: exactly the quota's rest succeeds.
	var mu sync.Mutex
	codes := map[int]int{}
	var made []string
	var wg sync.WaitGroup
	for i := range 6 {
		g := n[i%2]
		wg.Go(func() {
			var s clusterSession
			code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s)
			mu.Lock()
			defer mu.Unlock()
			codes[code]++
			if code == http.StatusCreated {
				made = append(made, s.SessionID)
			}
		})
	}
	wg.Wait()
	if codes[http.StatusCreated] != quota-2 || codes[http.StatusTooManyRequests] != 6-(quota-2) {
		t.Errorf("concurrent creates on two nodes: %v, want %d created", codes, quota-2)
	}
	for _, id := range made {
		if code := b.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete %s: %d", id, code)
		}
	}

	killed := time.Now()
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	// The limit only bounds a broken run: the lease is 3s.
	waitFor(t, 90*time.Second, "the lost node's session to fail", func() bool {
		_, st := getStatus(t, b.gatewayProc, lost.SessionID)
		return st.Status == "failed"
	})
	t.Logf("the lost node's session was failed %v after the kill (lease TTL 3s)", time.Since(killed).Round(time.Millisecond))
	if code, st := getStatus(t, b.gatewayProc, lost.SessionID); code != http.StatusOK || st.StatusReason != "node lost" {
		t.Errorf("lost session: %d %+v", code, st)
	}
	if code, st := getStatus(t, b.gatewayProc, kept.SessionID); code != http.StatusOK || st.Status != "running" {
		t.Errorf("B's session: %d %+v", code, st)
	}
	for _, id := range []string{lost.SessionID, kept.SessionID} {
		if code := b.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete %s: %d", id, code)
		}
	}
	if ids := listIDs(t, b.gatewayProc); len(ids) != 0 {
		t.Errorf("list after deletes: %v", ids)
	}
}

// A node on the Kubernetes store restarted by SIGTERM (a rolling upgrade,
// the chart's preStop drain) keeps its sessions: its restarting marker
// holds them while it is away, and it takes them back.
func TestClusterKubeRollingRestart(t *testing.T) {
	n := startKubeCluster(t, 2, "--keep-sandboxes-on-exit=true")
	var ss []sessionJSON
	for i, g := range n {
		s := g.createSession(t)
		if code, out := runCommand(t, g.gatewayProc, s.SessionID, "echo node"+strconv.Itoa(i)+" > mark"); code != http.StatusOK {
			t.Fatalf("command: %d %q", code, out)
		}
		ss = append(ss, s)
	}
	for i, g := range n {
		g.restart(t, syscall.SIGTERM)
		for j, s := range ss {
			via := n[(i+j+1)%2]
			if code, out := runCommand(t, via.gatewayProc, s.SessionID, "cat mark"); code != http.StatusOK || strings.TrimSpace(out) != "node"+strconv.Itoa(j) {
				t.Errorf("after restarting node %d: session %d through %s: %d %q", i, j, via.URL, code, out)
			}
			if code, st := getStatus(t, via.gatewayProc, s.SessionID); code != http.StatusOK || st.Status != "running" {
				t.Errorf("after restarting node %d: session %d: %d %+v", i, j, code, st)
			}
		}
	}
	for _, s := range ss {
		if code := n[0].api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete: %d", code)
		}
	}
}
