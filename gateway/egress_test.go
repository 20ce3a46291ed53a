package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// egressConfig is a real egress proxy that may reach loopback, bounded by
// patterns.
func egressConfig(t *testing.T, patterns ...string) *gateway.EgressConfig {
	t.Helper()
	p, err := egress.New(egress.Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Hosts: map[string][]netip.Addr{"up.test": {netip.MustParseAddr("127.0.0.1")}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := egress.ParseBounds(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return &gateway.EgressConfig{Proxy: p, Bounds: b}
}

// output runs command in s's sandbox, as SSH would, and returns its stdout.
func output(t *testing.T, s *gateway.Session, command string) string {
	t.Helper()
	p, err := s.Sandbox().Start(context.Background(), sandbox.Cmd{Command: command})
	if err != nil {
		t.Fatal(err)
	}
	p.Stdin().Close()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	out, _ := io.ReadAll(p.Stdout())
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestManagerSecrets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets")
	writeSecrets(t, path, "TOKEN=first-value\nalice/MINE=alice-only\n")
	secrets, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := newManager(t, gateway.Config{Secrets: secrets, Egress: egressConfig(t, "*")})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{Secrets: []gateway.SecretRef{{Name: "TOKEN"}, {Name: "MINE"}}})
	if got := output(t, s, "printenv TOKEN MINE"); got != "first-value\nalice-only\n" {
		t.Errorf("secrets in the environment: %q", got)
	}
	// Values are looked up when a process starts: a reload applies at once.
	writeSecrets(t, path, "TOKEN=rotated\nalice/MINE=alice-only\n")
	if err := secrets.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := output(t, s, "printenv TOKEN"); got != "rotated\n" {
		t.Errorf("after a reload: %q", got)
	}
	b, _ := json.Marshal(s.Snapshot())
	if bytes.Contains(b, []byte("rotated")) || bytes.Contains(b, []byte("alice-only")) || !bytes.Contains(b, []byte(`"secrets":["TOKEN","MINE"]`)) {
		t.Errorf("the session's record: %s", b)
	}

	for _, c := range []struct {
		p    gateway.Principal
		refs []gateway.SecretRef
		code string
		msg  string
	}{
		{bob, []gateway.SecretRef{{Name: "MINE"}, {Name: "NOPE"}}, "unknown_secret", "MINE, NOPE"},
		{alice, []gateway.SecretRef{{Name: "TOKEN"}, {Name: "TOKEN"}}, "invalid_secret", "twice"},
		{alice, []gateway.SecretRef{{Name: "BAD-NAME"}}, "invalid_secret", "BAD-NAME"},
		{alice, []gateway.SecretRef{{Name: "TOKEN", Header: "X-Api-Key"}}, "invalid_secret", "no hosts"},
		{alice, []gateway.SecretRef{{Name: "TOKEN", Hosts: []string{"up.test"}}}, "egress_not_allowed", "up.test"},
		{alice, []gateway.SecretRef{{Name: "TOKEN", Hosts: []string{"up.test"}, Header: "Host"}}, "invalid_secret", "Host"},
		{alice, []gateway.SecretRef{{Name: "TOKEN", Hosts: []string{"up.test"}, Format: "Bearer"}}, "invalid_secret", "{value}"},
	} {
		cp := gateway.CreateParams{Secrets: c.refs}
		if c.code == "invalid_secret" && len(c.refs[0].Hosts) > 0 {
			cp.Egress = []string{"up.test"}
		}
		_, _, err := m.Create(context.Background(), c.p, cp)
		wantCode(t, err, gateway.KindInvalid, c.code)
		if err != nil && !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v: %v, want the message to name %q", c.refs, err, c.msg)
		}
	}
	// A secret bound to hosts needs a trust store the workdir driver
	// cannot give.
	_, _, err = m.Create(context.Background(), alice, gateway.CreateParams{Egress: []string{"up.test"},
		Secrets: []gateway.SecretRef{{Name: "TOKEN", Hosts: []string{"up.test"}}}})
	wantCode(t, err, gateway.KindInvalid, "egress_unsupported")
}

// A secret the operator pinned to hosts is only ever bound to (some of)
// them: an unbound request for it, or a binding to other hosts, is
// refused with secret_pinned, and a reload that pins a secret keeps it
// out of the environment of a session that asked for it unbound before.
func TestManagerPinnedSecrets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets")
	writeSecrets(t, path, "GH@up.test:443,api.up.test=gh-value\nFREE=free-value\n")
	secrets, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := newManager(t, gateway.Config{Secrets: secrets, Egress: egressConfig(t, "*")})
	for _, c := range []struct {
		name   string
		egress []string
		ref    gateway.SecretRef
		code   string
		msg    string
	}{
		{"unbound", nil, gateway.SecretRef{Name: "GH"}, "secret_pinned", `pinned by the operator to "up.test:443", "api.up.test"`},
		{"bound elsewhere", []string{"evil.test"}, gateway.SecretRef{Name: "GH", Hosts: []string{"evil.test"}}, "secret_pinned", `outside them: "evil.test"`},
		{"bound to a wider pattern", []string{"*.up.test"}, gateway.SecretRef{Name: "GH", Hosts: []string{"*.up.test"}}, "secret_pinned", `"*.up.test"`},
		{"bound to a pinned host on another port", []string{"up.test:8443"}, gateway.SecretRef{Name: "GH", Hosts: []string{"up.test:8443"}}, "secret_pinned", `"up.test:8443"`},
		// Within the pins the request passes; the workdir driver then
		// cannot give a trust store.
		{"bound within the pins", []string{"up.test:443", "api.up.test"}, gateway.SecretRef{Name: "GH", Hosts: []string{"up.test:443", "api.up.test"}}, "egress_unsupported", ""},
	} {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{Egress: c.egress, Secrets: []gateway.SecretRef{c.ref}})
		wantCode(t, err, gateway.KindInvalid, c.code)
		if err != nil && (!strings.Contains(err.Error(), c.msg) || strings.Contains(err.Error(), "gh-value")) {
			t.Errorf("%s: %v, want the message to name %q (and never the value)", c.name, err, c.msg)
		}
	}
	// Pinned by a reload: out of the environment from the next process on.
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{Secrets: []gateway.SecretRef{{Name: "FREE"}}})
	if got := output(t, s, "printenv FREE"); got != "free-value\n" {
		t.Fatalf("before the pin: %q", got)
	}
	writeSecrets(t, path, "GH@up.test:443=gh-value\nFREE@up.test=free-value\n")
	if err := secrets.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := output(t, s, "printenv FREE; true"); got != "" {
		t.Errorf("a secret pinned since is still in the environment: %q", got)
	}
}

func TestSecretRefJSON(t *testing.T) {
	in := `["A",{"name":"B","hosts":["api.example.com"],"header":"X-Key","format":"{value}"}]`
	var refs []gateway.SecretRef
	if err := json.Unmarshal([]byte(in), &refs); err != nil {
		t.Fatal(err)
	}
	if len(refs) != 2 || refs[0].Name != "A" || refs[0].Bound() || !refs[1].Bound() || refs[1].Header != "X-Key" {
		t.Fatalf("%+v", refs)
	}
	out, _ := json.Marshal(refs)
	if string(out) != in {
		t.Errorf("round trip: %s", out)
	}
	if err := json.Unmarshal([]byte(`[{"name":"A","value":"x"}]`), &refs); err == nil {
		t.Error("an unknown field in a secret was accepted")
	}
}

func TestManagerEgress(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream\n") }))
	defer up.Close()
	port := up.Listener.Addr().(interface{ String() string }).String()
	port = port[strings.LastIndexByte(port, ':'):]
	m, _ := newManager(t, gateway.Config{Egress: egressConfig(t, "*.test", "pypi.org:443")})
	ctx := context.Background()

	for _, c := range []struct {
		egress []string
		code   string
		msg    string
	}{
		{[]string{"pypi.org", "up.test", "evil.net"}, "egress_not_allowed", `"pypi.org", "evil.net"`},
		{[]string{"http://up.test/x"}, "invalid_egress", "http://up.test/x"},
	} {
		_, _, err := m.Create(ctx, alice, gateway.CreateParams{Egress: c.egress})
		wantCode(t, err, gateway.KindInvalid, c.code)
		if err != nil && !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v: %v, want it to name %s", c.egress, err, c.msg)
		}
	}

	// No egress: no proxy, nothing in the environment.
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if s.ProxyAddr() != "" || output(t, s, "printenv HTTP_PROXY; true") != "" {
		t.Fatal("a session without egress has a proxy")
	}
	// Turned on by an update: the next process gets the proxy.
	if _, err := m.Update(ctx, alice, s.ID, gateway.UpdateParams{Egress: &[]string{"up.test" + port}}); err != nil {
		t.Fatal(err)
	}
	proxy := output(t, s, "printenv HTTP_PROXY")
	if !strings.HasPrefix(proxy, "http://127.0.0.1:") {
		t.Fatalf("HTTP_PROXY after the update: %q", proxy)
	}
	pu, _ := url.Parse(strings.TrimSpace(proxy))
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	get := func() int {
		resp, err := client.Get("http://up.test" + port + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != http.StatusOK {
		t.Errorf("through the proxy: %d", code)
	}
	if v := s.Snapshot().Egress; v == nil || v.BytesIn == 0 || len(v.Allow) != 1 {
		t.Errorf("egress view: %+v", v)
	}
	// Turned off: the proxy stays and refuses.
	if _, err := m.Update(ctx, alice, s.ID, gateway.UpdateParams{Egress: &[]string{}}); err != nil {
		t.Fatal(err)
	}
	if code := get(); code != http.StatusForbidden {
		t.Errorf("after the egress list was emptied: %d", code)
	}
	// An update outside the bounds changes nothing.
	_, err := m.Update(ctx, alice, s.ID, gateway.UpdateParams{Egress: &[]string{"evil.net"}})
	wantCode(t, err, gateway.KindInvalid, "egress_not_allowed")
	if got := s.EgressAllow(); len(got) != 0 {
		t.Errorf("a refused update changed the list: %v", got)
	}
	// The idempotency fingerprint covers egress.
	cp := gateway.CreateParams{IdempotencyKey: "k1", Egress: []string{"up.test"}}
	mustCreate(t, m, alice, cp)
	cp.Egress = []string{"other.test"}
	_, _, err = m.Create(ctx, alice, cp)
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
	// Deleting the session closes its proxy.
	if err := m.Delete(ctx, alice, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get("http://up.test" + port + "/"); err == nil {
		t.Error("the proxy of a deleted session still answers")
	}
}

// Rules per request ask for the egress CA; on a driver with no trust
// store (workdir) the session is made without it, its rules read on plain
// http:// only.
func TestManagerRulesWithoutTrust(t *testing.T) {
	m, _ := newManager(t, gateway.Config{Egress: egressConfig(t, "*.test")})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{Egress: []string{`{"host":"up.test","port":80,"paths":["/x"]}`}})
	if got := output(t, s, "printenv SSL_CERT_FILE; true"); got != "" {
		t.Errorf("SSL_CERT_FILE = %q on a driver with no trust store", got)
	}
	if s.ProxyAddr() == "" {
		t.Error("no proxy")
	}
}
