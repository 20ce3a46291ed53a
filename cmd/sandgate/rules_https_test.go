package main

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// TestLinuxEgressRulesNoSecret: a session whose egress has rules per
// request and no bound secret gets the egress CA all the same, and its
// HTTPS requests to a host only rules allow are read and held to them,
// through the proxy (CONNECT) and without it; a session with no rules
// gets no CA.
func TestLinuxEgressRulesNoSecret(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	g := startGateway(t, f.args...)
	tp, _ := strconv.Atoi(f.tlsPort)
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{
		"egress": []any{map[string]any{"host": "pypi.test", "port": tp, "methods": []string{"GET"}, "paths": []string{"/hello"}}},
	}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	rule := `{"host":"pypi.test","port":` + f.tlsPort + `,"methods":["GET"],"paths":["/hello"]}`
	curl := "curl -sS --max-time 20 "
	url := "https://pypi.test:" + f.tlsPort
	for _, c := range []struct{ name, cmd, want string }{
		{"the CA is trusted", `test -n "$SSL_CERT_FILE" && echo yes`, "yes\n"},
		{"CONNECT: the rule's request", curl + url + "/hello", "hello from pypi.test:" + f.tlsPort + "\n"},
		{"CONNECT: another path", curl + url + "/auth", "sandgate egress: GET pypi.test:" + f.tlsPort + "/auth denied by the rule " + rule},
		{"CONNECT: another method", curl + "-X POST " + url + "/hello", "denied by the rule " + rule},
		{"transparent: the rule's request", curl + "--noproxy '*' " + url + "/hello", "hello from pypi.test:" + f.tlsPort + "\n"},
		{"transparent: another path", curl + "--noproxy '*' " + url + "/auth", "denied by the rule " + rule},
	} {
		out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s), s.SessionID, c.cmd)...)
		if !strings.Contains(out+errOut, c.want) {
			t.Errorf("%s: %q got (%q, %q), want %q", c.name, c.cmd, out, errOut, c.want)
		}
	}
	var plain egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"pypi.test:" + f.tlsPort}}, &plain); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	if out, _, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, plain.sessionJSON), plain.SessionID, `echo "${SSL_CERT_FILE:-none}"`)...); out != "none\n" {
		t.Errorf("a session without rules or secrets has a CA: %q", out)
	}
}
