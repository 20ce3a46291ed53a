package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// s3Has reports whether the test bucket holds a key under prefix that
// ends with suffix.
func (f *fakeS3) s3Has(t *testing.T, prefix, suffix string) bool {
	t.Helper()
	return strings.Contains(f.list(t, prefix), suffix+"</Key>")
}

// TestClusterWorkspaceRestoredOnAnotherNode: with one object store shared
// by three nodes, a workspace is listed alike by every node, held by one
// live session in the whole cluster (workspace_busy on the others, and
// not deletable meanwhile), and once its node is killed and its session
// marked lost, the workspace is mounted by a session through another node
// and a snapshot taken on the lost node starts a session on a third.
func TestClusterWorkspaceRestoredOnAnotherNode(t *testing.T) {
	s3 := startFakeS3(t)
	_, n := startCluster(t, append(s3.args(), "--cluster-lease-ttl", "2s", "--workspace-sync-interval", "300ms")...)
	a, b, c := n[0], n[1], n[2]
	const tok = "test-token"
	for _, g := range n {
		logOnFailure(t, g.gatewayProc)
	}
	if code := a.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "proj"}, nil); code != http.StatusCreated {
		t.Fatalf("create workspace: %d", code)
	}
	for _, g := range []*clusterNode{b, c} {
		waitFor(t, 60*time.Second, "the workspace listed by "+g.URL, func() bool {
			_, ok := listWorkspaces(t, g.gatewayProc, tok)["proj"]
			return ok
		})
	}
	if code := b.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "proj"}, nil); code != http.StatusConflict {
		t.Errorf("the same workspace made again through another node: %d, want 409", code)
	}

	id, code, _ := createWith(t, a.gatewayProc, tok, map[string]any{"workspace": "proj"})
	if code != http.StatusCreated {
		t.Fatalf("create with the workspace through A: %d", code)
	}
	if _, err := os.Stat(filepath.Join(a.DataDir, "sessions", id)); err != nil {
		t.Fatalf("the session is not held by A: %v", err)
	}
	for _, g := range []*clusterNode{b, c} {
		if _, code, ec := createWith(t, g.gatewayProc, tok, map[string]any{"workspace": "proj"}); code != http.StatusConflict || ec != "workspace_busy" {
			t.Errorf("a second holder through %s: %d %s, want 409 workspace_busy", g.URL, code, ec)
		}
	}
	if code := c.api(t, http.MethodDelete, "/v1/workspaces/proj", nil, nil); code != http.StatusConflict {
		t.Errorf("delete of a held workspace through C: %d, want 409", code)
	}
	if w := listWorkspaces(t, c.gatewayProc, tok)["proj"]; w.InUseBy != id {
		t.Errorf("C lists the workspace in use by %q, want %s", w.InUseBy, id)
	}

	wsRun(t, a.gatewayProc, tok, id, "echo hello-from-a > note.txt")
	var snap struct {
		SnapshotID string `json:"snapshotId"`
	}
	if code := c.api(t, http.MethodPost, "/v1/sessions/"+id+"/snapshots", nil, &snap); code != http.StatusCreated || snap.SnapshotID == "" {
		t.Fatalf("snapshot through C: %d %+v", code, snap)
	}
	// The periodic sync and the snapshot reach the object store: C reads
	// the workspace's doc from there, with the file in it.
	waitFor(t, 60*time.Second, "the workspace's sync in the object store", func() bool {
		return listWorkspaces(t, c.gatewayProc, tok)["proj"].Files == 1
	})
	waitFor(t, 60*time.Second, "the snapshot in the object store", func() bool {
		return s3.s3Has(t, "ws/tenants/", snap.SnapshotID+".json")
	})

	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	waitFor(t, 60*time.Second, "A's session marked lost", func() bool {
		_, st := getStatus(t, b.gatewayProc, id)
		return st.Status == "failed" && st.StatusReason == "node lost"
	})

	id2, code, ec := createWith(t, b.gatewayProc, tok, map[string]any{"workspace": "proj"})
	if code != http.StatusCreated {
		t.Fatalf("create with the workspace through B after A was lost: %d %s", code, ec)
	}
	if out := wsRun(t, b.gatewayProc, tok, id2, "cat note.txt"); out != "hello-from-a\n" {
		t.Errorf("the workspace restored through B: %q", out)
	}
	id3, code, ec := createWith(t, c.gatewayProc, tok, map[string]any{"fromSnapshot": snap.SnapshotID})
	if code != http.StatusCreated {
		t.Fatalf("create from the snapshot through C: %d %s", code, ec)
	}
	if out := wsRun(t, c.gatewayProc, tok, id3, "cat note.txt"); out != "hello-from-a\n" {
		t.Errorf("the snapshot restored through C: %q", out)
	}
	// Snapshots too are the object store's: listed and deleted through
	// any node.
	var snaps struct {
		Snapshots []struct {
			SnapshotID string `json:"snapshotId"`
			SessionID  string `json:"sessionId"`
		} `json:"snapshots"`
	}
	if code := b.api(t, http.MethodGet, "/v1/snapshots?session="+id, nil, &snaps); code != http.StatusOK ||
		len(snaps.Snapshots) != 1 || snaps.Snapshots[0].SnapshotID != snap.SnapshotID {
		t.Errorf("B lists A's session's snapshots: %d %+v", code, snaps)
	}
	if code := b.api(t, http.MethodDelete, "/v1/snapshots/"+snap.SnapshotID, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete of the snapshot through B: %d", code)
	}
	if _, code, ec := createWith(t, c.gatewayProc, tok, map[string]any{"fromSnapshot": snap.SnapshotID}); code != http.StatusNotFound || ec != "snapshot_not_found" {
		t.Errorf("create from the snapshot deleted through B, through C: %d %s", code, ec)
	}
	if _, code, ec := createWith(t, c.gatewayProc, tok, map[string]any{"workspace": "proj"}); code != http.StatusConflict || ec != "workspace_busy" {
		t.Errorf("a second holder after the restore: %d %s, want 409 workspace_busy", code, ec)
	}

	// Ended through another node than its own, the session lets the
	// workspace go once its last sync is stored; then any node deletes
	// it, and no node lists it any more.
	wsRun(t, b.gatewayProc, tok, id2, "echo second > two.txt")
	deleteSession(t, c.gatewayProc, tok, id2, "")
	waitFor(t, 60*time.Second, "the workspace let go and deleted through C", func() bool {
		return c.api(t, http.MethodDelete, "/v1/workspaces/proj", nil, nil) == http.StatusNoContent
	})
	for _, g := range []*clusterNode{b, c} {
		if _, ok := listWorkspaces(t, g.gatewayProc, tok)["proj"]; ok {
			t.Errorf("%s still lists the deleted workspace", g.URL)
		}
	}
	deleteSession(t, c.gatewayProc, tok, id3, "")
	deleteSession(t, b.gatewayProc, tok, id, "")
}
