package rest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
)

type egressPageOut struct {
	Decisions []struct {
		Seq        int64     `json:"seq"`
		Kind       string    `json:"kind"`
		Host       string    `json:"host"`
		Port       int       `json:"port"`
		Address    string    `json:"address"`
		Allowed    bool      `json:"allowed"`
		Reason     string    `json:"reason"`
		BytesIn    int64     `json:"bytesIn"`
		BytesOut   int64     `json:"bytesOut"`
		Start      time.Time `json:"start"`
		DurationMs int64     `json:"durationMs"`
	} `json:"decisions"`
	NextCursor string `json:"nextCursor"`
}

// TestContractEgressDecisions: GET /v1/sessions/{id}/egress lists what the
// session's egress proxy allowed and refused, newest first, paged.
func TestContractEgressDecisions(t *testing.T) {
	cov := newCoverage()
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	})}
	go srv.Serve(up)
	t.Cleanup(func() { srv.Close() })
	port := up.Addr().(*net.TCPAddr).Port
	proxy, err := egress.New(egress.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Hosts:      map[string][]netip.Addr{"ok.test": {netip.MustParseAddr("127.0.0.1")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	bounds, err := egress.ParseBounds([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	g := newGateway(t, gwOptions{cov: cov, gateway: gateway.Config{Egress: &gateway.EgressConfig{Proxy: proxy, Bounds: bounds}}})
	s := g.create(t, aliceKey, fmt.Sprintf(`{"egress":["ok.test:%d"]}`, port))
	sess, err := g.mgr.Get(context.Background(), gateway.Principal{Tenant: "alice"}, s.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	// Through the proxy: one allowed request, then three refused.
	get := func(host string) {
		t.Helper()
		c, err := net.Dial("tcp", sess.ProxyAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET http://%s:%d/ HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", host, port, host, port)
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
	}
	get("ok.test")
	for _, h := range []string{"no1.test", "no2.test", "no3.test"} {
		get(h)
	}
	path := "/v1/sessions/" + s.SessionID + "/egress"
	page := func(q string) egressPageOut {
		t.Helper()
		var p egressPageOut
		for range 100 { // a record is kept when its exchange's handler returns
			r := g.do(t, http.MethodGet, path+q, aliceKey, nil)
			expect(t, r, 200, "")
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Fatal(err)
			}
			if q != "" || len(p.Decisions) == 4 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return p
	}
	all := page("")
	if len(all.Decisions) != 4 || all.NextCursor != "" {
		t.Fatalf("decisions %+v", all)
	}
	ok := all.Decisions[3]
	if ok.Host != "ok.test" || ok.Port != port || !ok.Allowed || ok.Address != "127.0.0.1" || ok.Kind != "http" ||
		ok.BytesIn <= 0 || ok.Start.IsZero() || ok.Seq != 1 {
		t.Errorf("allowed decision %+v", ok)
	}
	if d := all.Decisions[0]; d.Host != "no3.test" || d.Allowed || !strings.Contains(d.Reason, "egress list") || d.Seq != 4 {
		t.Errorf("newest decision %+v", d)
	}
	// Pages of two.
	p1 := page("?limit=2")
	if len(p1.Decisions) != 2 || p1.Decisions[0].Seq != 4 || p1.NextCursor == "" {
		t.Fatalf("page 1 %+v", p1)
	}
	p2 := page("?limit=2&cursor=" + p1.NextCursor)
	if len(p2.Decisions) != 2 || p2.Decisions[0].Seq != 2 || p2.NextCursor != "" {
		t.Fatalf("page 2 %+v", p2)
	}

	expect(t, g.do(t, http.MethodGet, path+"?limit=0", aliceKey, nil), 400, "invalid_limit")
	expect(t, g.do(t, http.MethodGet, path+"?limit=1001", aliceKey, nil), 400, "invalid_limit")
	expect(t, g.do(t, http.MethodGet, path+"?cursor=x", aliceKey, nil), 400, "invalid_cursor")
	expect(t, g.do(t, http.MethodGet, path, "", nil), 401, "unauthorized")
	expect(t, g.do(t, http.MethodGet, path, bobKey, nil), 404, "not_found")
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/egress", aliceKey, nil), 404, "not_found")
	// A session without egress has none.
	n := g.create(t, aliceKey, "")
	if p := (func() egressPageOut {
		var p egressPageOut
		r := g.do(t, http.MethodGet, "/v1/sessions/"+n.SessionID+"/egress", aliceKey, nil)
		expect(t, r, 200, "")
		json.Unmarshal(r.body, &p)
		return p
	})(); p.Decisions == nil || len(p.Decisions) != 0 {
		t.Errorf("a session without egress: %+v", p)
	}
	expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+n.SessionID, aliceKey, nil), 204, "")
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+n.SessionID+"/egress", aliceKey, nil), 410, "session_gone")

	requireSeen(t, cov, func(p string) bool { return strings.HasSuffix(p, "/egress") }, nil)
}
