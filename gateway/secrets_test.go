package gateway_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
