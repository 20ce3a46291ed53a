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
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// writeSelfSigned writes a certificate for 127.0.0.1 and its key.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandgate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certFile, keyFile
}

func TestHTTPSTunnel(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	cert, key := writeSelfSigned(t, t.TempDir())
	g := startGateway(t, "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(g.URL, "https://") {
		t.Fatalf("URL %s is not https", g.URL)
	}
	var s sessionJSON
	// The REST client in the harness uses the default transport: create via
	// the proxy's own TLS settings instead.
	s.SessionID = createOverTLS(t, g, cert)
	s.SSH.KnownHostsLine = readKnownHostsLine(t, g, cert, s.SessionID)
	env := append(g.clientEnv(), "SANDBOX_CA_FILE="+cert)
	out, errOut, code := runClient(t, env, nil, ssh, append(g.sshOpts(t, s), s.SessionID, "echo over-tls")...)
	if code != 0 || out != "over-tls\n" {
		t.Fatalf("ssh over https: %d %q %s", code, out, errOut)
	}
	// SSH in a WebSocket over https: large frames both ways (the proxy
	// gathers a frame's writes under TLS) come back intact.
	payload := strings.Repeat("0123456789abcdef", 3<<16) // 3 MiB
	out, errOut, code = runClient(t, env, strings.NewReader(payload), ssh, append(wsOpts(g, t, s, "websocket"), s.SessionID, "cat")...)
	if code != 0 || out != payload {
		t.Fatalf("ssh over a WebSocket over https: %d, %d bytes back of %d, %s", code, len(out), len(payload), errOut)
	}
	// Without the CA the proxy refuses the unknown certificate.
	_, errOut, code = runClient(t, g.clientEnv(), strings.NewReader(""), sandgateBin, "proxy", s.SessionID)
	if code == 0 || !strings.Contains(errOut, "certificate") {
		t.Fatalf("proxy without CA: %d %q", code, errOut)
	}
}

func tlsClient(t *testing.T, caFile string) *http.Client {
	t.Helper()
	pemData, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemData)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func createOverTLS(t *testing.T, g *gatewayProc, caFile string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := tlsClient(t, caFile).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s sessionJSON
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create over https: %d %v", resp.StatusCode, err)
	}
	return s.SessionID
}

func readKnownHostsLine(t *testing.T, g *gatewayProc, caFile, id string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := tlsClient(t, caFile).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s sessionJSON
	json.NewDecoder(resp.Body).Decode(&s)
	return s.SSH.KnownHostsLine
}
