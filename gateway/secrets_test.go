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
