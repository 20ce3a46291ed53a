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
	o.Set("k8s-one", map[string]string{"SHARED": "mine", "GH": "k8s-one"})
	o.Set("k8s-two", map[string]string{"GH": "k8s-two"})
	one, two, none := o.Scoped("k8s-one"), o.Scoped("k8s-two"), o.Scoped("k8s-gone")
	for _, c := range []struct {
		src          gateway.SecretSource
		tenant, name string
		want         string
	}{
		{one, "team-a", "SHARED", "mine"}, {two, "team-a", "SHARED", "op"}, {one, "team-a", "GH", "k8s-one"},
		// Two sessions of one tenant naming one secret each see their own.
		{two, "team-a", "GH", "k8s-two"},
		// Nothing else sees a session's values: not another session, not
		// the tenant's REST creates (the unscoped overlay).
		{none, "team-a", "GH", ""}, {o, "team-a", "GH", ""}, {o, "team-a", "SHARED", "op"},
	} {
		if v, _ := c.src.Lookup(c.tenant, c.name); v != c.want {
			t.Errorf("%v.Lookup(%s, %s) = %q, want %q", c.src, c.tenant, c.name, v, c.want)
		}
	}
	// A scope not loaded (a restarted gateway, before its controller read
	// the Secrets again) answers nothing: the operator's value of a name
	// never stands in for the session's, and the session says so.
	if v, ok := none.Lookup("team-a", "SHARED"); ok || v != "" {
		t.Errorf("an unloaded scope fell back to the operator's value: %q", v)
	}
	if none.(gateway.SecretsLoaded).Loaded() || !one.(gateway.SecretsLoaded).Loaded() || o.Has("k8s-gone") {
		t.Error("Loaded/Has")
	}
	if _, pinned := two.(gateway.SecretPins).Pins("team-b", "PINNED"); !pinned {
		t.Error("the operator's pin is lost")
	}
	if _, pinned := one.(gateway.SecretPins).Pins("team-a", "GH"); pinned {
		t.Error("a Kubernetes value is pinned")
	}
	o.Drop("k8s-one")
	if v, ok := one.Lookup("team-a", "GH"); ok || v != "" || o.Len() != 1 {
		t.Errorf("after Drop: %q %v, %d scopes", v, ok, o.Len())
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
