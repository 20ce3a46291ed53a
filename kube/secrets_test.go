package kube

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sandgate/sandgate/gateway"
)

// TestSecretOverlay: values read from Kubernetes are the tenant's own,
// over the operator's file, and never pinned; the file's keep their pins.
func TestSecretOverlay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(path, []byte("SHARED=op\nPINNED@api.example.com=pin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	o := NewSecretOverlay(f)
	o.Set("team-a", "SHARED", "mine")
	o.Set("team-a", "GH", "k8s")
	for _, c := range []struct{ tenant, name, want string }{
		{"team-a", "SHARED", "mine"}, {"team-b", "SHARED", "op"}, {"team-a", "GH", "k8s"}, {"team-b", "GH", ""},
	} {
		if v, _ := o.Lookup(c.tenant, c.name); v != c.want {
			t.Errorf("Lookup(%s, %s) = %q, want %q", c.tenant, c.name, v, c.want)
		}
	}
	if _, pinned := o.Pins("team-b", "PINNED"); !pinned {
		t.Error("the operator's pin is lost")
	}
	if _, pinned := o.Pins("team-a", "GH"); pinned {
		t.Error("a Kubernetes value is pinned")
	}
	if v, ok := NewSecretOverlay(nil).Lookup("t", "X"); ok || v != "" {
		t.Error("an empty overlay found a value")
	}
}

func TestReasonOf(t *testing.T) {
	for in, want := range map[string]string{"quota_exceeded": "QuotaExceeded", "unknown_image": "UnknownImage", "": "Failed"} {
		if got := reasonOf(in); got != want {
			t.Errorf("reasonOf(%q) = %q, want %q", in, got, want)
		}
	}
	if clampTTL(5) != gateway.MinTTL || clampTTL(1e9) != gateway.MaxTTL || clampTTL(600) != 600 {
		t.Error("clampTTL")
	}
}
