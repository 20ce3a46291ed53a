package sshd

import (
	"net"
	"slices"
	"testing"
)

// TestConnEnv: SSH_CLIENT and SSH_CONNECTION in OpenSSH's format for each
// kind of address a connection may have, or none.
func TestConnEnv(t *testing.T) {
	var typedNil *net.TCPAddr
	tests := []struct {
		name          string
		remote, local net.Addr
		want          []string
	}{
		{"ipv4", &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 50123}, &net.TCPAddr{IP: net.ParseIP("198.51.100.1"), Port: 8443},
			[]string{"SSH_CLIENT=192.0.2.7 50123 8443", "SSH_CONNECTION=192.0.2.7 50123 198.51.100.1 8443"}},
		{"ipv6", &net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 1}, &net.TCPAddr{IP: net.ParseIP("::1"), Port: 443, Zone: "lo"},
			[]string{"SSH_CLIENT=2001:db8::7 1 443", "SSH_CONNECTION=2001:db8::7 1 ::1 443"}},
		{"ipv4-mapped", &net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 2}, &net.TCPAddr{IP: net.ParseIP("::ffff:127.0.0.1"), Port: 3},
			[]string{"SSH_CLIENT=10.1.2.3 2 3", "SSH_CONNECTION=10.1.2.3 2 127.0.0.1 3"}},
		{"not ip", &net.UnixAddr{Name: "@x", Net: "unix"}, nil,
			[]string{"SSH_CLIENT=UNKNOWN 65535 65535", "SSH_CONNECTION=UNKNOWN 65535 UNKNOWN 65535"}},
		{"typed nil", typedNil, &net.TCPAddr{}, // no IP either
			[]string{"SSH_CLIENT=UNKNOWN 65535 65535", "SSH_CONNECTION=UNKNOWN 65535 UNKNOWN 65535"}},
	}
	for _, tt := range tests {
		if got := connEnv(tt.remote, tt.local); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}
