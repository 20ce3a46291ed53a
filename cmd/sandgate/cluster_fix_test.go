package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// openFDs counts the open file descriptors of process pid.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// refusedConnect sends CONNECT for session id to g and returns the status.
func refusedConnect(t *testing.T, g *gatewayProc, id string) int {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT /v1/sessions/%s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n",
		id, strings.TrimPrefix(g.URL, "http://"), g.Token)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// auditPage is a page of GET /v1/audit, its events kept as they came.
type auditPageJSON struct {
	Events     []json.RawMessage `json:"events"`
	NextCursor string            `json:"nextCursor"`
}

// TestClusterLinksAuditAndRelayedConnects: a file link and a port link
// made on the session's node open through the others; GET /v1/audit on
// any node shows every node's events, and its cursor walks them all; refused CONNECTs relayed to the owner leave no fd behind on
// either node.
func TestClusterLinksAuditAndRelayedConnects(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	_, n := startCluster(t)
	a, b, c := n[0], n[1], n[2]
	s := a.createSession(t)

	// A file link made on A, opened through B and C.
	putFile(t, a.gatewayProc, s.SessionID, "note.txt", "linked\n")
	link := makeLink(t, a.gatewayProc, s.SessionID, "note.txt", 0)
	for _, g := range []*clusterNode{b, c} {
		if code, body := curlGet(t, strings.Replace(link, a.URL, g.URL, 1)); code != http.StatusOK || string(body) != "linked\n" {
			t.Errorf("file link through %s: %d %q", g.URL, code, body)
		}
	}
	// A forged link to A's session is refused by A, through B.
	forged := retoken(t, link, func(p map[string]any, sig []byte) { p["p"] = "other.txt" })
	if code, body := curlGet(t, strings.Replace(forged, a.URL, b.URL, 1)); code != http.StatusForbidden || !strings.Contains(string(body), `"link_invalid"`) {
		t.Errorf("forged link through B: %d %s", code, body)
	}
	// A port link made on A, opened through B.
	port := gwtest.FreePort(t)
	putFile(t, a.gatewayProc, s.SessionID, "site/marker.txt", "port-linked\n")
	procClient{g: a.gatewayProc, base: "/v1/sessions/" + s.SessionID + "/processes"}.start(t,
		map[string]any{"command": fmt.Sprintf("cd site && exec python3 -m http.server %d --bind 127.0.0.1", port), "name": "http"})
	var plink struct{ URL string }
	if code := a.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", map[string]any{"port": port}, &plink); code != http.StatusOK {
		t.Fatalf("port link: %d", code)
	}
	if body := previewWait(t, onNode(t, plink.URL, b.URL)+"marker.txt", ""); string(body) != "port-linked\n" {
		t.Errorf("port link through B: %q", body)
	}

	// The audit trail of the whole cluster, from any node.
	s2, s3 := b.createSession(t), c.createSession(t)
	var all auditPageJSON
	if code := c.api(t, http.MethodGet, "/v1/audit?limit=1000", nil, &all); code != http.StatusOK {
		t.Fatalf("audit through C: %d", code)
	}
	created := map[string]bool{}
	for _, raw := range all.Events {
		var e struct{ Kind, Op, Session string }
		_ = json.Unmarshal(raw, &e)
		if e.Kind == "session" && e.Op == "created" {
			created[e.Session] = true
		}
	}
	for _, id := range []string{s.SessionID, s2.SessionID, s3.SessionID} {
		if !created[id] {
			t.Errorf("audit through C: no created event of %s (made on another node?)", id)
		}
	}
	// Walked two at a time: none twice, none of the above missed.
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("the cursor walk does not end")
		}
		var p auditPageJSON
		q := "/v1/audit?limit=2"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		if code := a.api(t, http.MethodGet, q, nil, &p); code != http.StatusOK {
			t.Fatalf("audit page through A: %d", code)
		}
		// (Each node's log is in its own order, seq; the merge of the
		// nodes' is by time: TestMergeAudit checks it.)
		for _, raw := range p.Events {
			if seen[string(raw)] {
				t.Errorf("audit walk: %s twice", raw)
			}
			seen[string(raw)] = true
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	for _, raw := range all.Events {
		if !seen[string(raw)] {
			t.Errorf("audit walk missed %s", raw)
		}
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := a.api(t, http.MethodGet, "/v1/audit?cursor=bogus", nil, &e); code != http.StatusBadRequest || e.Error.Code != "invalid_cursor" {
		t.Errorf("bad cursor: %d %q", code, e.Error.Code)
	}

	// Relayed CONNECTs the owner refuses (the session is gone) leak nothing.
	if code := a.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	for range 3 { // B knows the owner (the links); warm its connection pool
		if code := refusedConnect(t, b.gatewayProc, s.SessionID); code != http.StatusGone {
			t.Fatalf("CONNECT to a deleted session through B: %d, want 410", code)
		}
	}
	fdA, fdB := openFDs(t, a.cmd.Process.Pid), openFDs(t, b.cmd.Process.Pid)
	const tries, slack = 60, 8
	for range tries {
		if code := refusedConnect(t, b.gatewayProc, s.SessionID); code != http.StatusGone {
			t.Fatalf("CONNECT through B: %d, want 410", code)
		}
	}
	t.Logf("fds after %d refused relayed CONNECTs: A %d -> %d, B %d -> %d", tries,
		fdA, openFDs(t, a.cmd.Process.Pid), fdB, openFDs(t, b.cmd.Process.Pid))
	waitFor(t, 30*time.Second, "the nodes' fds to come back", func() bool {
		return openFDs(t, a.cmd.Process.Pid) <= fdA+slack && openFDs(t, b.cmd.Process.Pid) <= fdB+slack
	})
	t.Logf("fds settled: A %d, B %d", openFDs(t, a.cmd.Process.Pid), openFDs(t, b.cmd.Process.Pid))
	for _, id := range []string{s2.SessionID, s3.SessionID} {
		if code := a.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete %s: %d", id, code)
		}
	}
}

// TestClusterWarnsWithoutPublicURL: a cluster node without --public-url
// hands out links naming its own address, so it says so at start; one
// with it does not.
func TestClusterWarnsWithoutPublicURL(t *testing.T) {
	etcd := startEtcd(t)
	tok := filepath.Join(t.TempDir(), "cluster-token")
	if err := os.WriteFile(tok, []byte("cluster-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bare := startNode(t, etcd, tok, "--api-key", "test-token")
	public := startNode(t, etcd, tok, "--api-key", "test-token", "--public-url", "https://sandgate.example.com")
	const warning = "cluster node without --public-url"
	if !strings.Contains(bare.stderr.String(), warning) {
		t.Errorf("no warning without --public-url:\n%s", bare.stderr.String())
	}
	if strings.Contains(public.stderr.String(), warning) {
		t.Errorf("a warning with --public-url:\n%s", public.stderr.String())
	}
}
