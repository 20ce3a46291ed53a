package main

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// createTiming creates a session on g and returns its Server-Timing header.
func createTiming(t *testing.T, g *gatewayProc) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	return resp.Header.Get("Server-Timing")
}

// TestServerTimingGated: the steps of a create tell whether it claimed a
// warm sandbox, and so whether other tenants emptied the pool just before;
// by default POST /v1/sessions shows only the total, and the steps only
// with --server-timing.
func TestServerTimingGated(t *testing.T) {
	totalOnly := regexp.MustCompile(`^total;dur=[0-9.]+$`)
	if h := createTiming(t, startGateway(t)); !totalOnly.MatchString(h) {
		t.Errorf("Server-Timing by default: %q, want the total only", h)
	}
	h := createTiming(t, startGateway(t, "--server-timing"))
	for _, step := range []string{"check;dur=", "session;dur=", "store;dur=", "total;dur="} {
		if !strings.Contains(h, step) {
			t.Errorf("Server-Timing with --server-timing: %q, no %s", h, step)
		}
	}
}
