package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// wsEchoServer is a WebSocket echo server in Python's standard library
// alone (RFC 6455: the handshake, masked client frames, unmasked echoes),
// listening on 127.0.0.1:argv[1] inside the sandbox.
const wsEchoServer = `import base64, hashlib, socket, sys, threading
G = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    f = c.makefile("rb")
    key = ""
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode().partition(":")
        if k.strip().lower() == "sec-websocket-key":
            key = v.strip()
    acc = base64.b64encode(hashlib.sha1(key.encode() + G).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % acc).encode())
    while True:
        h = f.read(2)
        if len(h) < 2:
            break
        op, n = h[0] & 15, h[1] & 127
        if n == 126:
            n = int.from_bytes(f.read(2), "big")
        elif n == 127:
            n = int.from_bytes(f.read(8), "big")
        mask = f.read(4) if h[1] & 128 else b"\0\0\0\0"
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            break
        ln = bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big")
        c.sendall(bytes([128 | op]) + ln + data)
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// httpNoKeep is a client that keeps no connection (no idle goroutine
// outlives a test) and follows no redirect.
func httpNoKeep() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialLocalhost},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// dialLocalhost dials as browsers and curl do: every *.localhost name is
// the loopback (a preview origin's).
func dialLocalhost(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(strings.ToLower(host), ".localhost") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// onNode is the preview URL u on the node (or gateway) at base: the same
// origin's name, base's port.
func onNode(t *testing.T, u, base string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	bu, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	pu.Host = net.JoinHostPort(pu.Hostname(), bu.Port())
	return pu.String()
}

// previewGet GETs u with token ("" for none).
func previewGet(t *testing.T, u, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := httpNoKeep().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// previewWait GETs u until it answers 200 (the server in the sandbox takes
// a moment to listen; until then the gateway answers 502).
func previewWait(t *testing.T, u, token string) []byte {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, b := previewGet(t, u, token)
		if code == http.StatusOK {
			return b
		}
		if code != http.StatusBadGateway || time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %s", u, code, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wsRoundTrip opens a WebSocket at u (ws URL as http://...) through the
// gateway with a raw RFC 6455 handshake, checks the accept key, sends a
// masked text frame and returns the echoed payload.
func wsRoundTrip(t *testing.T, u, token, msg string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialLocalhost(context.Background(), "tcp", pu.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	keyRaw := make([]byte, 16)
	_, _ = rand.Read(keyRaw)
	key := base64.StdEncoding.EncodeToString(keyRaw)
	req := "GET " + pu.RequestURI() + " HTTP/1.1\r\nHost: " + pu.Host + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + "\r\n"
	if token != "" {
		req += "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("upgrade: %d %s", res.StatusCode, b)
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if got := res.Header.Get("Sec-WebSocket-Accept"); got != base64.StdEncoding.EncodeToString(sum[:]) {
		t.Fatalf("Sec-WebSocket-Accept %q", got)
	}
	if len(msg) > 125 {
		t.Fatal("wsRoundTrip sends short frames only")
	}
	mask := []byte{1, 2, 3, 4}
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	h := make([]byte, 2)
	if _, err := io.ReadFull(br, h); err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if h[0] != 0x81 || h[1]&0x80 != 0 {
		t.Fatalf("echo frame header % x", h)
	}
	payload := make([]byte, h[1]&0x7f)
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte{0x88, 0x80, 0, 0, 0, 0}) // close
	return string(payload)
}

// putFile writes body at path in session id over REST.
func putFile(t *testing.T, g *gatewayProc, id, path, body string) {
	t.Helper()
	res, b := restFile(t, g, http.MethodPut, "/v1/sessions/"+id+"/files?path="+url.QueryEscape(path)+"&mkdirs=true",
		strings.NewReader(body), "Content-Type", "application/octet-stream")
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("put %s: %d %s", path, res.StatusCode, b)
	}
}

// TestPreviewPorts: a dev server started inside a sandbox (Python's
// http.server, and a stdlib WebSocket echo server) is reached through the
// real binary's preview URLs: with the bearer token, with a presigned
// link, and not without either; another tenant gets a 404.
func TestPreviewPorts(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, append(forwardDriverArgs(t, driver), "--api-key", "default:test-token", "--api-key", "bob:bob-token")...)
			s := g.createSession(t)
			httpPort := gwtest.FreePort(t)
			wsPort := freePortNot(t, httpPort)
			marker := "sandgate-preview-" + s.SessionID
			putFile(t, g, s.SessionID, "site/marker.txt", marker+"\n")
			putFile(t, g, s.SessionID, "ws.py", wsEchoServer)
			c := procClient{g: g, base: "/v1/sessions/" + s.SessionID + "/processes"}
			c.start(t, map[string]any{"command": fmt.Sprintf("cd site && exec python3 -m http.server %d --bind 127.0.0.1", httpPort), "name": "http"})
			c.start(t, map[string]any{"command": fmt.Sprintf("exec python3 ws.py %d", wsPort), "name": "ws"})
			base := fmt.Sprintf("%s/v1/sessions/%s/ports/", g.URL, s.SessionID)
			hp := fmt.Sprintf("%s%d/", base, httpPort)

			// With the bearer token.
			if b := previewWait(t, hp+"marker.txt", g.Token); strings.TrimSpace(string(b)) != marker {
				t.Fatalf("through the preview: %q, want %q", b, marker)
			}
			// The directory listing's relative links stay under the prefix.
			if code, b := previewGet(t, hp, g.Token); code != 200 || !strings.Contains(string(b), `href="marker.txt"`) {
				t.Errorf("listing: %d %.300s", code, b)
			}
			// Without a token, with a wrong one, as another tenant.
			if code, b := previewGet(t, hp+"marker.txt", ""); code != 401 || !bytes.Contains(b, []byte(`"unauthorized"`)) {
				t.Errorf("without a token: %d %s", code, b)
			}
			if code, _ := previewGet(t, hp+"marker.txt", "wrong-token"); code != 401 {
				t.Errorf("with a wrong token: %d", code)
			}
			if code, b := previewGet(t, hp+"marker.txt", "bob-token"); code != 404 || !bytes.Contains(b, []byte(`"not_found"`)) {
				t.Errorf("another tenant: %d %s", code, b)
			}
			// Nothing listening; a bad port.
			if code, b := previewGet(t, fmt.Sprintf("%s%d/x", base, freePortNot(t, httpPort)), g.Token); code != 502 || !bytes.Contains(b, []byte(`"port_unreachable"`)) {
				t.Errorf("closed port: %d %s", code, b)
			}
			if code, b := previewGet(t, base+"70000/x", g.Token); code != 400 || !bytes.Contains(b, []byte(`"invalid_port"`)) {
				t.Errorf("bad port: %d %s", code, b)
			}
			// A WebSocket echo round trip.
			wsURL := fmt.Sprintf("%s%d/socket", base, wsPort)
			deadline := time.Now().Add(30 * time.Second)
			for {
				// port_unreachable until it listens (then a plain GET is
				// port_bad_response: the server switches protocols unasked).
				_, b := previewGet(t, wsURL, g.Token)
				if !bytes.Contains(b, []byte(`"port_unreachable"`)) {
					break
				}
				if time.Now().After(deadline) {
					var ps []map[string]any
					g.api(t, http.MethodGet, c.base, nil, &ps)
					t.Fatalf("the websocket server never listened: %v", ps)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if got := wsRoundTrip(t, wsURL, g.Token, "hello over a websocket"); got != "hello over a websocket" {
				t.Errorf("websocket echo %q", got)
			}

			// A presigned link: no token needed.
			var link struct{ URL string }
			if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", map[string]any{"port": httpPort, "expiresIn": 600}, &link); code != 200 {
				t.Fatalf("port link: %d", code)
			}
			if code, b := previewGet(t, link.URL+"marker.txt", ""); code != 200 || strings.TrimSpace(string(b)) != marker {
				t.Errorf("through the link: %d %q", code, b)
			}
			// The label is the credential: one character off is no link.
			tampered := strings.Replace(link.URL, "a.localhost:", "b.localhost:", 1)
			if tampered == link.URL {
				tampered = strings.Replace(link.URL, ".localhost:", "a.localhost:", 1)
			}
			if code, b := previewGet(t, tampered+"marker.txt", ""); code != 403 || !bytes.Contains(b, []byte(`"link_invalid"`)) {
				t.Errorf("tampered link: %d %s", code, b)
			}
			var wsLink struct{ URL string }
			if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", map[string]any{"port": wsPort}, &wsLink); code != 200 {
				t.Fatalf("port link: %d", code)
			}
			if got := wsRoundTrip(t, wsLink.URL+"socket", "", "through a link"); got != "through a link" {
				t.Errorf("websocket echo through a link %q", got)
			}

			// The session ends: its preview and links with it.
			if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
				t.Fatalf("delete: %d", code)
			}
			if code, b := previewGet(t, link.URL+"marker.txt", ""); code != 410 || !bytes.Contains(b, []byte(`"link_gone"`)) {
				t.Errorf("link after delete: %d %s", code, b)
			}
			if code, _ := previewGet(t, hp+"marker.txt", g.Token); code != 410 {
				t.Errorf("preview after delete: %d", code)
			}
		})
	}
}

// sessionStats is GET /stats as these tests read it.
type sessionStats struct {
	Status string `json:"status"`
	Memory *struct {
		CurrentBytes int64  `json:"currentBytes"`
		PeakBytes    *int64 `json:"peakBytes"`
		LimitBytes   *int64 `json:"limitBytes"`
	} `json:"memory"`
	CPU *struct {
		Seconds float64 `json:"seconds"`
	} `json:"cpu"`
	Pids *struct {
		Current int64  `json:"current"`
		Limit   *int64 `json:"limit"`
	} `json:"pids"`
	Disk *struct {
		UsedBytes  int64  `json:"usedBytes"`
		TotalBytes *int64 `json:"totalBytes"`
	} `json:"disk"`
	Tunnel struct{ BytesIn, BytesOut int64 } `json:"tunnel"`
	Egress struct{ BytesIn, BytesOut int64 } `json:"egress"`
}

func getStats(t *testing.T, g *gatewayProc, id, token string) (int, sessionStats) {
	t.Helper()
	var st sessionStats
	code := gwtest.DoJSON(t, g.URL, token, http.MethodGet, "/v1/sessions/"+id+"/stats", nil, &st)
	return code, st
}

// TestLinuxSessionStats: a linux sandbox's stats are its cgroups' and its
// workspace's real numbers, with its tunnel and egress bytes, and the
// egress bytes reach /metrics.
func TestLinuxSessionStats(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	gwtest.RequireTool(t, "python3")
	_, port := upstream(t, nil)
	g := startGateway(t, "--sandbox", "linux", "--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", "up.test=127.0.0.1",
		"--metrics-token", "metrics-secret", "--api-key", "default:test-token", "--api-key", "bob:bob-token")
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"up.test:" + port}}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	code, idle := getStats(t, g, s.SessionID, g.Token)
	if code != 200 || idle.Memory == nil || idle.CPU == nil || idle.Pids == nil || idle.Disk == nil || idle.Disk.TotalBytes == nil {
		t.Fatalf("stats of a new linux session: %d %+v", code, idle)
	}

	// 64 MiB held by a process, 8 MiB written, 2 MiB fetched through
	// egress, CPU burnt, bytes through an SSH tunnel.
	c := procClient{g: g, base: "/v1/sessions/" + s.SessionID + "/processes"}
	c.start(t, map[string]any{"command": `python3 -c "import sys, time; x = bytearray(64 << 20); x[::4096] = b'x' * len(x[::4096]); print('held', flush=True); time.sleep(600)"`, "name": "mem"})
	if a := runREST(t, g, s.SessionID, map[string]any{"command": "head -c 8388608 /dev/urandom > blob && sync && " +
		"curl -sS -o /dev/null -w '%{size_download}' 'http://up.test:" + port + "/big?n=2097152' && " +
		"python3 -c 'sum(i*i for i in range(3000000))'"}); a.code() != 0 || a.out() != "2097152" {
		t.Fatalf("workload: %d %q %v", a.code(), a.out(), a.Stderr)
	}
	out, errOut, rc := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s), s.SessionID, "echo through-the-tunnel")...)
	if rc != 0 || strings.TrimSpace(out) != "through-the-tunnel" {
		t.Fatalf("ssh: %d %q %q", rc, out, errOut)
	}
	var st sessionStats
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The python process takes a moment to touch its 64 MiB.
		if code, st = getStats(t, g, s.SessionID, g.Token); code == 200 && st.Memory != nil && st.Memory.CurrentBytes >= 64<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory never reached 64 MiB: %d %+v", code, st.Memory)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st.Status != "running" {
		t.Errorf("status %q", st.Status)
	}
	if p := st.Memory.PeakBytes; p != nil && *p < st.Memory.CurrentBytes {
		t.Errorf("peak %d below current %d", *p, st.Memory.CurrentBytes)
	}
	if l := st.Memory.LimitBytes; l == nil || *l != 512<<20 {
		t.Errorf("memory limit %v, want 512 MiB", l)
	}
	if st.CPU == nil || st.CPU.Seconds <= idle.CPU.Seconds {
		t.Errorf("cpu %+v, was %+v", st.CPU, idle.CPU)
	}
	if st.Pids == nil || st.Pids.Current < 2 || st.Pids.Limit == nil {
		t.Errorf("pids %+v", st.Pids)
	}
	if st.Disk == nil || st.Disk.UsedBytes < idle.Disk.UsedBytes+8<<20 || *st.Disk.TotalBytes < st.Disk.UsedBytes {
		t.Errorf("disk %+v, was %+v", st.Disk, idle.Disk)
	}
	if st.Egress.BytesIn < 2<<20 || st.Egress.BytesOut == 0 {
		t.Errorf("egress %+v, want at least 2 MiB in", st.Egress)
	}
	if st.Tunnel.BytesIn == 0 || st.Tunnel.BytesOut == 0 {
		t.Errorf("tunnel %+v, want bytes both ways", st.Tunnel)
	}
	// Another tenant's session is a 404.
	if code, _ := getStats(t, g, s.SessionID, "bob-token"); code != http.StatusNotFound {
		t.Errorf("bob's stats of it: %d", code)
	}
	// The egress bytes in the gateway's metrics.
	code, _, body := scrapeMetrics(t, g.URL+"/metrics", "metrics-secret")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	var in float64
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, `sandgate_egress_bytes_total{direction="in"} `); ok {
			_, _ = fmt.Sscan(v, &in)
		}
	}
	if in < 2<<20 {
		t.Errorf("sandgate_egress_bytes_total{in} = %v, want at least 2 MiB", in)
	}
	// Stopped: no processes to measure, the files still counted.
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/stop", nil, nil); code != 200 {
		t.Fatalf("stop: %d", code)
	}
	code, st = getStats(t, g, s.SessionID, g.Token)
	if code != 200 || st.Status != "stopped" || st.Memory != nil || st.Pids != nil || st.Disk == nil || st.Disk.UsedBytes < 8<<20 {
		t.Errorf("stats of a stopped session: %d %+v", code, st)
	}
	raw, _ := json.Marshal(st)
	t.Logf("stopped: %s", raw)
}

// TestPreviewPortsDisabled: --ssh-allow-local-forward=false turns preview
// URLs off too: they reach the same ports.
func TestPreviewPortsDisabled(t *testing.T) {
	g := startGateway(t, "--ssh-allow-local-forward=false")
	s := g.createSession(t)
	if code, b := previewGet(t, g.URL+"/v1/sessions/"+s.SessionID+"/ports/8000/", g.Token); code != 403 || !bytes.Contains(b, []byte(`"ports_disabled"`)) {
		t.Errorf("preview: %d %s", code, b)
	}
	var e apiError
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", map[string]any{"port": 8000}, &e); code != 403 || e.Error.Code != "ports_disabled" {
		t.Errorf("port link: %d %+v", code, e)
	}
}

// TestPreviewMetricsPath: with --metrics-token, /metrics on a preview
// origin is the sandbox's server's, not the gateway's; on the API's
// origin it stays the gateway's.
func TestPreviewMetricsPath(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	g := startGateway(t, "--sandbox", "workdir", "--metrics-token", "metrics-secret")
	s := g.createSession(t)
	httpPort := gwtest.FreePort(t)
	putFile(t, g, s.SessionID, "site/metrics", "the sandbox's metrics\n")
	c := procClient{g: g, base: "/v1/sessions/" + s.SessionID + "/processes"}
	c.start(t, map[string]any{"command": fmt.Sprintf("cd site && exec python3 -m http.server %d --bind 127.0.0.1", httpPort), "name": "http"})
	var link struct{ URL string }
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", map[string]any{"port": httpPort}, &link); code != 200 {
		t.Fatalf("port link: %d", code)
	}
	if b := previewWait(t, link.URL+"metrics", ""); strings.TrimSpace(string(b)) != "the sandbox's metrics" {
		t.Errorf("/metrics on the preview origin: %q", b)
	}
	if code, _, _ := scrapeMetrics(t, g.URL+"/metrics", "metrics-secret"); code != 200 {
		t.Errorf("the gateway's /metrics: %d", code)
	}
}
