package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// TestClusterE2BAccessTokenOnAnyNode: E2B's SDKs call the sandbox URL with
// the sandbox's own access token only (no API key). The token is keyed by
// the node that holds the sandbox, so any other node relays such a call to
// the owner, which checks it: the right token works through every node,
// a wrong one is refused through every node.
func TestClusterE2BAccessTokenOnAnyNode(t *testing.T) {
	_, n := startCluster(t)
	a := n[0]
	body, _ := json.Marshal(map[string]any{"templateID": "base", "secure": true})
	req, _ := http.NewRequest(http.MethodPost, a.URL+"/compat/e2b/sandboxes", bytes.NewReader(body))
	req.Header.Set("X-API-Key", "test-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(raw, &sb) != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create through A: %d %s", resp.StatusCode, raw)
	}
	call := func(g *clusterNode, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, g.URL+"/compat/e2b/sandbox/health", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		req.Header.Set("X-Access-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, g := range n {
		if code, out := call(g, sb.EnvdAccessToken); code/100 != 2 {
			t.Errorf("the access token through %s: %d %s, want 2xx", g.URL, code, out)
		}
		if code, out := call(g, "e2bt_"+string(bytes.Repeat([]byte("A"), 43))); code != http.StatusUnauthorized {
			t.Errorf("a made-up token through %s: %d %s, want 401", g.URL, code, out)
		}
	}
}
