package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clusterDo sends a JSON request with extra headers and decodes the answer.
func clusterDo(t *testing.T, g *gatewayProc, method, path string, hdr map[string]string, body, out any) int {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, g.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if _, ok := hdr["X-API-Key"]; !ok {
		req.Header.Set("Authorization", "Bearer "+g.Token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// sandboxesOn counts the workdir sandboxes node g holds.
func sandboxesOn(t *testing.T, g *clusterNode) int {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(g.DataDir, "sessions"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	count := 0
	for _, e := range es {
		if !strings.HasPrefix(e.Name(), ".") { // driver caches, not sessions
			count++
		}
	}
	return count
}

// The compatibility APIs reach a session through any node: a request a
// node that does not hold the session receives is relayed to its owner.
func TestClusterCompatRelayed(t *testing.T) {
	_, n := startCluster(t)
	a, b := n[0], n[1]

	t.Run("sbs", func(t *testing.T) {
		var c struct {
			SessionID string `json:"session_id"`
		}
		if code := clusterDo(t, a.gatewayProc, http.MethodPost, "/compat/sbs/sessions", nil, map[string]any{}, &c); code != http.StatusOK {
			t.Fatalf("create: %d", code)
		}
		var step struct {
			Output   string `json:"output"`
			ExitCode int    `json:"exit_code"`
		}
		code := clusterDo(t, b.gatewayProc, http.MethodPost, "/compat/sbs/sessions/"+c.SessionID+"/step", nil,
			map[string]any{"sandbox_id": c.SessionID, "type": "bash", "payload": map[string]any{"cmd": "echo via-b"}}, &step)
		if code != http.StatusOK || strings.TrimSpace(step.Output) != "via-b" || step.ExitCode != 0 {
			t.Errorf("step through a non-owner: %d %+v", code, step)
		}
		if code := clusterDo(t, b.gatewayProc, http.MethodDelete, "/compat/sbs/sessions/"+c.SessionID, nil, nil, nil); code != http.StatusNoContent {
			t.Errorf("delete through a non-owner: %d", code)
		}
	})

	t.Run("sandkasten", func(t *testing.T) {
		var c struct {
			ID string `json:"id"`
		}
		if code := clusterDo(t, a.gatewayProc, http.MethodPost, "/compat/sandkasten/v1/sessions", nil, map[string]any{}, &c); code != http.StatusCreated || c.ID == "" {
			t.Fatalf("create: %d %+v", code, c)
		}
		var ex struct {
			ExitCode int    `json:"exit_code"`
			Output   string `json:"output"`
		}
		code := clusterDo(t, b.gatewayProc, http.MethodPost, "/compat/sandkasten/v1/sessions/"+c.ID+"/exec", nil, map[string]any{"cmd": "echo kasten > k.txt; cat k.txt"}, &ex)
		if code != http.StatusOK || !strings.Contains(ex.Output, "kasten") {
			t.Errorf("exec through a non-owner: %d %+v", code, ex)
		}
		if code := clusterDo(t, n[2].gatewayProc, http.MethodDelete, "/compat/sandkasten/v1/sessions/"+c.ID, nil, nil, nil); code != http.StatusOK {
			t.Errorf("delete through a non-owner: %d", code)
		}
	})

	t.Run("agent-sandbox", func(t *testing.T) {
		key := map[string]string{"X-API-Key": a.Token}
		ident := map[string]any{"user_id": "u1", "session_id": "s1"}
		// The first call makes the sandbox on A; later calls through B and
		// C reach it there (B and C make none of their own).
		var files struct {
			Files []struct {
				Path string `json:"path"`
			} `json:"files"`
		}
		if code := clusterDo(t, a.gatewayProc, http.MethodGet, "/compat/agent-sandbox/v1/files/list?user_id=u1&session_id=s1", key, nil, &files); code != http.StatusOK {
			t.Fatalf("list on A: %d", code)
		}
		before := sandboxesOn(t, a)
		var ex struct {
			Output string `json:"output"`
		}
		body := map[string]any{"user_id": "u1", "session_id": "s1", "code": "open('note.txt','w').write('hi')\nprint('wrote')"}
		if code := clusterDo(t, b.gatewayProc, http.MethodPost, "/compat/agent-sandbox/v1/execute", key, body, &ex); code != http.StatusOK {
			t.Fatalf("execute through B: %d %+v", code, ex)
		}
		if code := clusterDo(t, n[2].gatewayProc, http.MethodGet, "/compat/agent-sandbox/v1/files/list?user_id=u1&session_id=s1", key, nil, &files); code != http.StatusOK {
			t.Fatalf("list through C: %d", code)
		}
		found := false
		for _, f := range files.Files {
			found = found || f.Path == "note.txt"
		}
		if !found {
			t.Errorf("the file written through B is not listed through C: %+v (execute said %q)", files, ex.Output)
		}
		if got := sandboxesOn(t, b) + sandboxesOn(t, n[2]); got != 0 || sandboxesOn(t, a) != before {
			t.Errorf("sandboxes: A %d (was %d), B+C %d; want the one on A only", sandboxesOn(t, a), before, got)
		}
		if code := clusterDo(t, b.gatewayProc, http.MethodPost, "/compat/agent-sandbox/v1/sandbox/stop", key, ident, nil); code != http.StatusOK {
			t.Errorf("stop through B: %d", code)
		}
	})
}

// Session names and idempotency keys are unique across the cluster.
func TestClusterNamesAndIdempotencyKeys(t *testing.T) {
	_, n := startCluster(t)
	a, b, c := n[0], n[1], n[2]
	type created struct {
		SessionID string                `json:"sessionId"`
		Error     struct{ Code string } `json:"error"`
	}

	t.Run("name", func(t *testing.T) {
		var first, second created
		if code := clusterDo(t, a.gatewayProc, http.MethodPost, "/v1/sessions", nil, map[string]any{"name": "shared"}, &first); code != http.StatusCreated {
			t.Fatalf("create on A: %d", code)
		}
		if code := clusterDo(t, b.gatewayProc, http.MethodPost, "/v1/sessions", nil, map[string]any{"name": "shared"}, &second); code != http.StatusConflict || second.Error.Code != "name_taken" {
			t.Errorf("the same name on B: %d %q, want 409 name_taken", code, second.Error.Code)
		}
		if sandboxesOn(t, b) != 0 {
			t.Errorf("B kept a sandbox for the refused create")
		}
		// The name goes where the id goes, on any node (A holds it).
		for _, g := range n {
			var got created
			if code := clusterDo(t, g.gatewayProc, http.MethodGet, "/v1/sessions/shared", nil, nil, &got); code != http.StatusOK || got.SessionID != first.SessionID {
				t.Errorf("GET by name on %s: %d %q, want %q", g.URL, code, got.SessionID, first.SessionID)
			}
		}
		// Another tenant's name space is its own.
		var other created
		if code := clusterDo(t, b.gatewayProc, http.MethodPost, "/v1/sessions", map[string]string{"Authorization": "Bearer other-token"}, map[string]any{"name": "shared"}, &other); code != http.StatusCreated {
			t.Errorf("the name for another tenant: %d", code)
		} else {
			clusterDo(t, b.gatewayProc, http.MethodDelete, "/v1/sessions/"+other.SessionID, map[string]string{"Authorization": "Bearer other-token"}, nil, nil)
		}
		// Deleted, the name is free again, on any node.
		if code := clusterDo(t, c.gatewayProc, http.MethodDelete, "/v1/sessions/"+first.SessionID, nil, nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete: %d", code)
		}
		var again created
		if code := clusterDo(t, b.gatewayProc, http.MethodPost, "/v1/sessions", nil, map[string]any{"name": "shared"}, &again); code != http.StatusCreated {
			t.Errorf("the freed name on B: %d %q", code, again.Error.Code)
		}
		clusterDo(t, b.gatewayProc, http.MethodDelete, "/v1/sessions/"+again.SessionID, nil, nil, nil)
	})

	t.Run("idempotency-key", func(t *testing.T) {
		key := map[string]string{"Idempotency-Key": "cluster-key-1"}
		var first, second created
		if code := clusterDo(t, a.gatewayProc, http.MethodPost, "/v1/sessions", key, map[string]any{}, &first); code != http.StatusCreated {
			t.Fatalf("create on A: %d", code)
		}
		if code := clusterDo(t, b.gatewayProc, http.MethodPost, "/v1/sessions", key, map[string]any{}, &second); code != http.StatusOK || second.SessionID != first.SessionID {
			t.Errorf("the same key on B: %d %q, want 200 and the session %q", code, second.SessionID, first.SessionID)
		}
		var reused created
		if code := clusterDo(t, c.gatewayProc, http.MethodPost, "/v1/sessions", key, map[string]any{"ttl": 600}, &reused); code != http.StatusUnprocessableEntity || reused.Error.Code != "idempotency_key_reused" {
			t.Errorf("the key with another body on C: %d %q", code, reused.Error.Code)
		}
		if ids := listIDs(t, c.gatewayProc); len(ids) != 1 {
			t.Errorf("sessions: %v, want one", ids)
		}
		clusterDo(t, c.gatewayProc, http.MethodDelete, "/v1/sessions/"+first.SessionID, nil, nil, nil)

		// Sent to all three at once: one session; the others are told to
		// retry (in progress), then replay it.
		key = map[string]string{"Idempotency-Key": "cluster-key-2"}
		var mu sync.Mutex
		got := map[string]bool{}
		var wg sync.WaitGroup
		for _, g := range n {
			wg.Go(func() {
				for range 100 {
					var s created
					code := clusterDo(t, g.gatewayProc, http.MethodPost, "/v1/sessions", key, map[string]any{}, &s)
					if code == http.StatusConflict && s.Error.Code == "idempotency_key_in_progress" {
						time.Sleep(200 * time.Millisecond)
						continue
					}
					if code != http.StatusCreated && code != http.StatusOK {
						t.Errorf("concurrent create with one key: %d %q", code, s.Error.Code)
					}
					mu.Lock()
					got[s.SessionID] = true
					mu.Unlock()
					return
				}
				t.Errorf("the key stayed in progress")
			})
		}
		wg.Wait()
		if len(got) != 1 {
			t.Errorf("one key sent to three nodes made %d sessions: %v", len(got), got)
		}
		if ids := listIDs(t, a.gatewayProc); len(ids) != 1 {
			t.Errorf("sessions: %v, want one", ids)
		}
		if total := sandboxesOn(t, a) + sandboxesOn(t, b) + sandboxesOn(t, c); total != 1 {
			t.Errorf("sandboxes on the nodes: %d, want 1", total)
		}
	})
}
