package rest

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

// TestClientIP: X-Forwarded-For counts only from a trusted proxy, and
// then its rightmost hop outside the trusted ranges; a hop that is not an
// address stops the walk at the last trusted one.
func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, c := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"192.0.2.1:5000", []string{"198.51.100.1"}, "192.0.2.1"},
		{"10.0.0.1:5000", nil, "10.0.0.1"},
		{"10.0.0.1:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"10.0.0.1:5000", []string{"203.0.113.9, 198.51.100.1, 10.1.1.1"}, "198.51.100.1"},
		{"10.0.0.1:5000", []string{"203.0.113.9", "198.51.100.1"}, "198.51.100.1"},
		{"10.0.0.1:5000", []string{"10.2.2.2, 10.3.3.3"}, "10.2.2.2"},
		{"10.0.0.1:5000", []string{"203.0.113.9, junk, 10.3.3.3"}, "10.3.3.3"},
		{"[::ffff:10.0.0.1]:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"[fd00::1]:5000", []string{"2001:db8::1"}, clientIPv6("2001:db8::1")},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := clientIP(r, trusted); got != c.want {
			t.Errorf("clientIP(%s, %q) = %q, want %q", c.remote, c.xff, got, c.want)
		}
	}
}

// clientIPv6 is how an IPv6 client is keyed (its /64).
func clientIPv6(ip string) string {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[" + ip + "]:1"
	return clientIP(r, nil)
}
