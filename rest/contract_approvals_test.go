package rest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
)

// TestContractEgressApprovals: GET /v1/sessions/{id}/egress/pending lists
// the connections an ask-mode session parked; POST .../{pendingId}
// decides one, and remember keeps the decision in the session's lists.
func TestContractEgressApprovals(t *testing.T) {
	cov := newCoverage()
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })}
	go srv.Serve(up)
	t.Cleanup(func() { srv.Close() })
	port := up.Addr().(*net.TCPAddr).Port
	proxy, err := egress.New(egress.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Hosts:      map[string][]netip.Addr{"ok.test": {netip.MustParseAddr("127.0.0.1")}, "ask.test": {netip.MustParseAddr("127.0.0.1")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	bounds, _ := egress.ParseBounds([]string{"*"})
	g := newGateway(t, gwOptions{cov: cov, gateway: gateway.Config{Egress: &gateway.EgressConfig{Proxy: proxy, Bounds: bounds}}})
	expect(t, g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"egressMode":"sometimes"}`)), 400, "invalid_egress_mode")
	s := g.create(t, aliceKey, fmt.Sprintf(`{"egress":["ok.test:%d"],"egressMode":"ask"}`, port))
	sess, err := g.mgr.Get(context.Background(), gateway.Principal{Tenant: "alice"}, s.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	// get sends a plain request through the proxy; its answer comes on
	// the returned channel.
	get := func(host string) <-chan int {
		c, err := net.Dial("tcp", sess.ProxyAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "GET http://%s:%d/ HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: probe/1\r\nConnection: close\r\n\r\n", host, port, host, port)
		ch := make(chan int, 1)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				ch <- 0
				return
			}
			ch <- resp.StatusCode
		}()
		return ch
	}
	path := "/v1/sessions/" + s.SessionID + "/egress/pending"
	type pendingOut struct {
		Pending []struct {
			ID, Host, Via, UserAgent string
			Port                     int
			Since                    time.Time
		} `json:"pending"`
	}
	list := func(n int) pendingOut {
		t.Helper()
		var p pendingOut
		for range 500 {
			r := g.do(t, http.MethodGet, path, aliceKey, nil)
			expect(t, r, 200, "")
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Fatal(err)
			}
			if len(p.Pending) == n {
				return p
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("pending %+v, want %d", p, n)
		return p
	}
	list(0)
	first := get("ask.test")
	p := list(1).Pending[0]
	if p.Host != "ask.test" || p.Port != port || p.Via != "proxy" || p.UserAgent != "probe/1" || p.Since.IsZero() {
		t.Errorf("pending %+v", p)
	}
	expect(t, g.do(t, http.MethodPost, path+"/"+p.ID, aliceKey, []byte(`{"decision":"maybe"}`)), 400, "invalid_decision")
	expect(t, g.do(t, http.MethodPost, path+"/"+p.ID, bobKey, []byte(`{"decision":"allow"}`)), 404, "not_found")
	expect(t, g.do(t, http.MethodPost, path+"/"+p.ID, aliceKey, []byte(`{"decision":"deny","remember":true}`)), 200, "")
	if code := <-first; code != http.StatusForbidden {
		t.Errorf("denied: %d", code)
	}
	expect(t, g.do(t, http.MethodPost, path+"/"+p.ID, aliceKey, []byte(`{"decision":"allow"}`)), 404, "pending_not_found")
	// Remembered: refused at once, and shown in egress.deny.
	if code := <-get("ask.test"); code != http.StatusForbidden {
		t.Errorf("after a remembered denial: %d", code)
	}
	var view struct {
		Egress struct {
			Allow []string `json:"allow"`
			Mode  string   `json:"mode"`
			Deny  []string `json:"deny"`
		} `json:"egress"`
	}
	r := g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil)
	json.Unmarshal(r.body, &view)
	if want := fmt.Sprintf("ask.test:%d", port); view.Egress.Mode != "ask" || len(view.Egress.Deny) != 1 || view.Egress.Deny[0] != want {
		t.Errorf("egress %+v, want mode ask and deny [%s]", view.Egress, want)
	}
	expect(t, g.do(t, http.MethodGet, path, bobKey, nil), 404, "not_found")
	expect(t, g.do(t, http.MethodGet, path+"?follow=maybe", aliceKey, nil), 400, "invalid_field")
	expect(t, g.do(t, http.MethodGet, path, "", nil), 401, "unauthorized")
}
