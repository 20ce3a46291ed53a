package rest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/rest"
)

// wsHeaders are a WebSocket handshake's request headers.
func wsHeaders(hdr ...string) []string {
	return append([]string{"Connection", "Upgrade", "Upgrade", "websocket",
		"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}, hdr...)
}

// wsOpen opens GET path as a WebSocket, checks the 101 against the spec,
// and returns the first message (the gateway's SSH banner); with noRead,
// it returns "" at once.
func (g *testGateway) wsOpen(t *testing.T, path, token string, noRead ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := http.Header{"Authorization": {"Bearer " + token}}
	c, resp, err := websocket.Dial(ctx, g.url+path, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("websocket %s: %v", path, err)
	}
	defer c.CloseNow()
	req, _ := http.NewRequest(http.MethodGet, g.url+path, nil)
	req.Header = h
	g.spec.checkResponse(t, req, result{status: resp.StatusCode, header: resp.Header})
	if len(noRead) == 0 {
		typ, msg, err := c.Read(ctx)
		if err != nil || typ != websocket.MessageBinary {
			t.Fatalf("websocket %s: first message %v %q, %v", path, typ, msg, err)
		}
		return string(msg)
	}
	return ""
}

// The SSH WebSocket: the banner arrives in binary messages; a foreign
// Origin is refused before the session is looked up. The terminal's
// WebSocket answers the same refusals.
func testSSHWebSocket(t *testing.T, g *testGateway, id string) {
	if banner := g.wsOpen(t, "/v1/sessions/"+id+"/ssh", aliceKey); !strings.HasPrefix(banner, "SSH-2.0-") {
		t.Errorf("websocket: first message %q, want the SSH banner", banner)
	}
	// The terminal's 101 (its shell is tested on the real binary:
	// cmd/sandgate's TestTerminalWebSocket).
	g.wsOpen(t, "/v1/sessions/"+id+"/terminal", aliceKey, "")
	for _, suffix := range []string{"/ssh", "/terminal"} {
		testWebSocketRefusals(t, g, id, suffix)
	}
	testTickets(t, g, id)
}

// Tickets: one use, for their session only, in place of the bearer.
func testTickets(t *testing.T, g *testGateway, id string) {
	issue := func() string {
		t.Helper()
		r := g.do(t, http.MethodPost, "/v1/sessions/"+id+"/tickets", aliceKey, nil)
		expect(t, r, 201, "")
		var tk struct{ Ticket, SessionID string }
		if err := json.Unmarshal(r.body, &tk); err != nil || tk.Ticket == "" || tk.SessionID != id {
			t.Fatalf("ticket answer %s", r.body)
		}
		return tk.Ticket
	}
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/tickets", "", nil), 401, "unauthorized")
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/tickets", bobKey, nil), 404, "not_found")
	tk := issue()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, g.url+"/v1/sessions/"+id+"/ssh?ticket="+tk, nil)
	if err != nil {
		t.Fatalf("websocket with a ticket: %v", err)
	}
	if _, msg, err := c.Read(ctx); err != nil || !strings.HasPrefix(string(msg), "SSH-2.0-") {
		t.Errorf("websocket with a ticket: %q, %v", msg, err)
	}
	c.CloseNow()
	// Used once: refused the second time.
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+id+"/ssh?ticket="+tk, "", nil, wsHeaders()...), 401, "invalid_ticket")
	// Another session's path, or not a WebSocket endpoint: refused.
	tk = issue()
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/terminal?ticket="+tk, "", nil, wsHeaders()...), 401, "invalid_ticket")
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+id+"?ticket="+issue(), "", nil), 401, "unauthorized")
}

func testWebSocketRefusals(t *testing.T, g *testGateway, id, suffix string) {
	path := "/v1/sessions/" + id + suffix
	expect(t, g.do(t, http.MethodGet, path, aliceKey, nil), 400, "websocket_required")
	expect(t, g.do(t, http.MethodGet, path, "", nil, wsHeaders()...), 401, "unauthorized")
	expect(t, g.do(t, http.MethodGet, path, "wrong", nil, wsHeaders()...), 401, "unauthorized")
	expect(t, g.do(t, http.MethodGet, path, aliceKey, nil, wsHeaders("Origin", "https://evil.example")...), 403, "origin_not_allowed")
	expect(t, g.do(t, http.MethodGet, path, aliceKey, nil, wsHeaders("Origin", "null")...), 403, "origin_not_allowed")
	expect(t, g.do(t, http.MethodGet, path, bobKey, nil, wsHeaders()...), 404, "not_found")
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/sbx-missing"+suffix, aliceKey, nil, wsHeaders()...), 404, "not_found")
}

// A tenant's unused tickets are bounded: past the bound, 429
// too_many_tickets; another tenant is not held up.
func TestTicketLimit(t *testing.T) {
	g := newGateway(t, gwOptions{rateLimit: 0})
	s := g.create(t, aliceKey, "")
	b := g.create(t, bobKey, "")
	for i := range rest.MaxTicketsPerTenant {
		if r := g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/tickets", aliceKey, nil); r.status != http.StatusCreated {
			t.Fatalf("ticket %d: %d %s", i, r.status, r.body)
		}
	}
	r := g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/tickets", aliceKey, nil)
	expect(t, r, 429, "too_many_tickets")
	if r.header.Get("Retry-After") == "" {
		t.Error("429 too_many_tickets without Retry-After")
	}
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+b.SessionID+"/tickets", bobKey, nil), 201, "")
}
