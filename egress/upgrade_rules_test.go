package egress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A host held to rules per request gets no protocol switch but WebSocket:
// an h2c upgrade (after which any method and path would travel unread)
// is refused with 403 before it reaches the destination, on a
// transparent connection as through the proxy; a WebSocket upgrade of an
// allowed request goes on.
func TestRulesRefuseUpgrade(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := okServer(t, "ok")
	up.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Upgrade"))
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	port := serverPort(t, up.URL)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("api.test")})
	rule := `{"host":"api.test","port":` + port + `,"methods":["GET"],"paths":["/ok/*"]}`
	s, proxyURL := startSession(t, p, "upg", Policy{Allow: mustList(t, rule)}, nil)
	send := func(transparent bool, upgrade string) int {
		t.Helper()
		var c net.Conn
		target := "/ok/a"
		if transparent {
			a, b := net.Pipe()
			go s.servePlainConn(b, nil, "api.test", portOf(t, "x:"+port), false)
			c = a
		} else {
			var err error
			if c, err = net.Dial("tcp", proxyURL.Host); err != nil {
				t.Fatal(err)
			}
			target = "http://api.test:" + port + target
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		go io.WriteString(c, "GET "+target+" HTTP/1.1\r\nHost: api.test:"+port+"\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: "+upgrade+"\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", upgrade, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusForbidden && !strings.Contains(string(body), "held to rules per request") {
			t.Errorf("refusal %q", body)
		}
		return resp.StatusCode
	}
	for _, transparent := range []bool{true, false} {
		if code := send(transparent, "h2c"); code != http.StatusForbidden {
			t.Errorf("transparent %v: h2c upgrade %d, want 403", transparent, code)
		}
		if code := send(transparent, "websocket"); code != http.StatusOK {
			t.Errorf("transparent %v: websocket upgrade %d, want it forwarded (200 from this server)", transparent, code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, u := range seen {
		if u != "websocket" {
			t.Errorf("the destination saw Upgrade %q", u)
		}
	}
}
