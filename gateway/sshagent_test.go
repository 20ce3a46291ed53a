package gateway

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/egress"
)

// serveTestAgent serves a session agent with no keys on a Unix socket of
// a temporary directory, with the bounds given, and answers its path.
func serveTestAgent(t *testing.T, idle, io time.Duration) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sgagent") // short: a socket path is at most 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	a := &sessionAgent{s: &Session{}, idle: idle, io: io}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.serve(ln)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return path
}

// hungUp reports whether the agent closes c within the time given
// (rather than waiting for more from it).
func hungUp(t *testing.T, c net.Conn, within time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err == io.EOF || err != nil
}

// A request's length over maxAgentRequest ends the connection at once,
// before its bytes arrive (the agent library would have allocated it, up
// to 16 MiB per connection, and waited); one within it is served.
func TestAgentRequestBound(t *testing.T) {
	path := serveTestAgent(t, time.Minute, time.Minute)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], 16<<20-1)
	if _, err := c.Write(n[:]); err != nil {
		t.Fatal(err)
	}
	if !hungUp(t, c, 20*time.Second) {
		t.Error("the agent waits for a 16 MiB request")
	}

	// Within the bound: ssh-add -l's request is answered.
	c2, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	keys, err := agent.NewClient(c2).List()
	if err != nil || len(keys) != 0 {
		t.Fatalf("list: %v %v", keys, err)
	}
}

// A connection that sends part of a request, or nothing, is closed once
// its bound passes: a sandbox process cannot hold the agent's
// connections (16 a session) open forever.
func TestAgentSlowClient(t *testing.T) {
	path := serveTestAgent(t, 300*time.Millisecond, 300*time.Millisecond)
	for _, part := range [][]byte{nil, {0}, {0, 0, 0, 9, 11}} {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		if len(part) > 0 {
			if _, err := c.Write(part); err != nil {
				t.Fatal(err)
			}
		}
		if !hungUp(t, c, 30*time.Second) {
			t.Errorf("the agent holds a connection that sent %v", part)
		}
		c.Close()
	}
}

// loginData is what an SSH client signs to log in with pub (RFC 4252
// section 7), host-bound when hostKey is not nil.
func loginData(method string, pub ssh.PublicKey, hostKey []byte) []byte {
	str := func(b []byte, s []byte) []byte {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		return append(b, s...)
	}
	var b []byte
	b = str(b, make([]byte, 32))
	b = append(b, 50)
	b = str(b, []byte("git"))
	b = str(b, []byte("ssh-connection"))
	b = str(b, []byte(method))
	b = append(b, 1)
	b = str(b, []byte(pub.Type()))
	b = str(b, pub.Marshal())
	if hostKey != nil {
		b = str(b, hostKey)
	}
	return b
}

// The agent signs SSH logins with its key and nothing else.
func TestSSHLogin(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ssh.NewSignerFromKey(otherPriv)
	pub, blob := signer.PublicKey(), signer.PublicKey().Marshal()
	cert := &ssh.Certificate{Key: pub, CertType: ssh.UserCert, ValidPrincipals: []string{"git"}, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, other); err != nil {
		t.Fatal(err)
	}
	login := loginData(loginPublicKey, pub, nil)
	for _, c := range []struct {
		name string
		data []byte
		want bool
	}{
		{"publickey", login, true},
		{"host-bound", loginData(loginHostBound, pub, other.PublicKey().Marshal()), true},
		{"certificate", loginData(loginPublicKey, cert, nil), true},
		{"another key", loginData(loginPublicKey, other.PublicKey(), nil), false},
		{"trailing bytes", append(login[:len(login):len(login)], 0), false},
		{"truncated", login[:len(login)-1], false},
		{"host-bound without the host key", loginData(loginHostBound, pub, nil), false},
		{"another method", loginData("hostbased", pub, nil), false},
		{"SSHSIG", append([]byte("SSHSIG"), login...), false},
		{"empty", nil, false},
	} {
		if got := sshLogin(c.data, blob); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A sandbox asking for signatures in a loop gets its refusals recorded
// at the agent's pace, not one audit event (and log line) each; the
// next one recorded says how many were left out.
func TestAgentAuditPaced(t *testing.T) {
	dir := t.TempDir()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "deploy")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "secrets")
	line := "DEPLOY@git.test:22=ssh-key:base64:" + base64.StdEncoding.EncodeToString(pem.EncodeToMemory(block)) + "\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets, err := OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	log, err := audit.OpenFile(audit.FileConfig{Path: filepath.Join(dir, "audit.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	p, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ps := p.NewSession("acme", "s1", egress.Policy{}, nil)
	defer ps.Close()
	s := &Session{ID: "s1", Tenant: "acme", Secrets: []SecretRef{{Name: "DEPLOY", Hosts: []string{"git.test:22"}}}, secrets: secrets}
	a := &sessionAgent{m: &Manager{cfg: Config{Audit: log}, log: slog.New(slog.DiscardHandler)}, s: s, ps: ps}
	signer, _ := ssh.NewSignerFromKey(priv)
	const asked = 200
	for range asked {
		if _, err := a.Sign(signer.PublicKey(), loginData(loginPublicKey, signer.PublicKey(), nil)); err == nil {
			t.Fatal("signed with no connection open")
		}
	}
	time.Sleep(time.Second) // the pace lets the next one through
	if _, err := a.Sign(signer.PublicKey(), loginData(loginPublicKey, signer.PublicKey(), nil)); err == nil {
		t.Fatal("signed with no connection open")
	}
	page, err := log.Query(audit.Filter{Tenant: "acme", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(page.Events); n == 0 || n > agentAuditBurst+20 {
		t.Fatalf("%d refusals recorded for %d asked, want at most about %d", n, asked+1, agentAuditBurst)
	}
	if newest := page.Events[0]; newest.Result != "refused" || !strings.Contains(newest.Reason, "more agent events not recorded") {
		t.Errorf("the newest event: %+v, want it to count those left out", newest)
	}
}
