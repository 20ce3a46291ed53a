package main

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/tunnel"
)

// Issue 34's attack at the default bounds: one tenant holds 351 tunnels
// stalled after the SSH banner; the other tenant's OpenSSH logins all
// succeed, and the first tenant's CONNECTs past its budget answer 429.
func TestStalledTenantLeavesLoginsToOthers(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t, "--api-key", "a:token-a", "--api-key", "b:token-b")
	g.Token = "token-a"
	a := g.createSession(t)
	g.Token = "token-b"
	b := g.createSession(t)

	var mu sync.Mutex
	codes := map[int]int{}
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	for range 351 {
		wg.Go(func() {
			d := &tunnel.Dialer{APIURL: g.URL, Token: "token-a", Timeout: 30 * time.Second}
			c, err := d.Dial(t.Context(), a.SessionID)
			mu.Lock()
			defer mu.Unlock()
			if se, ok := err.(*tunnel.StatusError); ok {
				codes[se.StatusCode]++
				return
			}
			if err != nil {
				// Closed before an answer: --max-waiting-conns-per-ip (128)
				// closes the oldest of a burst of connections that have not
				// sent their request yet.
				codes[0]++
				return
			}
			held = append(held, c)
			codes[http.StatusOK]++
		})
	}
	wg.Wait()
	// The held ones stall after the banner (or were dropped right after
	// their 200, as the shared bound did).
	stalled := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err == nil && strings.HasPrefix(line, "SSH-2.0-") {
			stalled++
		}
	}
	t.Logf("tenant a's 351 CONNECTs: %v; %d tunnels stalled in SSH authentication", codes, stalled)
	// How many of the rest the per-IP waiting-connection bound closes
	// before they are answered depends on the machine's speed; every one
	// of them is refused either way, and none gets another answer.
	refused := codes[http.StatusTooManyRequests] + codes[0]
	if stalled != 32 || codes[http.StatusOK] != 32 || refused != 351-32 || codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("tenant a: %v, %d stalled: want 32 tunnels and the rest 429 (or closed unanswered by the connection bound)", codes, stalled)
	}

	opts := append(g.sshOpts(t, b), b.SessionID, "true")
	env := append(cleanEnv(), "SANDBOX_API_URL="+g.URL, "SANDBOX_API_TOKEN=token-b")
	failed := 0
	var fmu sync.Mutex
	var lw sync.WaitGroup
	for range 10 {
		lw.Go(func() {
			_, errOut, code := runClient(t, env, nil, ssh, opts...)
			if code != 0 {
				fmu.Lock()
				failed++
				fmu.Unlock()
				t.Logf("tenant b's login: exit %d: %s", code, errOut)
			}
		})
	}
	lw.Wait()
	if failed > 0 {
		t.Errorf("%d of tenant b's 10 logins failed while tenant a stalled its tunnels", failed)
	}
}
