//go:build unix

package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// With ProxyUseFdpass the proxy hands ssh the tunnelled socket and exits;
// the SSH banner that follows the CONNECT answer must stay in the socket.
func TestOpenSSHFdpass(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t)
	s := g.createSession(t)
	// ssh keeps the first value of an option: these go before sshOpts.
	opts := append([]string{"-o", "ProxyCommand=" + sandgateBin + " proxy --fdpass %h", "-o", "ProxyUseFdpass=yes"}, g.sshOpts(t, s)...)
	for i := 0; i < 3; i++ {
		out, errOut, code := runClient(t, g.clientEnv(), strings.NewReader("in\n"), ssh, append(opts, s.SessionID, "cat; echo out")...)
		if code != 0 || out != "in\nout\n" {
			t.Fatalf("ssh via --fdpass: %d %q %s", code, out, errOut)
		}
	}
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	_, errOut, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, s.SessionID, "true")...)
	if code == 0 || !strings.Contains(errOut, "410") { // session_gone
		t.Fatalf("ssh to a deleted session via --fdpass: %d %s", code, errOut)
	}
}
