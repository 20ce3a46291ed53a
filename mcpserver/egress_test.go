package mcpserver_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/mcpserver"
)

// TestServerEgressApprovals: a session created with egressMode ask parks
// a connection outside its list; list_egress_pending (waiting for it)
// shows it, and decide_egress lets it through.
func TestServerEgressApprovals(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	usrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })}
	go usrv.Serve(up)
	t.Cleanup(func() { usrv.Close() })
	port := up.Addr().(*net.TCPAddr).Port
	proxy, err := egress.New(egress.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Hosts:      map[string][]netip.Addr{"ok.test": {netip.MustParseAddr("127.0.0.1")}, "ask.test": {netip.MustParseAddr("127.0.0.1")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	bounds, _ := egress.ParseBounds([]string{"*"})
	st := gwtest.Start(t, gwtest.Options{Manager: gateway.Config{Egress: &gateway.EgressConfig{Proxy: proxy, Bounds: bounds}}})
	srv := mcpserver.New(mcpserver.Options{
		Client:          &mcpserver.Client{BaseURL: st.URL + "/v1", Token: st.Token},
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		EgressDecisions: true,
	})
	cs, _ := connect(t, srv)
	var created mcpserver.CreateSessionOutput
	if res := call(t, cs, "create_session", map[string]any{"egress": []string{fmt.Sprintf("ok.test:%d", port)}, "egressMode": "ask"}, &created); res.IsError {
		t.Fatal(text(res))
	}
	sess, err := st.Manager.Get(context.Background(), gateway.Principal{Tenant: "default"}, created.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", sess.ProxyAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://ask.test:%d/ HTTP/1.1\r\nHost: ask.test:%d\r\nConnection: close\r\n\r\n", port, port)
	var list mcpserver.ListEgressPendingOutput
	if res := call(t, cs, "list_egress_pending", map[string]any{"session": created.SessionID, "wait": 30}, &list); res.IsError || len(list.Pending) != 1 {
		t.Fatalf("list_egress_pending: %s %+v", text(res), list)
	}
	if p := list.Pending[0]; p.Host != "ask.test" || p.Port != port || p.Via != "proxy" {
		t.Errorf("pending %+v", p)
	}
	var d mcpserver.DecideEgressOutput
	if res := call(t, cs, "decide_egress", map[string]any{"session": created.SessionID, "pendingId": list.Pending[0].ID, "decision": "allow"}, &d); res.IsError {
		t.Fatal(text(res))
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the approved request: %v %v", resp, err)
	}
	resp.Body.Close()
	if res := call(t, cs, "decide_egress", map[string]any{"session": created.SessionID, "pendingId": list.Pending[0].ID, "decision": "allow"}, nil); !res.IsError {
		t.Error("deciding it again: want pending_not_found")
	}
	call(t, cs, "delete_session", map[string]any{"session": created.SessionID}, nil)
}

// TestServerEgressDecisionsOff: without Options.EgressDecisions (sandgate
// mcp without --egress-decisions, the default) decide_egress is neither
// listed nor callable: the model cannot approve its own sandbox's
// connections; list_egress_pending is offered either way.
func TestServerEgressDecisionsOff(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	for _, on := range []bool{false, true} {
		srv := mcpserver.New(mcpserver.Options{Client: &mcpserver.Client{BaseURL: st.URL + "/v1", Token: st.Token}, EgressDecisions: on})
		cs, _ := connect(t, srv)
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, tl := range tools.Tools {
			names[tl.Name] = true
		}
		if names["decide_egress"] != on || !names["list_egress_pending"] {
			t.Errorf("EgressDecisions %v: decide_egress listed %v, list_egress_pending %v", on, names["decide_egress"], names["list_egress_pending"])
		}
		if !on {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "decide_egress", Arguments: map[string]any{"pendingId": "x", "decision": "allow"}})
			if err == nil && !res.IsError {
				t.Error("decide_egress answered without EgressDecisions")
			}
		}
	}
}
