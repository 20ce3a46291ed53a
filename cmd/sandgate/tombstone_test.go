package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"
)

// connectStatus sends CONNECT for session id to g and returns the status
// and body of the answer.
func connectStatus(t *testing.T, g *gatewayProc, id string) (int, string) {
	t.Helper()
	u, err := url.Parse(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "CONNECT /v1/sessions/%s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", id, u.Host, g.Token)
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

type goneBody struct {
	Error struct{ Code, Message string } `json:"error"`
}

// wantGone checks that GET of session id answers 410 session_gone and
// that its message says all of want.
func wantGone(t *testing.T, g *gatewayProc, id string, want ...string) {
	t.Helper()
	var b goneBody
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &b); code != http.StatusGone || b.Error.Code != "session_gone" {
		t.Fatalf("GET of a deleted session: %d %+v, want 410 session_gone", code, b)
	}
	for _, w := range want {
		if !strings.Contains(b.Error.Message, w) {
			t.Errorf("message %q lacks %q", b.Error.Message, w)
		}
	}
}

// TestTombstone: a deleted session answers 410 session_gone (when, why, by
// whom) on GET and CONNECT, across a restart of the gateway; an unknown id
// is still 404.
func TestTombstone(t *testing.T) {
	g := startGateway(t)
	id := g.createSession(t).SessionID
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	reason := []string{"session " + id + " is gone (reason: deleted)", "deleted at ", `by tenant "default" (api_key)`}
	wantGone(t, g, id, reason...)
	if code, body := connectStatus(t, g, id); code != http.StatusGone || !strings.Contains(body, "session_gone") || !strings.Contains(body, "(reason: deleted)") {
		t.Errorf("CONNECT of a deleted session: %d %s", code, body)
	}
	if code, body := connectStatus(t, g, "sbx-aaaaaaaaaaaaaaaaaaaa"); code != http.StatusNotFound {
		t.Errorf("CONNECT of an unknown session: %d %s", code, body)
	}
	var b goneBody
	if code := g.api(t, http.MethodGet, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa", nil, &b); code != http.StatusNotFound || b.Error.Code != "not_found" {
		t.Errorf("GET of an unknown session: %d %+v", code, b)
	}

	// The tombstone is in the store: a restarted gateway still knows.
	g2 := restartWith(t, g, syscall.SIGTERM, "workdir")
	wantGone(t, g2, id, reason...)
}
