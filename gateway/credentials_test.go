package gateway

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestGeneratedCredentials(t *testing.T) {
	cases := []struct {
		name  string
		gen   func() string
		check func(string) bool
	}{
		{"api key", NewAPIKey, func(k string) bool {
			raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, "sg_"))
			return strings.HasPrefix(k, "sg_") && err == nil && len(raw) == 32
		}},
		{"session id", newID, func(id string) bool {
			_, err := idEncoding.DecodeString(strings.TrimPrefix(id, "sbx-"))
			return strings.HasPrefix(id, "sbx-") && len(id) == 24 && err == nil
		}},
		{"ssh password", newPassword, func(pw string) bool { return len(pw) == 39 && !strings.Contains(pw, "=") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 100 {
				v := c.gen()
				if !c.check(v) {
					t.Fatalf("malformed: %q", v)
				}
				if seen[v] {
					t.Fatalf("repeated: %q", v)
				}
				seen[v] = true
			}
		})
	}
}
