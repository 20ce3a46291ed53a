package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/gwtest"
)

// TestAuditForward: every ssh -L (direct-tcpip) channel leaves a forward
// event with its destination, the bytes it moved each way and its result;
// refused ones too.
func TestAuditForward(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "python3")
	g := startGateway(t, "--sandbox", "workdir")
	s := g.createSession(t)
	auditPath := filepath.Join(g.DataDir, "audit.log")
	port := gwtest.FreePort(t)
	marker := serveMarker(t, g, s.SessionID, port, "sandgate-audit-forward-")

	// OpenSSH ssh -N -L: one HTTP/1.0 GET is one channel, ended by the server.
	local := gwtest.FreePort(t)
	cmd := newCmd(g.clientEnv(), ssh, append(g.sshOpts(t, s), "-N", "-o", "ExitOnForwardFailure=yes",
		"-L", fmt.Sprintf("127.0.0.1:%d:localhost:%d", local, port), s.SessionID)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if body := httpGetRetry(t, fmt.Sprintf("http://127.0.0.1:%d/marker.txt", local)); strings.TrimSpace(body) != marker {
		t.Fatalf("through ssh -L: %q", body)
	}

	// Refused: another host; failed: a closed port of the loopback.
	gc := goSSH(t, g, s)
	if _, err := directTCPIP(gc, "10.0.0.1", 80); err == nil {
		t.Fatal("direct-tcpip to 10.0.0.1 accepted")
	}
	closed := freePortNot(t, port)
	var oce *gossh.OpenChannelError
	if _, err := directTCPIP(gc, "127.0.0.1", closed); !errors.As(err, &oce) {
		t.Fatalf("direct-tcpip to a closed port: %v", err)
	}
	// A channel the client ends: its bytes are counted too.
	ch, err := directTCPIP(gc, "127.0.0.1", port)
	if err != nil {
		t.Fatal(err)
	}
	req := "GET /marker.txt HTTP/1.0\r\nHost: x\r\n\r\n"
	fmt.Fprint(ch, req)
	_ = ch.CloseWrite()
	resp, _ := io.ReadAll(ch)
	ch.Close()

	var events []audit.Event
	defer func() {
		if t.Failed() {
			t.Logf("forward events:\n%s", dumpEvents(find(events, audit.Event{Kind: audit.KindForward})))
		}
	}()
	waitFor(t, 30*time.Second, "the forward events", func() bool {
		events = readAudit(t, auditPath)
		return len(find(events, audit.Event{Kind: audit.KindForward, Result: "ok"})) >= 2 &&
			len(find(events, audit.Event{Kind: audit.KindForward, Result: "not_loopback"})) == 1 &&
			len(failedTo(events, closed)) == 1
	})
	var viaOpenSSH, viaGo bool
	for _, e := range find(events, audit.Event{Kind: audit.KindForward, Result: "ok"}) {
		if e.Session != s.SessionID || e.Port != port || e.BytesIn == 0 || e.BytesOut <= int64(len(marker)) {
			t.Errorf("forward event: %+v", e)
		}
		switch e.Host {
		case "localhost":
			viaOpenSSH = true
		case "127.0.0.1":
			viaGo = viaGo || e.BytesIn == int64(len(req)) && e.BytesOut == int64(len(resp))
		}
	}
	if !viaOpenSSH || !viaGo {
		t.Errorf("forward events of ssh -L (%v) and of the Go channel with its exact bytes (%v) missing:\n%s", viaOpenSSH, viaGo, dumpEvents(events))
	}
	if e := requireOne(t, events, audit.Event{Kind: audit.KindForward, Result: "not_loopback"}); e.Host != "10.0.0.1" || e.Port != 80 || e.Tenant == "" {
		t.Errorf("refused forward event: %+v", e)
	}
	if e := failedTo(events, closed)[0]; e.Host != "127.0.0.1" || e.Reason == "" {
		t.Errorf("failed forward event: %+v", e)
	}
}

// failedTo are the forward events of connects to port that failed (ssh -L
// may have some of its own to the server's port, before it listens).
func failedTo(events []audit.Event, port int) []audit.Event {
	var out []audit.Event
	for _, e := range find(events, audit.Event{Kind: audit.KindForward, Result: "connect_failed"}) {
		if e.Port == port {
			out = append(out, e)
		}
	}
	return out
}
