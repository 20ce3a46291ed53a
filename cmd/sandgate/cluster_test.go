package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// The cluster tests run three real etcd members (Debian's etcd-server
// package) and three gateway binaries, all on loopback ports.

// requireEtcd returns the etcd binary; it skips where there is none and
// fails under CI=true, where .ci/run installs it.
func requireEtcd(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("etcd is not installed (apt-get install etcd-server)")
	}
	t.Skip("etcd is not installed (apt-get install etcd-server)")
	return ""
}

// etcdMember is one etcd process of a test cluster.
type etcdMember struct {
	name, dir        string
	client, peer     string
	cluster, binPath string
	cmd              *exec.Cmd
	done             chan struct{}
	log              *gwtest.Buffer
}

func (m *etcdMember) start(t *testing.T) {
	t.Helper()
	m.log = &gwtest.Buffer{}
	m.cmd = exec.Command(m.binPath, "--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", m.cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "sandgate-test",
		"--logger", "zap", "--log-level", "error")
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	m.done = make(chan struct{})
	go func(done chan struct{}, c *exec.Cmd) {
		defer close(done)
		_ = c.Wait()
	}(m.done, m.cmd)
}

func (m *etcdMember) kill() {
	select {
	case <-m.done:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
}

type etcdCluster struct {
	members []*etcdMember
}

// endpoints are the members' client URLs, comma-separated.
func (c *etcdCluster) endpoints() string {
	var urls []string
	for _, m := range c.members {
		urls = append(urls, m.client)
	}
	return strings.Join(urls, ",")
}

// startEtcd runs a three-member etcd cluster and waits until it is healthy.
// The ports are picked free and then handed to etcd, so another process
// may take one in between (the packages' tests run in parallel): a
// cluster that does not come up is started again on other ports.
func startEtcd(t *testing.T) *etcdCluster {
	t.Helper()
	bin := requireEtcd(t)
	var why string
	for range 3 {
		c, ok, reason := tryStartEtcd(t, bin)
		if ok {
			return c
		}
		why = reason
		for _, m := range c.members {
			m.kill()
		}
		t.Logf("etcd did not come up, trying other ports: %s", why)
	}
	t.Fatalf("etcd did not come up in 3 tries: %s", why)
	return nil
}

func tryStartEtcd(t *testing.T, bin string) (*etcdCluster, bool, string) {
	t.Helper()
	c := &etcdCluster{}
	var peers []string
	for i := range 3 {
		m := &etcdMember{name: fmt.Sprintf("m%d", i), dir: t.TempDir(), binPath: bin,
			client: fmt.Sprintf("http://127.0.0.1:%d", gwtest.FreePort(t)), peer: fmt.Sprintf("http://127.0.0.1:%d", gwtest.FreePort(t))}
		c.members = append(c.members, m)
		peers = append(peers, m.name+"="+m.peer)
	}
	for _, m := range c.members {
		m.cluster = strings.Join(peers, ",")
		m.start(t)
		t.Cleanup(m.kill)
	}
	// The limit only bounds a broken start (2 busy cores: be generous).
	deadline := time.Now().Add(60 * time.Second)
	for _, m := range c.members {
		for !etcdHealthy(m) {
			select {
			case <-m.done:
				return c, false, fmt.Sprintf("member %s exited: %s", m.name, m.log.String())
			default:
			}
			if time.Now().After(deadline) {
				return c, false, fmt.Sprintf("member %s not healthy after 60s: %s", m.name, m.log.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return c, true, ""
}

func etcdHealthy(m *etcdMember) bool {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(m.client + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitFor polls cond until it holds, failing the test after limit. The
// limit only bounds a broken run; it asserts no speed.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterNode is a gateway of the cluster, with what restarting it needs.
type clusterNode struct {
	*gatewayProc
	port int
	args []string
}

// startNode runs a gateway as a node of etcd on a fixed port.
func startNode(t *testing.T, etcd *etcdCluster, tokenFile string, extra ...string) *clusterNode {
	t.Helper()
	n := &clusterNode{port: gwtest.FreePort(t)}
	n.args = append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(n.port),
		"--cluster-etcd", etcd.endpoints(), "--cluster-token-file", tokenFile,
		"--cluster-advertise", "http://127.0.0.1:" + strconv.Itoa(n.port)}, extra...)
	n.gatewayProc = startGateway(t, n.args...)
	return n
}

// restart stops the node with sig and starts it again on its data dir and port.
func (n *clusterNode) restart(t *testing.T, sig syscall.Signal, extra ...string) {
	t.Helper()
	_ = n.cmd.Process.Signal(sig)
	<-n.done
	if sig == syscall.SIGTERM && n.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("node exited %d on SIGTERM: %s", n.cmd.ProcessState.ExitCode(), n.stderr.String())
	}
	g := &gatewayProc{DataDir: n.DataDir, Token: n.Token}
	g.start(t, append([]string{"serve", "--data-dir", n.DataDir, "--sandbox", "workdir", "--api-key", n.Token}, append(n.args, extra...)...))
	n.gatewayProc = g
}

// startCluster runs etcd and three nodes with the given extra flags.
func startCluster(t *testing.T, extra ...string) (*etcdCluster, []*clusterNode) {
	extra = append([]string{"--api-key", "test-token", "--api-key", "other:other-token"}, extra...)
	t.Helper()
	etcd := startEtcd(t)
	tok := filepath.Join(t.TempDir(), "cluster-token")
	if err := os.WriteFile(tok, []byte("cluster-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes []*clusterNode
	for range 3 {
		nodes = append(nodes, startNode(t, etcd, tok, extra...))
	}
	return etcd, nodes
}

type clusterSession struct {
	SessionID    string `json:"sessionId"`
	Status       string `json:"status"`
	StatusReason string `json:"statusReason"`
}

func getStatus(t *testing.T, g *gatewayProc, id string) (int, clusterSession) {
	t.Helper()
	var s clusterSession
	code := g.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &s)
	return code, s
}

// sshRun runs cmd in session s over OpenSSH through node g.
func sshRun(t *testing.T, g *gatewayProc, s sessionJSON, cmd string) (string, string, int) {
	t.Helper()
	ssh := gwtest.RequireTool(t, "ssh")
	return runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s), s.SessionID, cmd)...)
}

func runCommand(t *testing.T, g *gatewayProc, id, cmd string) (int, string) {
	t.Helper()
	var out struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exitCode"`
		Error    struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": cmd}, &out)
	if code != http.StatusOK {
		return code, out.Error.Code
	}
	return code, out.Stdout
}

func listIDs(t *testing.T, g *gatewayProc) []string {
	t.Helper()
	var out struct {
		Sessions []clusterSession `json:"sessions"`
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions?limit=100", nil, &out); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	var ids []string
	for _, s := range out.Sessions {
		ids = append(ids, s.SessionID)
	}
	return ids
}

func TestClusterAnyNodeServesAnySession(t *testing.T) {
	_, n := startCluster(t)
	a, b, c := n[0], n[1], n[2]
	s := a.createSession(t)
	if _, err := os.Stat(filepath.Join(a.DataDir, "sessions", s.SessionID)); err != nil { // the workdir sandbox
		t.Fatalf("a node with room did not keep the session it was asked for")
	}
	// Over OpenSSH through B (relayed CONNECT to A).
	out, errOut, code := sshRun(t, b.gatewayProc, s, "echo hello > note && cat note && hostname >/dev/null")
	if code != 0 || strings.TrimSpace(out) != "hello" {
		t.Fatalf("ssh through B: %d %q %s", code, out, errOut)
	}
	// Over REST through C (relayed to A).
	if code, out := runCommand(t, c.gatewayProc, s.SessionID, "cat note"); code != http.StatusOK || strings.TrimSpace(out) != "hello" {
		t.Fatalf("command through C: %d %q", code, out)
	}
	// The same answers for another tenant's view and for unknown ids, anywhere.
	for _, g := range []*clusterNode{a, b, c} {
		if code, _ := getStatus(t, g.gatewayProc, "sess_doesnotexist"); code != http.StatusNotFound {
			t.Errorf("unknown id through %s: %d, want 404", g.URL, code)
		}
		if code, st := getStatus(t, g.gatewayProc, s.SessionID); code != http.StatusOK || st.Status != "running" {
			t.Errorf("get through %s: %d %+v", g.URL, code, st)
		}
	}
	// List consistency: one session per node, every node lists all three.
	s2, s3 := b.createSession(t), c.createSession(t)
	want := map[string]bool{s.SessionID: true, s2.SessionID: true, s3.SessionID: true}
	for _, g := range []*clusterNode{a, b, c} {
		ids := listIDs(t, g.gatewayProc)
		if len(ids) != 3 {
			t.Errorf("list through %s: %v, want the 3 sessions", g.URL, ids)
		}
		for _, id := range ids {
			if !want[id] {
				t.Errorf("list through %s: unexpected %s", g.URL, id)
			}
		}
	}
	// A relay with a wrong cluster token is refused.
	req, _ := http.NewRequest(http.MethodGet, b.URL+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	req.Header.Set("X-Sandgate-Cluster-Token", "guess-guess-guess-guess")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong cluster token: %d, want 401", resp.StatusCode)
	}
	// The right cluster token without the client's own token grants nothing.
	req, _ = http.NewRequest(http.MethodGet, b.URL+"/v1/sessions/"+s.SessionID, nil)
	req.Header.Set("X-Sandgate-Cluster-Token", "cluster-test-token-0123456789")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("cluster token alone: %d, want 401", resp.StatusCode)
	}
	// Another tenant's token, relayed: 404, as for a missing session.
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := gwtest.DoJSON(t, b.URL, "other-token", http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &e); code != http.StatusNotFound {
		t.Errorf("another tenant through B: %d %+v, want 404", code, e)
	}
	// Delete through another node than the owner.
	if code := c.api(t, http.MethodDelete, "/v1/sessions/"+s2.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete through C: %d", code)
	}
	if code, _ := getStatus(t, a.gatewayProc, s2.SessionID); code != http.StatusGone {
		t.Errorf("deleted session through A: %d, want 410", code)
	}
	for _, id := range []string{s.SessionID, s3.SessionID} {
		if code := b.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete %s through B: %d", id, code)
		}
	}
}

func TestClusterNodeLossFailsItsSessions(t *testing.T) {
	_, n := startCluster(t, "--cluster-lease-ttl", "2s")
	a, b, c := n[0], n[1], n[2]
	lost := a.createSession(t)
	kept := b.createSession(t)
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	waitFor(t, 60*time.Second, "the lost node's session to fail", func() bool {
		_, st := getStatus(t, c.gatewayProc, lost.SessionID)
		return st.Status == "failed"
	})
	for _, g := range []*clusterNode{b, c} {
		code, st := getStatus(t, g.gatewayProc, lost.SessionID)
		if code != http.StatusOK || st.Status != "failed" || st.StatusReason != "node lost" {
			t.Errorf("lost session through %s: %d %+v", g.URL, code, st)
		}
		if code, st := getStatus(t, g.gatewayProc, kept.SessionID); code != http.StatusOK || st.Status != "running" {
			t.Errorf("other node's session through %s: %d %+v", g.URL, code, st)
		}
	}
	if code, ec := runCommand(t, c.gatewayProc, lost.SessionID, "true"); code != http.StatusConflict || ec != "session_not_running" {
		t.Errorf("command on a lost session: %d %s", code, ec)
	}
	if code, out := runCommand(t, c.gatewayProc, kept.SessionID, "echo ok"); code != http.StatusOK || strings.TrimSpace(out) != "ok" {
		t.Errorf("command on the surviving node's session: %d %q", code, out)
	}
	if code := b.api(t, http.MethodDelete, "/v1/sessions/"+lost.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete of the lost session: %d", code)
	}
	// Deleted like any session: gone (with its tombstone) on every node,
	// and in the audit trail.
	for _, g := range []*clusterNode{b, c} {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if code := g.api(t, http.MethodGet, "/v1/sessions/"+lost.SessionID, nil, &e); code != http.StatusGone || e.Error.Code != "session_gone" {
			t.Errorf("the deleted lost session through %s: %d %q, want 410 session_gone", g.URL, code, e.Error.Code)
		}
	}
	var page struct {
		Events []struct{ Kind, Op, Session, By string } `json:"events"`
	}
	if code := c.api(t, http.MethodGet, "/v1/audit?session="+lost.SessionID, nil, &page); code != http.StatusOK {
		t.Fatalf("audit: %d", code)
	}
	deleted := false
	for _, e := range page.Events {
		deleted = deleted || e.Kind == "session" && e.Op == "deleted"
	}
	if !deleted {
		t.Errorf("no audit event of the lost session's delete: %+v", page.Events)
	}
	if ids := listIDs(t, c.gatewayProc); len(ids) != 1 || ids[0] != kept.SessionID {
		t.Errorf("list after: %v", ids)
	}
	if code := c.api(t, http.MethodDelete, "/v1/sessions/"+kept.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
}

func TestClusterSurvivesOneEtcdMemberLoss(t *testing.T) {
	etcd, n := startCluster(t)
	etcd.members[0].kill()
	// Until the two members left elect a leader (when the killed one led),
	// a write answers 503 cluster_unavailable with Retry-After, as etcd
	// refuses it: a client retries. After that the cluster works on.
	var s sessionJSON
	for deadline := time.Now().Add(30 * time.Second); ; {
		code := n[1].api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s)
		if code == http.StatusCreated {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("create after losing one member: %d", code)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, e, code := sshRun(t, n[2].gatewayProc, s, "echo up"); code != 0 || strings.TrimSpace(out) != "up" {
		t.Fatalf("ssh after losing one member: %d %q %s", code, out, e)
	}
	if ids := listIDs(t, n[0].gatewayProc); len(ids) != 1 {
		t.Errorf("list after losing one member: %v", ids)
	}
	if code := n[0].api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
}

func TestClusterQuorumLoss(t *testing.T) {
	etcd, n := startCluster(t)
	a, b := n[0], n[1]
	s := a.createSession(t)
	ended := a.createSession(t)
	// B learns the owner before etcd goes (a client that used it before).
	if out, _, code := sshRun(t, b.gatewayProc, s, "echo before"); code != 0 || strings.TrimSpace(out) != "before" {
		t.Fatalf("ssh before: %d %q", code, out)
	}
	etcd.members[0].kill()
	etcd.members[1].kill()
	// Running sessions keep working, on their owner and through a relay.
	for _, g := range []*clusterNode{a, b} {
		if out, e, code := sshRun(t, g.gatewayProc, s, "echo still"); code != 0 || strings.TrimSpace(out) != "still" {
			t.Errorf("ssh through %s without quorum: %d %q %s", g.URL, code, out, e)
		}
	}
	if code, out := runCommand(t, a.gatewayProc, s.SessionID, "echo rest"); code != http.StatusOK || strings.TrimSpace(out) != "rest" {
		t.Errorf("command on the owner without quorum: %d %q", code, out)
	}
	// A session its owner ends meanwhile is gone from etcd once quorum returns.
	if code := a.api(t, http.MethodDelete, "/v1/sessions/"+ended.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete on the owner without quorum: %d", code)
	}
	// New creates are refused, clearly.
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	waitFor(t, 60*time.Second, "creates to be refused", func() bool {
		code := b.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &e)
		if code == http.StatusCreated {
			t.Fatal("a create succeeded without quorum")
		}
		return code == http.StatusServiceUnavailable && e.Error.Code == "cluster_unavailable"
	})
	// So are changes: a PATCH needs an etcd write, like a create.
	for _, g := range []*clusterNode{a, b} {
		code := g.api(t, http.MethodPatch, "/v1/sessions/"+s.SessionID, map[string]any{"ttl": 900}, &e)
		if code != http.StatusServiceUnavailable || e.Error.Code != "cluster_unavailable" {
			t.Errorf("PATCH through %s without quorum: %d %q, want 503 cluster_unavailable", g.URL, code, e.Error.Code)
		}
	}
	// Quorum returns: creates work again.
	for _, m := range etcd.members[:2] {
		m.start(t)
	}
	waitFor(t, 60*time.Second, "creates to work again", func() bool {
		var s clusterSession
		code := b.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s)
		if code == http.StatusCreated {
			_ = b.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil)
		}
		return code == http.StatusCreated
	})
	waitFor(t, 60*time.Second, "the session ended without quorum to leave etcd", func() bool {
		ids := listIDs(t, b.gatewayProc)
		return len(ids) == 1 && ids[0] == s.SessionID
	})
	if code := b.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete after recovery: %d", code)
	}
}

func TestClusterTenantQuotaExact(t *testing.T) {
	const quota, tries = 4, 18
	_, n := startCluster(t, "--max-sessions-per-tenant", strconv.Itoa(quota))
	var mu sync.Mutex
	codes := map[int]int{}
	var ids []string
	var wg sync.WaitGroup
	for i := range tries {
		g := n[i%3]
		wg.Go(func() {
			var s clusterSession
			code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s)
			mu.Lock()
			defer mu.Unlock()
			codes[code]++
			if code == http.StatusCreated {
				ids = append(ids, s.SessionID)
			}
		})
	}
	wg.Wait()
	if codes[http.StatusCreated] != quota || codes[http.StatusTooManyRequests] != tries-quota {
		t.Errorf("concurrent creates on three nodes: %v, want %d created and %d refused", codes, quota, tries-quota)
	}
	if got := listIDs(t, n[2].gatewayProc); len(got) != quota {
		t.Errorf("list: %d sessions, want %d", len(got), quota)
	}
	for _, id := range ids {
		if code := n[0].api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete: %d", code)
		}
	}
}

func TestClusterRollingRestart(t *testing.T) {
	_, n := startCluster(t, "--keep-sandboxes-on-exit=true")
	var ss []sessionJSON
	for i, g := range n {
		s := g.createSession(t)
		if out, e, code := sshRun(t, g.gatewayProc, s, fmt.Sprintf("echo node%d > mark", i)); code != 0 {
			t.Fatalf("ssh: %d %q %s", code, out, e)
		}
		ss = append(ss, s)
	}
	for i, g := range n {
		g.restart(t, syscall.SIGTERM)
		for j, s := range ss {
			via := n[(i+j+1)%3]
			out, e, code := sshRun(t, via.gatewayProc, s, "cat mark")
			if code != 0 || strings.TrimSpace(out) != fmt.Sprintf("node%d", j) {
				t.Errorf("after restarting node %d: session %d through %s: %d %q %s", i, j, via.URL, code, out, e)
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

// rateLimitHeader sends GET /v1/sessions to g and returns the status and
// the X-RateLimit-Limit it was answered with.
func rateLimitHeader(t *testing.T, g *gatewayProc) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-RateLimit-Limit")
}

func TestClusterRateLimitShares(t *testing.T) {
	_, n := startCluster(t, "--rate-limit", "90", "--cluster-lease-ttl", "2s")
	// Each node enforces a third of the limit once it sees three live nodes.
	for _, g := range n {
		waitFor(t, 30*time.Second, "a node to use its share", func() bool {
			_, lim := rateLimitHeader(t, g.gatewayProc)
			return lim == "30"
		})
	}
	admitted := 0
	for range 60 {
		code, _ := rateLimitHeader(t, n[0].gatewayProc)
		if code == http.StatusTooManyRequests {
			break
		}
		admitted++
	}
	if admitted >= 30 {
		t.Errorf("node A admitted %d more requests; its share is 30 a minute", admitted)
	}
	if code, _ := rateLimitHeader(t, n[1].gatewayProc); code != http.StatusOK {
		t.Errorf("node B, with its own share left: %d", code)
	}
}

func TestClusterPlacesCreatesOnNodesWithRoom(t *testing.T) {
	_, n := startCluster(t, "--max-sessions", "1")
	holder := func(id string) int {
		for i, g := range n {
			if _, err := os.Stat(filepath.Join(g.DataDir, "sessions", id)); err == nil { // the workdir sandbox
				return i
			}
		}
		return -1
	}
	first := n[0].createSession(t)
	second := n[0].createSession(t) // A is full: placed on B or C, answered through A
	if h := holder(first.SessionID); h != 0 {
		t.Errorf("first session held by node %d, want A (it had room)", h)
	}
	h := holder(second.SessionID)
	if h != 1 && h != 2 {
		t.Fatalf("second session held by node %d, want B or C", h)
	}
	if out, e, code := sshRun(t, n[0].gatewayProc, second, "echo placed"); code != 0 || strings.TrimSpace(out) != "placed" {
		t.Errorf("ssh to the placed session through A: %d %q %s", code, out, e)
	}
	third := n[0].createSession(t)
	if h3 := holder(third.SessionID); h3 == 0 || h3 == h || h3 < 0 {
		t.Errorf("third session held by node %d, want the one node still with room", h3)
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := n[0].api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &e); code != http.StatusServiceUnavailable || e.Error.Code != "capacity" {
		t.Errorf("create with every node full: %d %+v, want 503 capacity", code, e)
	}
	for _, s := range []sessionJSON{first, second, third} {
		if code := n[2].api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete: %d", code)
		}
	}
}
