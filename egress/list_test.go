package egress

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    []string // canonical entries
		wantBad []string // bad entries named in the error
	}{
		{name: "hosts", in: []string{"PyPI.org", "files.pythonhosted.org.", "github.com:22"}, want: []string{"pypi.org", "files.pythonhosted.org", "github.com:22"}},
		{name: "wildcard", in: []string{"*.PythonHosted.org"}, want: []string{"*.pythonhosted.org"}},
		{name: "ips", in: []string{"10.0.0.5", "[2001:DB8::1]", "[2001:db8::1]:8443", "2001:db8::2", "1.2.3.4:80", "::ffff:1.2.3.4"}, want: []string{"10.0.0.5", "[2001:db8::1]", "[2001:db8::1]:8443", "[2001:db8::2]", "1.2.3.4:80", "1.2.3.4"}},
		{name: "duplicates dropped", in: []string{"a.com", "A.com.", "a.com:443"}, want: []string{"a.com", "a.com:443"}},
		{name: "empty list", in: nil, want: []string{}},
		{
			name: "every bad entry named",
			in: []string{
				"*", "http://a.com", "a.com/path", "user@a.com", "a..com", "-a.com", "a-.com", "a_b.com",
				"a.com:0", "a.com:65536", "a.com:x", "", "*.", "a.*.com", "x*.com", "[::1", "[1.2.3.4]",
				strings.Repeat("a", 64) + ".com", strings.Repeat("abcdefghi.", 26) + "com", "1.2.3", "fe80::1%eth0",
				"a.com:+80", "a b.com", "ünï.com", "good.com",
			},
			wantBad: []string{
				"*", "http://a.com", "a.com/path", "user@a.com", "a..com", "-a.com", "a-.com", "a_b.com",
				"a.com:0", "a.com:65536", "a.com:x", "", "*.", "a.*.com", "x*.com", "[::1", "[1.2.3.4]",
				strings.Repeat("a", 64) + ".com", strings.Repeat("abcdefghi.", 26) + "com", "1.2.3", "fe80::1%eth0",
				"a.com:+80", "a b.com", "ünï.com",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := ParseList(tt.in)
			if tt.wantBad != nil {
				var le *ListError
				if !errors.As(err, &le) {
					t.Fatalf("error %v, want *ListError", err)
				}
				var got []string
				for _, b := range le.Entries {
					got = append(got, b.Entry)
					if b.Reason == "" {
						t.Errorf("entry %q has no reason", b.Entry)
					}
				}
				if !slices.Equal(got, tt.wantBad) {
					t.Errorf("bad entries %q, want %q", got, tt.wantBad)
				}
				if msg := le.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, `"a_b.com"`) {
					t.Errorf("error message %q: want one line naming the entries", msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Entries(); !slices.Equal(got, tt.want) {
				t.Errorf("entries %q, want %q", got, tt.want)
			}
			if l.Empty() != (len(tt.want) == 0) {
				t.Errorf("Empty() = %v", l.Empty())
			}
		})
	}
}

func TestListAllows(t *testing.T) {
	l, err := ParseList([]string{"pypi.org", "*.pythonhosted.org", "git.example:22", "10.0.0.5", "[2001:db8::1]:8443"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host string
		port uint16
		want bool
	}{
		{"pypi.org", 443, true},
		{"pypi.org", 80, true},
		{"PYPI.org.", 443, true},
		{"pypi.org", 8080, false},
		{"pypi.org", 0, false},
		{"www.pypi.org", 443, false},
		{"files.pythonhosted.org", 443, true},
		{"a.b.pythonhosted.org", 80, true},
		{"pythonhosted.org", 443, false},
		{"evilpythonhosted.org", 443, false},
		{"git.example", 22, true},
		{"git.example", 443, false},
		{"10.0.0.5", 443, true},
		{"::ffff:10.0.0.5", 443, true},
		{"10.0.0.5", 22, false},
		{"10.0.0.6", 443, false},
		{"2001:db8::1", 8443, true},
		{"[2001:db8::1]", 8443, true},
		{"2001:db8::1", 443, false},
		{"evil.com", 443, false},
		{"", 443, false},
		{"pypi.org/x", 443, false},
	}
	for _, tt := range tests {
		if got := l.Allows(tt.host, tt.port); got != tt.want {
			t.Errorf("Allows(%q, %d) = %v, want %v", tt.host, tt.port, got, tt.want)
		}
	}
	var zero List
	if !zero.Empty() || zero.Allows("pypi.org", 443) {
		t.Error("the zero List allows something")
	}
}

func TestParseBounds(t *testing.T) {
	b, err := ParseBounds([]string{"*", "*:443", "*.COM", "a.com:22", "10.0.0.5", "[::1]:80"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"*", "*:443", "*.com", "a.com:22", "10.0.0.5", "[::1]:80"}
	if got := b.Patterns(); !slices.Equal(got, want) {
		t.Errorf("patterns %q, want %q", got, want)
	}
	_, err = ParseBounds([]string{"http://x", "*.", "ok.com", "a.com:0"})
	var le *ListError
	if !errors.As(err, &le) || len(le.Entries) != 3 {
		t.Fatalf("error %v: want a *ListError naming 3 patterns", err)
	}
}

func TestOutside(t *testing.T) {
	tests := []struct {
		name     string
		bounds   []string
		entries  []string
		outside  []string
		noBounds bool
	}{
		{name: "star allows all", bounds: []string{"*"}, entries: []string{"pypi.org", "*.a.com", "10.0.0.5", "[2001:db8::1]:22", "x.com:8080"}},
		{name: "wildcard inside wider wildcard", bounds: []string{"*.com"}, entries: []string{"*.a.com", "x.a.com", "a.com:9999", "b.org:9999"}, outside: []string{"b.org:9999"}},
		{name: "wildcard inside same wildcard", bounds: []string{"*.a.com"}, entries: []string{"*.a.com", "*.b.a.com", "*.com"}, outside: []string{"*.com"}},
		{name: "wildcard not inside a host", bounds: []string{"x.a.com"}, entries: []string{"*.a.com", "x.a.com"}, outside: []string{"*.a.com"}},
		{name: "apex not inside its wildcard", bounds: []string{"*.a.com"}, entries: []string{"a.com"}, outside: []string{"a.com"}},
		{name: "default ports need both", bounds: []string{"pypi.org:443"}, entries: []string{"pypi.org", "pypi.org:443"}, outside: []string{"pypi.org"}},
		{name: "default ports from two patterns", bounds: []string{"pypi.org:443", "pypi.org:80"}, entries: []string{"pypi.org"}},
		{name: "default ports from host and wildcard", bounds: []string{"*.org:443", "pypi.org:80"}, entries: []string{"pypi.org"}},
		{name: "pattern without port allows any", bounds: []string{"pypi.org"}, entries: []string{"pypi.org", "pypi.org:8443"}},
		{name: "star with port", bounds: []string{"*:443"}, entries: []string{"a.com:443", "a.com", "10.0.0.5:443"}, outside: []string{"a.com"}},
		{name: "ips", bounds: []string{"10.0.0.5", "[2001:db8::1]:443"}, entries: []string{"10.0.0.5:22", "10.0.0.6", "[2001:db8::1]:443", "[2001:db8::1]"}, outside: []string{"10.0.0.6", "[2001:db8::1]"}},
		{name: "ips not inside wildcards", bounds: []string{"*.com"}, entries: []string{"10.0.0.5"}, outside: []string{"10.0.0.5"}},
		{name: "empty bounds", noBounds: true, entries: []string{"a.com"}, outside: []string{"a.com"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Bounds
			if !tt.noBounds {
				var err error
				if b, err = ParseBounds(tt.bounds); err != nil {
					t.Fatal(err)
				}
			}
			l, err := ParseList(tt.entries)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.Outside(l); !slices.Equal(got, tt.outside) {
				t.Errorf("Outside = %q, want %q", got, tt.outside)
			}
		})
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.a.com:8080", "[2001:db8::1]:443", "10.0.0.5", "*", "a..b", "x:0", "[::ffff:1.2.3.4]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseList([]string{s})
		if err != nil {
			var le *ListError
			if !errors.As(err, &le) || len(le.Entries) != 1 || le.Entries[0].Entry != s {
				t.Fatalf("ParseList(%q): error %v does not name the entry", s, err)
			}
			return
		}
		entries := l.Entries()
		if len(entries) != 1 {
			t.Fatalf("ParseList(%q) = %q", s, entries)
		}
		c := entries[0]
		if c != strings.ToLower(c) {
			t.Fatalf("canonical %q is not lowercase", c)
		}
		again, err := ParseList(entries)
		if err != nil {
			t.Fatalf("canonical %q does not parse: %v", c, err)
		}
		if got := again.Entries(); !slices.Equal(got, entries) {
			t.Fatalf("canonical form not stable: %q -> %q", entries, got)
		}
		b, err := ParseBounds(entries)
		if err != nil {
			t.Fatalf("canonical entry %q is not a valid pattern: %v", c, err)
		}
		if out := b.Outside(l); out != nil {
			t.Fatalf("%q is outside itself as a pattern", c)
		}
		e := l.entries[0]
		host := e.hostString()
		if e.kind == kindWildcard {
			host = "x." + e.name
		}
		port := e.port
		if port == 0 {
			port = 443
		}
		if !l.Allows(host, port) {
			t.Fatalf("%q does not allow %s port %d", c, host, port)
		}
	})
}
