package sshd_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sshd"
)

// TestOnlySHA2Algorithms: the server offers OpenSSH 9.x's default key
// exchanges, MACs and host key signatures, SHA-2 only: a client that
// insists on a SHA-1 one fails the handshake, and one with the defaults
// gets in.
func TestOnlySHA2Algorithms(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, sshd.Config{HostSigners: []gossh.Signer{signer}}, newFakeSandbox())
	base := func() *gossh.ClientConfig {
		return &gossh.ClientConfig{User: "sandbox", HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
	}
	for _, c := range []struct {
		name string
		set  func(*gossh.ClientConfig)
	}{
		{"diffie-hellman-group14-sha1", func(c *gossh.ClientConfig) { c.KeyExchanges = []string{gossh.InsecureKeyExchangeDH14SHA1} }},
		{"diffie-hellman-group1-sha1", func(c *gossh.ClientConfig) { c.KeyExchanges = []string{gossh.InsecureKeyExchangeDH1SHA1} }},
		{"diffie-hellman-group-exchange-sha1", func(c *gossh.ClientConfig) { c.KeyExchanges = []string{gossh.InsecureKeyExchangeDHGEXSHA1} }},
		{"ssh-rsa host key (SHA-1)", func(c *gossh.ClientConfig) { c.HostKeyAlgorithms = []string{gossh.KeyAlgoRSA} }},
		{"hmac-sha1 with aes128-ctr", func(c *gossh.ClientConfig) {
			c.Ciphers, c.MACs = []string{"aes128-ctr"}, []string{gossh.HMACSHA1}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base()
			c.set(cfg)
			if cl, err := h.dialWith(t, cfg); err == nil {
				cl.Close()
				t.Fatalf("the handshake succeeded with only %s", c.name)
			}
		})
	}
	for _, c := range []struct {
		name string
		set  func(*gossh.ClientConfig)
	}{
		{"defaults", func(*gossh.ClientConfig) {}},
		{"rsa-sha2-512 host key", func(c *gossh.ClientConfig) { c.HostKeyAlgorithms = []string{gossh.KeyAlgoRSASHA512} }},
		{"rsa-sha2-256 host key", func(c *gossh.ClientConfig) { c.HostKeyAlgorithms = []string{gossh.KeyAlgoRSASHA256} }},
		{"curve25519-sha256", func(c *gossh.ClientConfig) { c.KeyExchanges = []string{gossh.KeyExchangeCurve25519} }},
		{"diffie-hellman-group16-sha512", func(c *gossh.ClientConfig) { c.KeyExchanges = []string{gossh.KeyExchangeDH16SHA512} }},
		{"diffie-hellman-group-exchange-sha256", func(c *gossh.ClientConfig) { c.KeyExchanges = []string{gossh.KeyExchangeDHGEXSHA256} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base()
			c.set(cfg)
			cl, err := h.dialWith(t, cfg)
			if err != nil {
				t.Fatalf("handshake with %s: %v", c.name, err)
			}
			cl.Close()
		})
	}
}

// TestMaxStartupsBoundsTunnelsInAuth: past the bound, a new tunnel is
// dropped before any SSH byte; once the one in authentication goes, a
// new one gets in.
func TestMaxStartupsBoundsTunnelsInAuth(t *testing.T) {
	h := newHarness(t, sshd.Config{MaxStartups: sshd.Startups{Start: 1, Rate: 100, Full: 1}}, newFakeSandbox())
	silent, peer := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.srv.ServeConn(peer, h.sess)
	}()
	// The silent tunnel's server side writes its version line first.
	buf := make([]byte, 64)
	if _, err := silent.Read(buf); err != nil {
		t.Fatal(err)
	}
	cfg := &gossh.ClientConfig{User: "sandbox", HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second}
	if c, err := h.dialWith(t, cfg); err == nil {
		c.Close()
		t.Fatal("a second tunnel got in while one was in authentication, with MaxStartups 1")
	}
	silent.Close()
	<-served
	c, err := h.dialWith(t, cfg)
	if err != nil {
		t.Fatalf("after the first tunnel went: %v", err)
	}
	c.Close()
	if !strings.Contains(h.log.String(), "ssh_max_startups") {
		t.Errorf("no warning logged:\n%s", h.log.String())
	}
}

// The handshake deadline counts from the CONNECT (AdmitTunnel), not from
// the first SSH byte: a tunnel admitted longer ago than the deadline gets
// no handshake, however fast its client is then.
func TestHandshakeDeadlineCountsFromConnect(t *testing.T) {
	h := newHarness(t, sshd.Config{HandshakeTimeout: 300 * time.Millisecond}, newFakeSandbox())
	ctx, release, err := h.srv.AdmitTunnel(context.Background(), gateway.Principal{Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	time.Sleep(600 * time.Millisecond) // between the CONNECT and the hand-off
	srvEnd, cliEnd := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.srv.ServeConnContext(ctx, srvEnd, h.sess)
	}()
	defer func() { cliEnd.Close(); <-served }()
	cfg := &gossh.ClientConfig{User: "sandbox", HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
	if cc, _, _, err := gossh.NewClientConn(newAsyncWriteConn(cliEnd), "pipe", cfg); err == nil {
		cc.Close()
		t.Fatal("a handshake succeeded past the deadline counted from the CONNECT")
	}
}

// A principal past its budget is refused at the CONNECT with 429, and
// the global bound with 503; a released place is free again.
func TestAdmitTunnel(t *testing.T) {
	h := newHarness(t, sshd.Config{MaxStartups: sshd.Startups{Start: 3, Rate: 100, Full: 3}, MaxStartupsPerPrincipal: 2}, newFakeSandbox())
	a, b := gateway.Principal{Tenant: "a"}, gateway.Principal{Tenant: "b"}
	var releases []func()
	for _, p := range []gateway.Principal{a, a, b} {
		_, release, err := h.srv.AdmitTunnel(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	for _, c := range []struct {
		p    gateway.Principal
		kind gateway.Kind
		code string
	}{{a, gateway.KindQuota, "too_many_ssh_startups"}, {b, gateway.KindUnavailable, "ssh_startups_full"}} {
		_, _, err := h.srv.AdmitTunnel(context.Background(), c.p)
		ge, _ := gateway.AsError(err)
		if ge == nil || ge.Kind != c.kind || ge.Code != c.code {
			t.Errorf("%s: %v, want %s", c.p.Tenant, err, c.code)
		}
	}
	releases[0]()
	releases[0]()
	if _, release, err := h.srv.AdmitTunnel(context.Background(), a); err != nil {
		t.Errorf("after a release: %v", err)
	} else {
		release()
	}
}

// A burst of drops is logged as its first drop at once, then as the true
// count of the rest at the end of the window, with no later drop needed.
func TestStartupWarningsCountTheBurst(t *testing.T) {
	h := newHarness(t, sshd.Config{MaxStartups: sshd.Startups{Start: 1, Rate: 100, Full: 1}, MaxStartupsPerPrincipal: 2,
		WarnEvery: 200 * time.Millisecond}, newFakeSandbox())
	_, release, err := h.srv.AdmitTunnel(context.Background(), gateway.Principal{Tenant: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for range 248 {
		if _, _, err := h.srv.AdmitTunnel(context.Background(), gateway.Principal{Tenant: "b"}); err == nil {
			t.Fatal("admitted past the bound")
		}
	}
	re := regexp.MustCompile(`msg=ssh_max_startups dropped=(\d+)`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		total := 0
		for _, m := range re.FindAllStringSubmatch(h.log.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			total += n
		}
		if total == 248 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log counts %d drops, want 248:\n%s", total, h.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
