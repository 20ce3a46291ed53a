package gateway_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/gateway"
)

func writeSecrets(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestSecretsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets")
	writeSecrets(t, path, "# comment\n\nGLOBAL=g-value\r\nSHARED=for-all\nalice/SHARED=alice's=own\nalice/ONLY=a\n")
	f, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant, name, want string
		ok                 bool
	}{
		{"bob", "GLOBAL", "g-value", true},
		{"bob", "SHARED", "for-all", true},
		{"alice", "SHARED", "alice's=own", true},
		{"alice", "ONLY", "a", true},
		{"bob", "ONLY", "", false},
		{"alice", "MISSING", "", false},
	} {
		if v, ok := f.Lookup(c.tenant, c.name); v != c.want || ok != c.ok {
			t.Errorf("Lookup(%s, %s) = %q, %v; want %q, %v", c.tenant, c.name, v, ok, c.want, c.ok)
		}
	}
	if f.Count() != 4 {
		t.Errorf("Count = %d", f.Count())
	}

	// Bad files are refused with the line, never the value; a reload
	// that fails keeps what was loaded.
	for _, bad := range []string{"NO_EQUALS_SIGN_s3cr3t\n", "1BAD=s3cr3t\n", "/X=s3cr3t\n", "A-B=s3cr3t\n", "A=s3cr3t\nA=s3cr3t\n"} {
		writeSecrets(t, path, bad)
		err := f.Reload()
		if err == nil {
			t.Errorf("%q: loaded", bad)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: the error shows the value: %v", bad, err)
		}
		if v, _ := f.Lookup("bob", "GLOBAL"); v != "g-value" {
			t.Errorf("a failed reload dropped the secrets")
		}
	}
	writeSecrets(t, path, "GLOBAL=rotated\n")
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.Lookup("bob", "GLOBAL"); v != "rotated" {
		t.Errorf("after a reload GLOBAL = %q", v)
	}
	if _, ok := f.Lookup("alice", "ONLY"); ok {
		t.Error("a secret removed from the file survived the reload")
	}
	if _, err := gateway.OpenSecrets(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing secrets file opened")
	}
}

// A secret may be pinned to hosts (NAME@host,host=value); the old lines
// keep working beside it.
func TestSecretsFilePins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets")
	writeSecrets(t, path, "PLAIN=p\nGH@api.github.com, uploads.github.com:443=tok=en@x\nalice/GH@*.alice.test=alices\nalice/OWN=o\n"+
		// JWT tenants are jwt:<sub>, and a subject is often an e-mail.
		"jwt:carol@example.com/OWN=c\njwt:carol@example.com/GH@api.github.com=carols\n")
	f, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant, name, value string
		pins                []string // nil: not pinned
	}{
		{"bob", "PLAIN", "p", nil},
		{"bob", "GH", "tok=en@x", []string{"api.github.com", "uploads.github.com:443"}},
		{"alice", "GH", "alices", []string{"*.alice.test"}},
		{"alice", "OWN", "o", nil},
		{"jwt:carol@example.com", "OWN", "c", nil},
		{"jwt:carol@example.com", "GH", "carols", []string{"api.github.com"}},
	} {
		if v, ok := f.Lookup(c.tenant, c.name); !ok || v != c.value {
			t.Errorf("Lookup(%s, %s) = %q, %v; want %q", c.tenant, c.name, v, ok, c.value)
		}
		pins, pinned := f.Pins(c.tenant, c.name)
		if pinned != (c.pins != nil) || strings.Join(pins.Patterns(), " ") != strings.Join(c.pins, " ") {
			t.Errorf("Pins(%s, %s) = %v, %v; want %v", c.tenant, c.name, pins.Patterns(), pinned, c.pins)
		}
	}
	if _, pinned := f.Pins("bob", "MISSING"); pinned {
		t.Error("an undefined secret is pinned")
	}
	for _, bad := range []string{"GH@=s3cr3t\n", "GH@http://x/=s3cr3t\n", "GH@a b=s3cr3t\n", "@h=s3cr3t\n"} {
		writeSecrets(t, path, bad)
		err := f.Reload()
		if err == nil {
			t.Errorf("%q: loaded", bad)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: %v; want the line, never the value", bad, err)
		}
	}
}

// An ssh-key secret (NAME@host:22=ssh-key:/path or ssh-key:base64:...)
// is a key the agent signs with: pinned, never a value, and its errors
// never show the key.
func TestSecretsFileSSHKeys(t *testing.T) {
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "deploy")
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(block)
	keyFile := filepath.Join(dir, "deploy")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	enc, err := ssh.MarshalPrivateKeyWithPassphrase(priv, "deploy", []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	encFile := filepath.Join(dir, "encrypted")
	if err := os.WriteFile(encFile, pem.EncodeToMemory(enc), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "secrets")
	writeSecrets(t, path, "DEPLOY@git.test:22=ssh-key:"+keyFile+"\nalice/INLINE@git.test:22,*.git.test:22=ssh-key:base64:"+
		base64.StdEncoding.EncodeToString(keyPEM)+"\nTOKEN@api.test=tok\n")
	f, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	want := string(ssh.MarshalAuthorizedKey(mustSigner(t, priv).PublicKey()))
	for _, c := range []struct{ tenant, name string }{{"bob", "DEPLOY"}, {"alice", "INLINE"}} {
		k, ok := f.SSHKey(c.tenant, c.name)
		if !ok || string(ssh.MarshalAuthorizedKey(k.PublicKey())) != want {
			t.Errorf("SSHKey(%s, %s): %v", c.tenant, c.name, ok)
		}
		if v, ok := f.Lookup(c.tenant, c.name); !ok || v != "" {
			t.Errorf("Lookup(%s, %s) = %q, %v: an ssh-key's value is never looked up", c.tenant, c.name, v, ok)
		}
		if _, pinned := f.Pins(c.tenant, c.name); !pinned {
			t.Errorf("%s is not pinned", c.name)
		}
	}
	if _, ok := f.SSHKey("bob", "TOKEN"); ok {
		t.Error("a token is an ssh-key")
	}
	secret := base64.StdEncoding.EncodeToString(keyPEM)
	for _, c := range []struct{ line, want string }{
		{"DEPLOY=ssh-key:" + keyFile, "pin it to the hosts"},
		{"DEPLOY@git.test:22=ssh-key:relative/key", "absolute path"},
		{"DEPLOY@git.test:22=ssh-key:" + filepath.Join(dir, "missing"), "no such file"},
		{"DEPLOY@git.test:22=ssh-key:" + encFile, "passphrase-protected"},
		{"DEPLOY@git.test:22=ssh-key:base64:%%%" + secret, "not valid base64"},
		{"DEPLOY@git.test:22=ssh-key:base64:" + base64.StdEncoding.EncodeToString([]byte("not a key "+secret)), "not an SSH private key"},
	} {
		writeSecrets(t, path, c.line+"\n")
		err := f.Reload()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%.60q: %v; want %q", c.line, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), secret[20:60]) {
			t.Errorf("%.60q: the error shows the key", c.line)
		}
	}
}

// A line that is no NAME=value but holds "=" (a key file's base64 pasted
// into the secrets file, its padding) is refused without the error
// showing what stands before the "=".
func TestSecretsFileBadNameHidden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets")
	material := "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ+AAAAAAAABAAAAMwAAAAtzc2gtZWQyNTUxOQ"
	for _, line := range []string{material + "==", "alice/" + material + "=x", material + "@git.test:22=ssh-key:base64:AAAA"} {
		writeSecrets(t, path, "OK=1\n"+line+"\n")
		_, err := gateway.OpenSecrets(path)
		if err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%.40q: %v, want an error naming line 2", line, err)
			continue
		}
		if strings.Contains(err.Error(), material[10:40]) {
			t.Errorf("%.40q: the error shows the line: %v", line, err)
		}
	}
}

func mustSigner(t *testing.T, priv ed25519.PrivateKey) ssh.Signer {
	t.Helper()
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
