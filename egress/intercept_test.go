package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const secretValue = "s3cr3t-Value-xyz"

// headerServer records the headers of the requests it gets.
type headerServer struct {
	*httptest.Server
	mu  sync.Mutex
	got []http.Header
}

func newHeaderServer(t *testing.T, tlsOn bool) *headerServer {
	hs := &headerServer{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs.mu.Lock()
		hs.got = append(hs.got, r.Header.Clone())
		hs.mu.Unlock()
		io.WriteString(w, "upstream ok")
	})
	if tlsOn {
		hs.Server = httptest.NewTLSServer(h)
	} else {
		hs.Server = httptest.NewServer(h)
	}
	t.Cleanup(hs.Close)
	return hs
}

func (hs *headerServer) last(t *testing.T) http.Header {
	t.Helper()
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if len(hs.got) == 0 {
		t.Fatal("upstream got no request")
	}
	return hs.got[len(hs.got)-1]
}

func tokenSecret(t *testing.T, hosts string, value *atomic.Pointer[string]) Secret {
	return Secret{
		Name:        "TOKEN",
		Hosts:       mustList(t, hosts),
		Header:      "authorization",
		Format:      "Bearer {value}",
		Placeholder: Placeholder("TOKEN"),
		Value: func() (string, bool) {
			v := value.Load()
			if v == nil {
				return "", false
			}
			return *v, true
		},
	}
}

func caPool(t *testing.T, ca *CA) *x509.CertPool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("bad CA PEM")
	}
	return pool
}

func TestInterceptInjectsSecret(t *testing.T) {
	bound := newHeaderServer(t, true)
	port := serverPort(t, bound.URL)
	ca, err := NewCA("s1")
	if err != nil {
		t.Fatal(err)
	}
	var value atomic.Pointer[string]
	v := secretValue
	value.Store(&v)
	p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com"), UpstreamRoots: serverPool(bound.Server)})
	s, proxy := startSession(t, p, "s1", Policy{
		Allow:   mustList(t, "example.com:"+port),
		Secrets: []Secret{tokenSecret(t, "example.com:"+port, &value)},
	}, ca)

	// The sandbox trusts the session CA and nothing else.
	client := proxyClient(t, proxy, caPool(t, ca))
	do := func(hdr http.Header) (int, string, *http.Response) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "https://example.com:"+port+"/api", nil)
		req.Header = hdr
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp
	}
	code, body, resp := do(http.Header{"Authorization": {"Bearer " + Placeholder("TOKEN")}, "X-Other": {"x " + Placeholder("TOKEN")}})
	if code != 200 || body != "upstream ok" {
		t.Fatalf("got %d %q", code, body)
	}
	if issuer := resp.TLS.PeerCertificates[0].Issuer.CommonName; issuer != "sandgate session s1 CA" {
		t.Errorf("leaf issued by %q", issuer)
	}
	h := bound.last(t)
	if got := h.Get("Authorization"); got != "Bearer "+secretValue {
		t.Errorf("upstream Authorization %q", got)
	}
	if h.Get("X-Other") != "" {
		t.Error("a header with the placeholder reached upstream")
	}
	// Without a header from the client, the secret is set too.
	if code, _, _ := do(http.Header{}); code != 200 || bound.last(t).Get("Authorization") != "Bearer "+secretValue {
		t.Errorf("no client header: %d, upstream %q", code, bound.last(t).Get("Authorization"))
	}
	// A Host header naming another host is refused (no fronting with the secret).
	req, _ := http.NewRequest(http.MethodGet, "https://example.com:"+port+"/", nil)
	req.Host = "evil.example.com"
	if resp, err := client.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), "Host header") {
			t.Errorf("other Host: %d %q", resp.StatusCode, b)
		}
	}

	// The operator removes the secret: the next request says so.
	value.Store(nil)
	code, body, _ = do(http.Header{})
	if code != 502 || body != "sandgate egress: secret TOKEN is no longer defined\n" {
		t.Errorf("removed secret: %d %q", code, body)
	}
	// The policy drops the host: the next request on the same tunnel is refused.
	s.SetPolicy(Policy{Allow: mustList(t, "other.test")})
	if code, body, _ = do(http.Header{}); code != 403 {
		t.Errorf("after SetPolicy: %d %q", code, body)
	}
	client.CloseIdleConnections()
	out := logs.waitFor(t, "kind=https", "kind=connect", `reason="secret TOKEN is no longer defined"`)
	if strings.Contains(out, secretValue) {
		t.Errorf("the secret value is in the log:\n%s", out)
	}
}

func TestInterceptUpstreamCertUntrusted(t *testing.T) {
	bound := newHeaderServer(t, true)
	port := serverPort(t, bound.URL)
	ca, err := NewCA("s1")
	if err != nil {
		t.Fatal(err)
	}
	var value atomic.Pointer[string]
	v := secretValue
	value.Store(&v)
	// Upstream roots that do not include the test server's certificate.
	p, logs := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com"), UpstreamRoots: x509.NewCertPool()})
	_, proxy := startSession(t, p, "s1", Policy{
		Allow:   mustList(t, "example.com:"+port),
		Secrets: []Secret{tokenSecret(t, "example.com:"+port, &value)},
	}, ca)
	code, body := get(t, proxyClient(t, proxy, caPool(t, ca)), "https://example.com:"+port+"/")
	if code != 502 || strings.Count(body, "\n") != 1 || !strings.Contains(body, "certificate") {
		t.Fatalf("got %d %q, want a one-line 502 about the certificate", code, body)
	}
	bound.mu.Lock()
	n := len(bound.got)
	bound.mu.Unlock()
	if n != 0 {
		t.Error("the request reached the untrusted upstream")
	}
	if out := logs.waitFor(t, "kind=https", "error="); strings.Contains(out, secretValue) {
		t.Error("the secret value is in the log")
	}
}

func TestNonBoundHostNotIntercepted(t *testing.T) {
	bound := newHeaderServer(t, true)
	free := newHeaderServer(t, true)
	ca, err := NewCA("s1")
	if err != nil {
		t.Fatal(err)
	}
	var value atomic.Pointer[string]
	v := secretValue
	value.Store(&v)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com", "free.example.com"), UpstreamRoots: serverPool(bound.Server)})
	_, proxy := startSession(t, p, "s1", Policy{
		Allow:   mustList(t, "example.com:"+serverPort(t, bound.URL), "free.example.com:"+serverPort(t, free.URL)),
		Secrets: []Secret{tokenSecret(t, "example.com:"+serverPort(t, bound.URL), &value)},
	}, ca)
	roots := caPool(t, ca)
	roots.AddCert(free.Certificate())
	req, _ := http.NewRequest(http.MethodGet, "https://free.example.com:"+serverPort(t, free.URL)+"/", nil)
	req.Header.Set("Authorization", "Bearer "+Placeholder("TOKEN"))
	resp, err := proxyClient(t, proxy, roots).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !resp.TLS.PeerCertificates[0].Equal(free.Certificate()) {
		t.Errorf("client saw %q, not the upstream's own certificate", resp.TLS.PeerCertificates[0].Subject)
	}
	// Passed through untouched: the placeholder, never the value.
	if got := free.last(t).Get("Authorization"); got != "Bearer "+Placeholder("TOKEN") {
		t.Errorf("non-bound upstream got Authorization %q", got)
	}
}

func TestPlainHTTPStripsPlaceholders(t *testing.T) {
	up := newHeaderServer(t, false)
	port := serverPort(t, up.URL)
	var value atomic.Pointer[string]
	v := secretValue
	value.Store(&v)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com")})
	// The secret is even bound to this host: cleartext never gets it.
	_, proxy := startSession(t, p, "s1", Policy{
		Allow:   mustList(t, "example.com:"+port),
		Secrets: []Secret{tokenSecret(t, "example.com:"+port, &value)},
	}, nil)
	req, _ := http.NewRequest(http.MethodGet, "http://example.com:"+port+"/", nil)
	req.Header.Set("Authorization", "Bearer "+Placeholder("TOKEN"))
	req.Header.Set("X-Api-Key", Placeholder("TOKEN"))
	req.Header.Set("X-Keep", "yes")
	resp, err := proxyClient(t, proxy, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h := up.last(t)
	if h.Get("Authorization") != "" || h.Get("X-Api-Key") != "" || h.Get("X-Keep") != "yes" {
		t.Errorf("upstream headers %v", h)
	}
	for k, vs := range h {
		if strings.Contains(strings.Join(vs, " "), secretValue) {
			t.Errorf("header %s carries the secret in cleartext", k)
		}
	}
}

func TestInterceptNoCA(t *testing.T) {
	bound := newHeaderServer(t, true)
	port := serverPort(t, bound.URL)
	var value atomic.Pointer[string]
	v := secretValue
	value.Store(&v)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("example.com")})
	_, proxy := startSession(t, p, "s1", Policy{
		Allow:   mustList(t, "example.com:"+port),
		Secrets: []Secret{tokenSecret(t, "example.com:"+port, &value)},
	}, nil)
	if resp, body, _, _ := rawConnect(t, proxy, "example.com:"+port); resp.StatusCode != 502 {
		t.Errorf("got %d %q, want 502", resp.StatusCode, body)
	}
}

func TestCA(t *testing.T) {
	ca, err := NewCA("abc")
	if err != nil {
		t.Fatal(err)
	}
	if cn := ca.cert.Subject.CommonName; cn != "sandgate session abc CA" {
		t.Errorf("CN %q", cn)
	}
	if d := time.Until(ca.cert.NotAfter); d < 9*365*24*time.Hour {
		t.Errorf("CA valid for %v", d)
	}
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca2.CertPEM(), ca.CertPEM()) {
		t.Error("round trip changed the certificate")
	}
	other, _ := NewCA("other")
	_, otherKey, _ := other.MarshalPEM()
	if _, err := ParseCA(certPEM, otherKey); err == nil {
		t.Error("ParseCA accepted a key of another CA")
	}
	if _, err := ParseCA(keyPEM, certPEM); err == nil {
		t.Error("ParseCA accepted swapped PEMs")
	}
	pool := caPool(t, ca)
	for _, host := range []string{"api.example.com", "10.0.0.5", "2001:db8::1"} {
		leaf, err := ca2.leaf(host) // minted by the reloaded CA, trusted via the original
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool}); err != nil {
			t.Errorf("leaf for %s: %v", host, err)
		}
		again, _ := ca2.leaf(host)
		if again != leaf {
			t.Errorf("leaf for %s not cached", host)
		}
	}
}

// TestCurl drives the proxy with real curl: plain HTTP, a tunnel, and an
// intercepted request trusting only the session CA.
func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl not found")
		}
		t.Skip("curl not found")
	}
	plain := okServer(t, "plain ok")
	free := okTLSServer(t, "tunnel ok")
	bound := newHeaderServer(t, true)
	ca, err := NewCA("s1")
	if err != nil {
		t.Fatal(err)
	}
	var value atomic.Pointer[string]
	v := secretValue
	value.Store(&v)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("plain.test", "free.example.com", "example.com"), UpstreamRoots: serverPool(bound.Server)})
	_, proxy := startSession(t, p, "s1", Policy{
		Allow: mustList(t, "plain.test:"+serverPort(t, plain.URL), "free.example.com:"+serverPort(t, free.URL),
			"example.com:"+serverPort(t, bound.URL)),
		Secrets: []Secret{tokenSecret(t, "example.com:"+serverPort(t, bound.URL), &value)},
	}, ca)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	freeCA := filepath.Join(dir, "free.pem")
	os.WriteFile(caFile, ca.CertPEM(), 0o644)
	os.WriteFile(freeCA, pemCert(free.Certificate()), 0o644)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(curl, append([]string{"-sS", "--max-time", "20", "--proxy", proxy.String()}, args...)...)
		cmd.Env = append(os.Environ(), "NO_PROXY=", "no_proxy=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("curl %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run("http://plain.test:" + serverPort(t, plain.URL) + "/"); out != "plain ok" {
		t.Errorf("plain: %q", out)
	}
	if out := run("--cacert", freeCA, "https://free.example.com:"+serverPort(t, free.URL)+"/"); out != "tunnel ok" {
		t.Errorf("tunnel: %q", out)
	}
	if out := run("--cacert", caFile, "-H", "Authorization: Bearer "+Placeholder("TOKEN"), "https://example.com:"+serverPort(t, bound.URL)+"/"); out != "upstream ok" {
		t.Errorf("intercepted: %q", out)
	}
	if got := bound.last(t).Get("Authorization"); got != "Bearer "+secretValue {
		t.Errorf("upstream Authorization %q", got)
	}
	if out := run("-w", "%{http_code}", "-o", "/dev/null", "http://evil.test/"); out != "403" {
		t.Errorf("denied: %q", out)
	}
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
