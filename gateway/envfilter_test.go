package gateway_test

import (
	"testing"

	"github.com/sandgate/sandgate/gateway"
)

func TestEnvAllowed(t *testing.T) {
	allow := []string{"MY_*", "EXACT"}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"TERM", true}, {"LANG", true}, {"LC_ALL", true}, {"MY_VAR", true}, {"MY_", true},
		{"EXACT", true}, {"EXACTLY", false}, {"PATH", false}, {"LD_PRELOAD", false}, {"", false},
	} {
		if got := gateway.EnvAllowed(tc.name, allow); got != tc.want {
			t.Errorf("EnvAllowed(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
