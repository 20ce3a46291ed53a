package main

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// TestLinuxTransparentBench logs the bench row of issue 42: transparent
// TCP throughput against the explicit proxy (CONNECT and plain), and the
// latency of the resolver's first answer for a name. It runs only with
// SANDGATE_BENCH=1 and asserts no timing.
func TestLinuxTransparentBench(t *testing.T) {
	if os.Getenv("SANDGATE_BENCH") != "1" {
		t.Skip("SANDGATE_BENCH=1 runs the bench")
	}
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	f := newEgressFixture(t)
	g := startGateway(t, f.args...)
	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{
		"egress": []string{"pypi.test:" + f.httpPort, "*.wild.test:" + f.httpPort},
	}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	run := func(cmd string) string {
		t.Helper()
		out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, cmd)...)
		if errOut != "" {
			t.Logf("%s: %s", cmd, errOut)
		}
		return strings.TrimSpace(out)
	}
	url := "http://pypi.test:" + f.httpPort + "/big?n=1000000000"
	speed := "-s -o /dev/null -w '%{speed_download}' "
	for i := range 3 {
		t.Logf("round %d: transparent %s B/s, CONNECT %s B/s, plain proxy %s B/s", i,
			run("curl --noproxy '*' "+speed+url), run("curl -p "+speed+url), run("curl "+speed+url))
	}
	dnsBench := `python3 -c "
import socket, struct, time, statistics
def q(name):
    b = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\x00'
    return b'\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00' + b + b'\x00\x01\x00\x01'
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('127.0.0.1', 53))
def rtt(name):
    t = time.perf_counter(); s.send(q(name)); s.recv(512); return (time.perf_counter() - t) * 1e6
first = [rtt('n%d.wild.test' % i) for i in range(500)]
again = [rtt('n%d.wild.test' % i) for i in range(500)]
print('first answer median %.0f us p99 %.0f us; repeated median %.0f us' % (statistics.median(first), sorted(first)[494], statistics.median(again)))
"`
	t.Logf("resolver: %s", run(dnsBench))
}
