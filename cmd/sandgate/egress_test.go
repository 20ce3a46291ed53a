package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// canary is the secret value the egress tests look for everywhere it must
// not be.
const canary = "canary-7f3a9c2e51d84b06"

// boundCanary is the value of the secret bound to a host: it must never
// be seen inside the sandbox either.
const boundCanary = "bound-canary-0c9d2e7a4b1f"

// testPKI is a CA and a server certificate it signed for the test names.
type testPKI struct {
	caFile string
	server tls.Certificate
}

func newTestPKI(t *testing.T, names ...string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandgate egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: names, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	p := testPKI{caFile: filepath.Join(t.TempDir(), "ca.pem")}
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	p.server = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return p
}

// upstream serves what the egress tests fetch: /hello names the host it
// was asked for, /big?n= sends n bytes, /auth says whether the bound
// secret arrived (never echoing it), /echo-auth shows the Authorization
// header as it arrived.
func upstream(t *testing.T, cert *tls.Certificate) (*httptest.Server, string) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s\n", r.Host) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, len(buf))
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+boundCanary {
			fmt.Fprintln(w, "authorized")
			return
		}
		fmt.Fprintln(w, "unauthorized")
	})
	mux.HandleFunc("/echo-auth", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "auth=%q\n", r.Header.Get("Authorization"))
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the SNI test's cut handshakes
	if cert != nil {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return srv, port
}

// egressFixture is what the egress tests run against: loopback HTTP and
// HTTPS servers, a secrets file, and the serve flags that open them.
type egressFixture struct {
	pki               testPKI
	httpPort, tlsPort string
	args              []string
}

func newEgressFixture(t *testing.T) egressFixture {
	t.Helper()
	f := egressFixture{pki: newTestPKI(t, "pypi.test", "secret.test", "other.test", "a.wild.test")}
	_, f.httpPort = upstream(t, nil)
	_, f.tlsPort = upstream(t, &f.pki.server)
	secrets := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(secrets, []byte("# test secrets\nCANARY_TOKEN="+canary+"\nGH_TOKEN="+boundCanary+"\nother/ONLY_OTHER=x\nPINNED@secret.test="+boundCanary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.args = []string{"--sandbox", "linux", "--egress-allow-cidr", "127.0.0.1/32", "--secrets-file", secrets,
		"--egress-upstream-ca", f.pki.caFile}
	for _, n := range []string{"pypi.test", "secret.test", "other.test", "a.wild.test", "wild.test"} {
		f.args = append(f.args, "--egress-resolve", n+"=127.0.0.1")
	}
	f.args = append(f.args, "--egress-resolve", "internal.test=127.0.0.2")
	return f
}

type egressSession struct {
	sessionJSON
	Egress struct {
		Allow    []string `json:"allow"`
		BytesIn  int64    `json:"bytesIn"`
		BytesOut int64    `json:"bytesOut"`
	} `json:"egress"`
	Secrets []json.RawMessage `json:"secrets"`
}

type apiError struct {
	Error struct{ Code, Message string } `json:"error"`
}

// TestLinuxEgress drives the egress proxy and secrets through the real
// binary on the linux driver, with curl, Python and OpenSSL inside the
// sandbox against loopback servers that --egress-allow-cidr opens.
func TestLinuxEgress(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	pki, httpPort, tlsPort := f.pki, f.httpPort, f.tlsPort
	g := startGateway(t, f.args...)

	create := func(body map[string]any) egressSession {
		t.Helper()
		var s egressSession
		if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
			t.Fatalf("create %v: %d", body, code)
		}
		return s
	}
	run := func(s egressSession, cmd string) (string, string, int) {
		t.Helper()
		return runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, cmd)...)
	}
	hp, tp := ":"+httpPort, ":"+tlsPort
	a := create(map[string]any{
		"egress":  []string{"pypi.test" + hp, "pypi.test" + tp, "*.wild.test" + hp, "internal.test" + hp, "169.254.169.254", "secret.test" + tp},
		"secrets": []any{"CANARY_TOKEN", map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test" + tp}, "header": "Authorization", "format": "Bearer {value}"}},
	})
	if len(a.Egress.Allow) != 6 || len(a.Secrets) != 2 {
		t.Fatalf("session shows egress %v, secrets %s", a.Egress.Allow, a.Secrets)
	}
	if out, _, code := run(a, "cat > /workspace/ca.pem < /dev/stdin; true"); code != 0 {
		t.Fatalf("%s", out)
	}
	ca, _ := os.ReadFile(pki.caFile)
	if _, _, code := runClient(t, g.clientEnv(), strings.NewReader(string(ca)), ssh, append(g.sshOpts(t, a.sessionJSON), a.SessionID, "cat > /workspace/ca.pem")...); code != 0 {
		t.Fatal("could not copy the test CA in")
	}
	curl := "curl -sS --max-time 20 --cacert /workspace/ca.pem "
	code3 := curl + "-o /dev/null -w '%{http_code}' "
	cases := []struct {
		name, cmd, want string
	}{
		{"allowed name over http", curl + "http://pypi.test" + hp + "/hello", "hello from pypi.test" + hp + "\n"},
		{"allowed name over https (CONNECT)", curl + "https://pypi.test" + tp + "/hello", "hello from pypi.test" + tp + "\n"},
		{"git-style CONNECT for http", curl + "-p http://pypi.test" + hp + "/hello", "hello from pypi.test" + hp + "\n"},
		{"pip-style https from Python", `python3 -c "import ssl,urllib.request as u; c=ssl.create_default_context(cafile='/workspace/ca.pem'); print(u.urlopen('https://pypi.test` + tp + `/hello', context=c).read().decode(), end='')"`, "hello from pypi.test" + tp + "\n"},
		{"wildcard match", curl + "http://a.wild.test" + hp + "/hello", "hello from a.wild.test" + hp + "\n"},
		{"wildcard does not match its apex", code3 + "http://wild.test" + hp + "/hello", "403"},
		{"name outside the list", curl + "http://other.test" + hp + "/hello", "sandgate egress: other.test" + hp + " denied: not in this session's egress list"},
		{"https outside the list", code3 + "https://other.test" + tp + "/hello 2>&1; true", "CONNECT tunnel failed, response 403"},
		{"port mismatch", code3 + "http://pypi.test:1/hello", "403"},
		{"allowed name resolving to a private address", curl + "http://internal.test" + hp + "/hello", "internal.test" + hp + " denied: resolves to a private address\n"},
		{"metadata address under an allow-all list", curl + "http://169.254.169.254/latest/meta-data/", "private address 169.254.169.254"},
		{"environment secret", "printenv CANARY_TOKEN", canary + "\n"},
		{"bound secret reaches its host only as a header", "curl -sS --max-time 20 https://secret.test" + tp + "/auth", "authorized\n"},
		{"python trusts the session CA through the environment", `python3 -c "import urllib.request as u; print(u.urlopen('https://secret.test` + tp + `/auth').read().decode(), end='')"`, "authorized\n"},
		{"bound secret is a placeholder inside", "printenv GH_TOKEN | grep -c " + boundCanary + "; printenv GH_TOKEN", "0\nsandgate-"},
		{"a placeholder to another host trips the tripwire", curl + `-H "Authorization: Bearer $GH_TOKEN" http://pypi.test` + hp + "/echo-auth", "denied: tripwire: the placeholder of secret GH_TOKEN"},
		{"no raw sockets out", "bash -c 'echo > /dev/tcp/127.0.0.1/" + httpPort + "' 2>/dev/null && echo open || echo closed", "closed\n"},
	}
	for _, c := range cases {
		out, errOut, _ := run(a, c.cmd)
		if !strings.Contains(out+errOut, c.want) {
			t.Errorf("%s: %q got (%q, %q), want %q", c.name, c.cmd, out, errOut, c.want)
		}
	}
	// The bound secret's value is nowhere in the sandbox: not in any
	// process's environment, not in the trust files.
	if out, _, _ := run(a, "cat /proc/*/environ /etc/* /workspace/* 2>/dev/null | grep -c "+boundCanary+"; true"); out != "0\n" {
		t.Errorf("the bound secret's value is visible inside the sandbox (%s matches)", strings.TrimSpace(out))
	}
	// An SNI other than the CONNECT host is cut off.
	sni := `python3 -c "
import socket, ssl
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'CONNECT pypi.test` + tp + ` HTTP/1.1\r\nHost: pypi.test` + tp + `\r\n\r\n')
print(s.recv(100).split(b'\r\n')[0].decode())
c = ssl.create_default_context(cafile='/workspace/ca.pem'); c.check_hostname = False
try:
    t = c.wrap_socket(s, server_hostname='other.test'); t.sendall(b'GET /hello HTTP/1.0\r\n\r\n'); print('open', t.recv(100))
except Exception as e:
    print('refused')
"`
	if out, errOut, _ := run(a, sni); out != "HTTP/1.1 200 Connection established\nrefused\n" {
		t.Errorf("SNI mismatch: %q %q", out, errOut)
	}
	// Byte counts.
	if out, errOut, _ := run(a, curl+"-o /dev/null -w '%{size_download}' 'http://pypi.test"+hp+"/big?n=3000000'"); out != "3000000" {
		t.Errorf("download: %q %q", out, errOut)
	}
	var got egressSession
	g.api(t, http.MethodGet, "/v1/sessions/"+a.SessionID, nil, &got)
	if got.Egress.BytesIn < 3000000 || got.Egress.BytesOut <= 0 {
		t.Errorf("egress byte counts: in %d, out %d", got.Egress.BytesIn, got.Egress.BytesOut)
	}

	// A policy change applies to the next connection.
	var e apiError
	if code := g.api(t, http.MethodPatch, "/v1/sessions/"+a.SessionID, map[string]any{"egress": []string{"a.wild.test" + hp}}, &got); code != http.StatusOK || len(got.Egress.Allow) != 1 {
		t.Fatalf("patch egress: %d %v", code, got.Egress.Allow)
	}
	if out, _, _ := run(a, code3+"http://pypi.test"+hp+"/hello"); out != "403" {
		t.Errorf("after the policy change pypi.test answers %q", out)
	}
	if out, _, _ := run(a, curl+"http://a.wild.test"+hp+"/hello"); !strings.HasPrefix(out, "hello") {
		t.Errorf("after the policy change a.wild.test answers %q", out)
	}

	// Another session has no network and cannot reach the first one's proxy.
	b := create(map[string]any{})
	if out, _, _ := run(b, "bash -c 'echo > /dev/tcp/127.0.0.1/3128' 2>/dev/null && echo open || echo closed; printenv HTTP_PROXY; true"); out != "closed\n" {
		t.Errorf("a session without egress: %q", out)
	}
	// A session without egress can be given some on the fly.
	if code := g.api(t, http.MethodPatch, "/v1/sessions/"+b.SessionID, map[string]any{"egress": []string{"pypi.test" + hp}}, &got); code != http.StatusOK {
		t.Fatalf("patch egress on: %d", code)
	}
	if out, _, _ := run(b, curl+"http://pypi.test"+hp+"/hello"); !strings.HasPrefix(out, "hello") {
		t.Errorf("egress turned on later: %q", out)
	}

	// Refusals at create, each naming what is wrong; nothing is created.
	for _, c := range []struct {
		body map[string]any
		code string
		in   string
	}{
		{map[string]any{"egress": []string{"pypi.org", "http://x/y"}}, "invalid_egress", "http://x/y"},
		{map[string]any{"secrets": []string{"NOPE", "ONLY_OTHER"}}, "unknown_secret", "NOPE, ONLY_OTHER"},
		{map[string]any{"egress": []string{"pypi.test"}, "secrets": []any{map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test"}}}}, "egress_not_allowed", "secret.test"},
		// Pinned by the operator to secret.test: neither unbound nor bound elsewhere.
		{map[string]any{"secrets": []string{"PINNED"}}, "secret_pinned", `"secret.test"`},
		{map[string]any{"egress": []string{"pypi.test"}, "secrets": []any{map[string]any{"name": "PINNED", "hosts": []string{"pypi.test"}}}}, "secret_pinned", `outside them: "pypi.test"`},
	} {
		if code := g.api(t, http.MethodPost, "/v1/sessions", c.body, &e); code != http.StatusBadRequest || e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.in) {
			t.Errorf("create %v: %d %+v, want 400 %s naming %s", c.body, code, e, c.code, c.in)
		}
	}

	// The canary is in no API answer, log line or store file.
	var list json.RawMessage
	g.api(t, http.MethodGet, "/v1/sessions", nil, &list)
	if strings.Contains(string(list), canary) || strings.Contains(string(list), boundCanary) {
		t.Error("the secret's value is in the session list")
	}
	if !strings.Contains(g.stderr.String(), "msg=egress") {
		t.Error("no egress connection was logged")
	}
	g.stop(t)
	if logs := g.stderr.String() + g.stdout.String(); strings.Contains(logs, canary) || strings.Contains(logs, boundCanary) {
		t.Error("the secret's value is in the gateway's log")
	}
	_ = filepath.WalkDir(g.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && (strings.Contains(string(b), canary) || strings.Contains(string(b), boundCanary)) {
			t.Errorf("the secret's value is in %s", p)
		}
		return nil
	})
}

// TestEgressFlagsAndBounds: --egress-allow bounds what sessions may ask
// for, and names the entries outside it.
func TestEgressBounds(t *testing.T) {
	g := startGateway(t, "--egress-allow", "*.example.com", "--egress-allow", "pypi.org:443")
	var e apiError
	body := map[string]any{"egress": []string{"api.example.com", "pypi.org", "evil.net"}}
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &e); code != http.StatusBadRequest || e.Error.Code != "egress_not_allowed" ||
		!strings.Contains(e.Error.Message, `"pypi.org"`) || !strings.Contains(e.Error.Message, `"evil.net"`) || strings.Contains(e.Error.Message, "api.example.com") {
		t.Errorf("outside the bounds: %d %+v", code, e)
	}
	var s egressSession
	body = map[string]any{"egress": []string{"api.example.com", "pypi.org:443"}}
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated || len(s.Egress.Allow) != 2 {
		t.Errorf("within the bounds: %d %+v", code, s.Egress)
	}
}

// TestLinuxEgressSurvivesRestart: after a gateway crash the next process
// gives a kept session its proxy back, with its policy, bound secret and
// byte counts.
func TestLinuxEgressSurvivesRestart(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "curl")
	f := newEgressFixture(t)
	g := startGateway(t, append(f.args, "--keep-sandboxes-on-exit=true")...)
	var s egressSession
	body := map[string]any{
		"egress":  []string{"pypi.test:" + f.httpPort, "secret.test:" + f.tlsPort},
		"secrets": []any{map[string]any{"name": "GH_TOKEN", "hosts": []string{"secret.test:" + f.tlsPort}}},
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	fetch := func(g *gatewayProc) string {
		out, errOut, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID,
			"curl -sS --max-time 20 http://pypi.test:"+f.httpPort+"/hello https://secret.test:"+f.tlsPort+"/auth")...)
		return out + errOut
	}
	want := "hello from pypi.test:" + f.httpPort + "\nauthorized\n"
	if got := fetch(g); got != want {
		t.Fatalf("before the restart: %q", got)
	}
	var before egressSession
	g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &before)
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token}
	g2.start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--api-key", g.Token,
		"--keep-sandboxes-on-exit=false"}, f.args...))
	if got := fetch(g2); got != want {
		t.Errorf("after the restart: %q", got)
	}
	var after egressSession
	g2.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID, nil, &after)
	if after.Egress.BytesIn <= before.Egress.BytesIn || len(after.Egress.Allow) != 2 {
		t.Errorf("egress after the restart: %+v (before %+v)", after.Egress, before.Egress)
	}
}

// TestSecretsReloadOnSIGHUP: the secrets file is re-read on SIGHUP, and
// the next process of a live session sees the new value; a file that no
// longer parses keeps the old secrets and says so without the value.
func TestSecretsReloadOnSIGHUP(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	path := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(path, []byte("TOKEN=first-"+canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, "--secrets-file", path)
	var s egressSession
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"secrets": []string{"TOKEN"}}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	printenv := func() string {
		out, _, _ := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, s.sessionJSON), s.SessionID, "printenv TOKEN")...)
		return out
	}
	if got := printenv(); got != "first-"+canary+"\n" {
		t.Fatalf("before the reload: %q", got)
	}
	reload := func(content, logLine string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		before := strings.Count(g.stderr.String(), logLine)
		_ = g.cmd.Process.Signal(syscall.SIGHUP)
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(g.stderr.String(), logLine) == before {
			if time.Now().After(deadline) {
				t.Fatalf("no %s after SIGHUP", logLine)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	reload("TOKEN=second-"+canary+"\n", "msg=secrets_reloaded")
	if got := printenv(); got != "second-"+canary+"\n" {
		t.Errorf("after the reload: %q", got)
	}
	reload("TOKEN=second-"+canary+"\nbroken line "+canary+"\n", "msg=secrets_reload_failed")
	if got := printenv(); got != "second-"+canary+"\n" {
		t.Errorf("after a failed reload: %q", got)
	}
	if strings.Contains(g.stderr.String(), canary) {
		t.Error("a secret's value reached the log")
	}
}
