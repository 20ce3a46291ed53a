package main

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// lineEcho serves "echo: <line>" to each connection's first line on host
// loopback, then closes it; it returns the port.
func lineEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Write([]byte("echo: " + line))
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// testSSHD is an SSH server on host loopback that lets anyone in and
// answers every exec with "hello over ssh"; it returns the port.
func testSSHD(t *testing.T) string {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := gossh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &gossh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				_, chans, reqs, err := gossh.NewServerConn(nc, cfg)
				if err != nil {
					return
				}
				go gossh.DiscardRequests(reqs)
				for nch := range chans {
					ch, chReqs, err := nch.Accept()
					if err != nil {
						return
					}
					for r := range chReqs {
						if r.Type != "exec" {
							r.Reply(false, nil)
							continue
						}
						r.Reply(true, nil)
						ch.Write([]byte("hello over ssh\n"))
						ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{0}))
						ch.Close()
						break
					}
				}
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestLinuxTransparentEgress: clients that know nothing of the proxy (a
// Python socket, nc, OpenSSH) reach allowed names through the gateway's
// resolver and the namespace's redirect; other names are NXDOMAIN, and
// literal addresses, Host mismatches and UDP are refused.
func TestLinuxTransparentEgress(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "busybox")
	f := newEgressFixture(t)
	echoPort, sshPort := lineEcho(t), testSSHD(t)
	args := append(f.args, "--egress-resolve", "echo.test=127.0.0.1", "--egress-resolve", "git.test=127.0.0.1")
	g := startGateway(t, args...)
	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{
		"egress": []string{"echo.test:" + echoPort, "git.test:" + sshPort, "pypi.test:" + f.httpPort},
	}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	run := func(cmd string) (string, string) {
		t.Helper()
		out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID,
			"env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy -u ALL_PROXY "+cmd)...)
		return out, errOut
	}
	py := func(code string) string { return `python3 -c "` + code + `"` }
	cases := []struct{ name, cmd, want string }{
		{"python socket to an allowed name", py(`import socket; s=socket.create_connection(('echo.test', ` + echoPort + `), timeout=20); s.sendall(b'ping\n'); print(s.recv(100).decode(), end='')`), "echo: ping\n"},
		{"nc to an allowed name", "sh -c '(echo nc; sleep 5) | busybox nc echo.test " + echoPort + "'", "echo: nc\n"},
		{"OpenSSH to an allowed name", "ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -p " + sshPort + " git.test hi", "hello over ssh\n"},
		{"the resolver answers from the private range", py(`import socket; print(socket.gethostbyname('echo.test').startswith('198.1'))`), "True\n"},
		{"another name is NXDOMAIN", py(`import socket
try:
    socket.getaddrinfo('other.test', 80); print('resolved')
except socket.gaierror as e:
    print('nxdomain' if e.errno == socket.EAI_NONAME else e)`), "nxdomain\n"},
		{"a literal IP outside the policy is refused", py(`import socket
try:
    s=socket.create_connection(('93.184.216.34', 80), timeout=20); s.sendall(b'GET / HTTP/1.0\r\n\r\n'); print('open', s.recv(100))
except OSError as e:
    print('refused')`), "refused\n"},
		{"an address of the range no name was given is refused", py(`import socket
try:
    s=socket.create_connection(('198.18.200.1', 80), timeout=20); s.sendall(b'x'); print('open', s.recv(100))
except OSError as e:
    print('refused')`), "refused\n"},
		{"a Host other than the resolved name is refused", py(`import socket
s=socket.create_connection(('pypi.test', ` + f.httpPort + `), timeout=20); s.sendall(b'GET /hello HTTP/1.0\r\nHost: other.test\r\n\r\n')
try:
    print(s.recv(1000).decode().split('\r\n')[0])
except OSError as e:
    print('refused')`), " 403 Forbidden\n"},
		// Every request on a kept-alive connection is checked, not only
		// the first: the second one's Host is refused.
		{"a second request's Host other than the resolved name is refused", py(`import socket,time
s=socket.create_connection(('pypi.test', ` + f.httpPort + `), timeout=20); f=s.makefile('rb')
s.sendall(b'GET /hello HTTP/1.1\r\nHost: pypi.test:` + f.httpPort + `\r\n\r\n')
st=f.readline(); h=b''
while True:
    l=f.readline(); h+=l
    if l in (b'\r\n', b''): break
n=int([x for x in h.split(b'\r\n') if x.lower().startswith(b'content-length')][0].split(b':')[1]); f.read(n)
s.sendall(b'GET /hello HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n')
print(st.decode().strip(), f.read().decode().split('\r\n')[0])`), "200 OK HTTP/1.1 403 Forbidden\n"},
		{"the resolved name's Host passes", py(`import socket
s=socket.create_connection(('pypi.test', ` + f.httpPort + `), timeout=20); s.sendall(b'GET /hello HTTP/1.0\r\nHost: pypi.test:` + f.httpPort + `\r\n\r\n')
print(s.recv(1000).decode().split('\r\n')[0])`), " 200 OK\n"},
		{"UDP other than DNS is refused", py(`import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('93.184.216.34', 443)); print('sent')
except OSError as e:
    print('refused')`), "refused\n"},
		{"DNS over TCP", py(`import socket,struct
q=b'\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04echo\x04test\x00\x00\x01\x00\x01'
s=socket.create_connection(('127.0.0.1', 53), timeout=20); s.sendall(struct.pack('>H', len(q))+q)
r=s.recv(512); print(r[5] & 15, r[9])`), "0 1\n"},
	}
	for _, c := range cases {
		out, errOut := run(c.cmd)
		if !strings.Contains(out, c.want) {
			t.Errorf("%s: got (%q, %q), want %q", c.name, out, errOut, c.want)
		}
	}
	// The proxy variables keep working.
	out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID,
		"curl -sS --max-time 20 http://pypi.test:"+f.httpPort+"/hello")...)
	if out != "hello from pypi.test:"+f.httpPort+"\n" {
		t.Errorf("through HTTP_PROXY: %q %q", out, errOut)
	}
	logs := g.stderr.String()
	for _, want := range []string{"kind=dns host=other.test", "kind=tcp host=93.184.216.34 port=80", "kind=tcp host=echo.test",
		`host=198.18.200.1 port=80 ip="" allowed=false reason="address not given by this session's resolver"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the gateway's log has no %q", want)
		}
	}
}

// TestLinuxEgressRules: an object entry's methods and paths hold each
// request, on plain http:// and on intercepted HTTPS, a host with a bound
// secret or not (TestLinuxEgressRulesNoSecret: a session with rules and no
// secret).
func TestLinuxEgressRules(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", r.Method, r.URL.Path)
	}))
	t.Cleanup(echo.Close)
	_, echoPort, _ := net.SplitHostPort(echo.Listener.Addr().String())
	g := startGateway(t, append(f.args, "--egress-resolve", "api.test=127.0.0.1")...)
	ep, _ := strconv.Atoi(echoPort)
	tp, _ := strconv.Atoi(f.tlsPort)
	rule := map[string]any{"host": "api.test", "port": ep, "methods": []string{"get", "POST"}, "paths": []string{"/repos/acme/*"}}
	var s struct {
		egressSession
		Egress struct {
			Allow []json.RawMessage `json:"allow"`
		} `json:"egress"`
	}
	var raw json.RawMessage
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{
		"egress": []any{rule,
			map[string]any{"host": "secret.test", "port": tp, "methods": []string{"GET"}, "paths": []string{"/auth"}},
			map[string]any{"host": "pypi.test", "port": tp, "paths": []string{"/hello"}}},
		"secrets": []any{map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test:" + f.tlsPort}}},
	}, &raw); code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, raw)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	want := `{"host":"api.test","port":` + echoPort + `,"methods":["GET","POST"],"paths":["/repos/acme/*"]}`
	if len(s.Egress.Allow) != 3 || string(s.Egress.Allow[0]) != want {
		t.Fatalf("egress.allow %s, want the object %s first", s.Egress.Allow, want)
	}
	curl := "curl -sS --max-time 20 "
	api := "http://api.test:" + echoPort
	for _, c := range []struct{ name, cmd, want string }{
		{"GET under the path", curl + api + "/repos/acme/x", "GET /repos/acme/x\n"},
		{"POST under the path", curl + "-X POST " + api + "/repos/acme/y", "POST /repos/acme/y\n"},
		{"DELETE refused", curl + "-X DELETE " + api + "/repos/acme/x", "sandgate egress: DELETE api.test:" + echoPort + "/repos/acme/x denied by the rule " + want},
		{"another path refused", curl + api + "/repos/other", "denied by the rule"},
		{"a dot segment refused", curl + "--path-as-is " + api + "/repos/acme/../other", "denied by the rule"},
		{"an encoded slash refused", curl + api + "/repos/acme%2F..%2Fother", "denied by the rule"},
		{"intercepted HTTPS: the rule's request", curl + "https://secret.test:" + f.tlsPort + "/auth", "authorized\n"},
		{"intercepted HTTPS: another path", curl + "https://secret.test:" + f.tlsPort + "/hello", "denied by the rule"},
		{"intercepted HTTPS to a host only rules allow, no secret: the rule's path", curl + "https://pypi.test:" + f.tlsPort + "/hello", "hello from pypi.test:" + f.tlsPort + "\n"},
		{"intercepted HTTPS to a host only rules allow, no secret: another path", curl + "https://pypi.test:" + f.tlsPort + "/auth", "denied by the rule"},
		{"transparent: GET under the path", "curl --noproxy '*' -sS --max-time 20 " + api + "/repos/acme/x", "GET /repos/acme/x\n"},
		{"transparent: another path refused", "curl --noproxy '*' -sS --max-time 20 " + api + "/repos/other", "denied by the rule " + want},
		{"transparent: a GET, then a DELETE refused on the same connection", "curl --noproxy '*' -sS --max-time 20 " + api + "/repos/acme/x --next -X DELETE " + api + "/repos/acme/y", "GET /repos/acme/x\nsandgate egress: DELETE api.test:" + echoPort + "/repos/acme/y denied by the rule"},
		{"transparent: TLS to a host only rules allow, intercepted", "curl --noproxy '*' -sS --max-time 20 https://pypi.test:" + f.tlsPort + "/hello", "hello from pypi.test:" + f.tlsPort + "\n"},
		{"transparent: TLS to a host only rules allow, another path", "curl --noproxy '*' -sS --max-time 20 https://pypi.test:" + f.tlsPort + "/auth", "denied by the rule"},
	} {
		out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, c.cmd)...)
		if !strings.Contains(out+errOut, c.want) {
			t.Errorf("%s: %q got (%q, %q), want %q", c.name, c.cmd, out, errOut, c.want)
		}
	}
	// Bad objects are refused, naming the entry.
	var e apiError
	for _, bad := range []any{
		map[string]any{"host": "api.test", "paths": []string{"repos"}},
		map[string]any{"host": "api.test", "methods": []string{"G E T"}},
		map[string]any{"host": "api.test", "path": []string{"/x"}},
		map[string]any{"port": 80},
		42,
	} {
		code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []any{bad}}, &e)
		if code != http.StatusBadRequest {
			t.Errorf("create with %v: %d %+v, want 400", bad, code, e)
		}
	}
}

// TestLinuxGitOverSSH: with git.test:<port> in its egress list, a sandbox
// clones over SSH from an OpenSSH server on host loopback, no proxy
// anywhere (issue 42 item 2, with a key of the sandbox's own).
func TestLinuxGitOverSSH(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	dir := t.TempDir()
	// The key is made in the sandbox below; sshd reads the file at each
	// login, so it may come after sshd starts.
	authz := filepath.Join(dir, "authorized_keys")
	repo, port := gitSSHD(t, authz)

	f := newEgressFixture(t)
	g := startGateway(t, append(f.args, "--egress-resolve", "git.test=127.0.0.1")...)
	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"egress": []string{"git.test:" + port}}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	run := func(cmd string) (string, string, int) {
		t.Helper()
		return runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID,
			"env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy "+cmd)...)
	}
	pub, errOut, code := run("ssh-keygen -q -t ed25519 -N '' -f /workspace/id && cat /workspace/id.pub")
	if code != 0 {
		t.Fatalf("key in the sandbox: %s", errOut)
	}
	if err := os.WriteFile(authz, []byte(pub), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, _ := run("GIT_SSH_COMMAND='ssh -i /workspace/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR' " +
		"git clone -q ssh://root@git.test:" + port + repo + " /workspace/clone && cat /workspace/clone/README")
	if out != "cloned over ssh\n" {
		t.Errorf("git clone over ssh: %q %q", out, errOut)
	}
}

// TestLinuxTripwire: a bound secret's placeholder headed for a host the
// secret is not bound to (in a header, the URL or the body) is refused
// and audited as a tripwire naming the secret and the host; with
// --tripwire-action stop the session is stopped too.
func TestLinuxTripwire(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	hp, tp := ":"+f.httpPort, ":"+f.tlsPort
	body := map[string]any{
		"egress":  []string{"pypi.test" + hp, "secret.test" + tp},
		"secrets": []any{map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test" + tp}}},
	}
	for _, action := range []string{"block", "stop"} {
		t.Run(action, func(t *testing.T) {
			g := startGateway(t, append(f.args, "--tripwire-action", action)...)
			var s egressSession
			if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
				t.Fatalf("create: %d", code)
			}
			run := func(cmd string) string {
				t.Helper()
				out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, cmd)...)
				return out + errOut
			}
			curl := "curl -sS --max-time 20 "
			if out := run(curl + "https://secret.test" + tp + "/auth"); out != "authorized\n" {
				t.Fatalf("the secret's own host: %q", out)
			}
			const tripped = "denied: tripwire: the placeholder of secret GH_TOKEN"
			cases := []struct{ cmd, want string }{
				{curl + `-d "token=$GH_TOKEN" http://pypi.test` + hp + "/echo-auth", tripped},
				{curl + `"http://pypi.test` + hp + `/echo-auth?t=$GH_TOKEN"`, tripped},
				// Without the proxy variables (transparent): refused alike.
				{curl + `-H "X-Token: $GH_TOKEN" --noproxy '*' http://pypi.test` + hp + "/echo-auth", tripped},
				// Every request of a kept-alive connection, not only the
				// first.
				{curl + `--noproxy '*' http://pypi.test` + hp + `/hello --next --noproxy '*' -H "X-Token: $GH_TOKEN" http://pypi.test` + hp + "/echo-auth", "hello from pypi.test" + hp + "\nsandgate egress: pypi.test" + hp + " " + tripped},
			}
			if action == "stop" {
				cases = cases[:1]
			}
			for _, c := range cases {
				// Stopping may cut the SSH channel before the answer.
				if out := run(c.cmd); action == "block" && !strings.Contains(out, c.want) {
					t.Errorf("%s: %q, want %q", c.cmd, out, c.want)
				}
			}
			var page struct {
				Events []struct {
					Kind, Result, Secret, Host, Session string
				} `json:"events"`
			}
			found := false
			for i := 0; i < 100 && !found; i++ {
				g.api(t, http.MethodGet, "/v1/audit?limit=1000&session="+s.SessionID, nil, &page)
				for _, e := range page.Events {
					if e.Kind == "egress" && e.Result == "tripwire" && e.Secret == "GH_TOKEN" && e.Host == "pypi.test" {
						found = true
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !found {
				t.Errorf("no tripwire event in the audit: %+v", page.Events)
			}
			var got struct {
				Status string `json:"status"`
			}
			status := ""
			for i := 0; i < 200; i++ {
				g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &got)
				if status = got.Status; status == "stopped" || action == "block" {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			want := map[string]string{"block": "running", "stop": "stopped"}[action]
			if status != want {
				t.Errorf("after the tripwire the session is %q, want %q", status, want)
			}
		})
	}
}
