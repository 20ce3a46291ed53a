// Package kubetest runs a real Kubernetes control plane for tests: Debian's
// etcd and a kube-apiserver built from the Go module proxy
// (internal/kubetest/apiserver/build, cached in $HOME/.cache/sandgate), both
// on loopback ports. The API server authenticates with a static token file
// (an admin in system:masters and one token per test identity), authorizes
// with RBAC (so the rules a chart installs are exercised for real), signs
// service-account tokens with a key made on the fly, and serves TLS with a
// self-signed certificate. There is no controller-manager, scheduler or
// kubelet: objects are stored and served, ownerReference garbage collection
// and namespace finalization do not run.
//
// A test that needs it calls Start; it skips where the binary is missing
// and fails under CI=true, where .ci/run builds it.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Version is the kube-apiserver release the tests run (the helper module's
// k8s.io/kubernetes requirement).
const Version = "v1.37.2"

// AdminUser is the identity of Server.Config: in group system:masters.
const AdminUser = "kubetest-admin"

// User is a test identity of the token file.
type User struct {
	Name   string
	Groups []string
}

// Options configure Start.
type Options struct {
	// Users get a token each (Server.Token), besides the admin.
	Users []User
	// ExtraArgs are appended to kube-apiserver's flags.
	ExtraArgs []string
}

// Server is a running control plane.
type Server struct {
	// URL is the API server's https URL on loopback.
	URL string
	// CAData is the PEM certificate the server serves (self-signed).
	CAData []byte
	// Config is an admin rest.Config.
	Config *rest.Config
	// Dir holds the server's files (certificates, token file, logs).
	Dir string

	tokens map[string]string
	procs  []*proc
}

// Binary returns the kube-apiserver binary: $KUBE_APISERVER, or the cache
// the build script fills. It skips where there is none and fails under
// CI=true.
func Binary(t testing.TB) string {
	t.Helper()
	p := os.Getenv("KUBE_APISERVER")
	if p == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		p = filepath.Join(cache, "sandgate", "kube-apiserver-"+Version)
	}
	if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
		return p
	}
	msg := fmt.Sprintf("kube-apiserver %s is not built at %s (run internal/kubetest/apiserver/build, or set KUBE_APISERVER)", Version, p)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// etcdBinary returns Debian's etcd; it skips where there is none and fails
// under CI=true.
func etcdBinary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("etcd is not installed (apt-get install etcd-server)")
	}
	t.Skip("etcd is not installed (apt-get install etcd-server)")
	return ""
}

// Start runs etcd and kube-apiserver for the test and stops them at its
// end. Ports are picked free and handed over, so another process may take
// one in between: a control plane that does not come up is started again
// on other ports.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	apiserver, etcd := Binary(t), etcdBinary(t)
	var why error
	for range 3 {
		s, err := tryStart(t, apiserver, etcd, opts)
		if err == nil {
			return s
		}
		why = err
		t.Logf("kubetest: control plane did not come up, trying other ports: %v", err)
	}
	t.Fatalf("kubetest: control plane did not come up in 3 tries: %v", why)
	return nil
}

func tryStart(t testing.TB, apiserver, etcd string, opts Options) (*Server, error) {
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, tokens: map[string]string{}}
	ok := false
	defer func() {
		if !ok {
			s.stop()
		}
	}()
	t.Cleanup(s.stop)

	etcdClient, etcdPeer := freePort(), freePort()
	ep := &proc{name: "etcd", log: filepath.Join(dir, "etcd.log")}
	if err := ep.start(etcd, "--name", "kubetest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:"+etcdClient, "--advertise-client-urls", "http://127.0.0.1:"+etcdClient,
		"--listen-peer-urls", "http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls", "http://127.0.0.1:"+etcdPeer,
		"--initial-cluster", "kubetest=http://127.0.0.1:"+etcdPeer,
		"--unsafe-no-fsync", "--logger", "zap", "--log-level", "error"); err != nil {
		return nil, err
	}
	s.procs = append(s.procs, ep)

	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	saPub, saKey, err := serviceAccountKey()
	if err != nil {
		return nil, err
	}
	var tokens strings.Builder
	addUser := func(u User) {
		tok := randomHex(24)
		s.tokens[u.Name] = tok
		fmt.Fprintf(&tokens, "%s,%s,%s,\"%s\"\n", tok, u.Name, u.Name, strings.Join(u.Groups, ","))
	}
	addUser(User{Name: AdminUser, Groups: []string{"system:masters"}})
	for _, u := range opts.Users {
		if _, dup := s.tokens[u.Name]; dup || strings.ContainsAny(u.Name, ",\"\n") {
			return nil, fmt.Errorf("kubetest: bad or duplicate user %q", u.Name)
		}
		addUser(u)
	}
	files := map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "sa.pub": saPub, "sa.key": saKey, "tokens.csv": []byte(tokens.String())}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	s.CAData = certPEM

	port := freePort()
	s.URL = "https://127.0.0.1:" + port
	args := []string{
		"--etcd-servers", "http://127.0.0.1:" + etcdClient,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", port,
		"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-private-key-file", filepath.Join(dir, "tls.key"),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--anonymous-auth=false",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--allow-privileged=true",
		"--profiling=false",
		"--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type", "none",
		"--v", "1",
	}
	ap := &proc{name: "kube-apiserver", log: filepath.Join(dir, "kube-apiserver.log")}
	if err := ap.start(apiserver, append(args, opts.ExtraArgs...)...); err != nil {
		return nil, err
	}
	s.procs = append(s.procs, ap)

	s.Config = s.UserConfig(AdminUser)
	// The limit only bounds a broken start (2 busy cores: be generous).
	if err := s.waitReady(ap, ep, 3*time.Minute); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// waitReady polls /readyz (which includes the RBAC bootstrap roles).
func (s *Server) waitReady(ap, ep *proc, limit time.Duration) error {
	rt, err := rest.TransportFor(s.Config)
	if err != nil {
		return err
	}
	c := &http.Client{Transport: rt, Timeout: 5 * time.Second}
	deadline := time.Now().Add(limit)
	var last string
	for {
		for _, p := range []*proc{ap, ep} {
			if p.exited() {
				return fmt.Errorf("%s exited: %s", p.name, p.tail())
			}
		}
		resp, err := c.Get(s.URL + "/readyz")
		if err == nil {
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body.String())
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %s: %s; log: %s", limit, last, ap.tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Token returns user's bearer token.
func (s *Server) Token(user string) string {
	tok, ok := s.tokens[user]
	if !ok {
		panic("kubetest: unknown user " + user)
	}
	return tok
}

// UserConfig returns a rest.Config that authenticates as user.
func (s *Server) UserConfig(user string) *rest.Config {
	return s.TokenConfig(s.Token(user))
}

// TokenConfig returns a rest.Config with bearer token tok.
func (s *Server) TokenConfig(tok string) *rest.Config {
	return &rest.Config{Host: s.URL, BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAData: s.CAData},
		QPS: 200, Burst: 400, Timeout: 30 * time.Second}
}

// Client is an admin clientset.
func (s *Server) Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Kubeconfig writes a kubeconfig file for user (with namespace as its
// context's namespace, if not empty) into the test's temp dir and returns
// its path: what a node agent run as a process on the host is given.
func (s *Server) Kubeconfig(t testing.TB, user, namespace string) string {
	t.Helper()
	return s.TokenKubeconfig(t, s.Token(user), namespace)
}

// TokenKubeconfig is Kubeconfig for a bearer token (a service account's,
// from ServiceAccountToken).
func (s *Server) TokenKubeconfig(t testing.TB, tok, namespace string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := WriteKubeconfig(path, s.URL, s.CAData, tok, namespace); err != nil {
		t.Fatal(err)
	}
	return path
}

// Namespace creates namespace name (if missing).
func (s *Server) Namespace(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.Client(t).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
}

// ServiceAccountToken creates service account namespace/name (and its
// namespace) if missing and returns a token for it from the TokenRequest
// API, signed with the server's service-account key: the identity a pod of
// the chart would have.
func (s *Server) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	s.Namespace(t, namespace)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := s.Client(t)
	_, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create service account %s/%s: %v", namespace, name, err)
	}
	exp := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: token for service account %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// WriteKubeconfig writes a kubeconfig with one cluster (server, CA), one
// bearer-token user and one current context (with namespace, if set).
func WriteKubeconfig(path, server string, caPEM []byte, token, namespace string) error {
	// JSON is YAML: quoting by %q keeps every value a plain string.
	ns := ""
	if namespace != "" {
		ns = fmt.Sprintf(", %q: %q", "namespace", namespace)
	}
	body := fmt.Sprintf(`{"apiVersion": "v1", "kind": "Config",
"clusters": [{"name": "kubetest", "cluster": {"server": %q, "certificate-authority-data": %q}}],
"users": [{"name": "kubetest", "user": {"token": %q}}],
"contexts": [{"name": "kubetest", "context": {"cluster": "kubetest", "user": "kubetest"%s}}],
"current-context": "kubetest"}
`, server, base64.StdEncoding.EncodeToString(caPEM), token, ns)
	return os.WriteFile(path, []byte(body), 0o600)
}

// Log returns the tail of kube-apiserver's log (for a failing test).
func (s *Server) Log() string {
	for _, p := range s.procs {
		if p.name == "kube-apiserver" {
			return p.tail()
		}
	}
	return ""
}

func (s *Server) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].stop()
	}
	s.procs = nil
	if s.Dir != "" {
		_ = os.RemoveAll(s.Dir)
		s.Dir = ""
	}
}

// proc is one process of the control plane.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
	once      sync.Once
}

func (p *proc) start(bin string, args ...string) error {
	f, err := os.Create(p.log)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Pdeathsig follows the thread that started the process: keep it.
	runtime.LockOSThread()
	err = p.cmd.Start()
	runtime.UnlockOSThread()
	f.Close()
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.done = make(chan struct{})
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	return nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stop() {
	p.once.Do(func() {
		if p.cmd == nil || p.cmd.Process == nil {
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// selfSigned makes the server's certificate, for 127.0.0.1 and localhost.
func selfSigned() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "kubetest"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// serviceAccountKey makes the key that signs service-account tokens.
func serviceAccountKey() (pubPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	pb, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	if len(kb) == 0 || len(pb) == 0 {
		return nil, nil, errors.New("kubetest: empty key")
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pb}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}
