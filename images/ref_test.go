package images

import (
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	dig := "sha256:" + strings.Repeat("ab", 32)
	for in, want := range map[string]string{
		"python:3.12-slim":                     "docker.io/library/python:3.12-slim",
		"python":                               "docker.io/library/python:latest",
		"library/python:3":                     "docker.io/library/python:3",
		"docker.io/python:3":                   "docker.io/library/python:3",
		"index.docker.io/library/python:3":     "docker.io/library/python:3",
		"acme/tool":                            "docker.io/acme/tool:latest",
		"ghcr.io/acme/tool:v1":                 "ghcr.io/acme/tool:v1",
		"localhost:5000/x":                     "localhost:5000/x:latest",
		"127.0.0.1:5000/a/b/c:t":               "127.0.0.1:5000/a/b/c:t",
		"python@" + dig:                        "docker.io/library/python@" + dig,
		"python:3.12@" + dig:                   "docker.io/library/python@" + dig,
		"registry.example.com/team/img@" + dig: "registry.example.com/team/img@" + dig,
	} {
		got, err := Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Python:3", "python:", "a b", "python@sha256:short", " python", "python::3"} {
		if got, err := Normalize(in); err == nil {
			t.Errorf("Normalize(%q) = %q, want an error", in, got)
		}
	}
}

func TestAllowed(t *testing.T) {
	dig := "sha256:" + strings.Repeat("cd", 32)
	cases := []struct {
		name     string
		patterns []string
		want     bool
	}{
		{"python:3.12", []string{"*"}, true},
		{"python:3.12", nil, false},
		{"python:3.12", []string{"python:3.12"}, true},
		{"docker.io/library/python:3.12", []string{"python:3.12"}, true},
		{"python:3.12", []string{"python"}, false}, // python is python:latest
		{"python", []string{"python"}, true},
		{"python:3.12", []string{"docker.io/library/*"}, true},
		{"python:3.12", []string{"library/*"}, true},
		{"acme/tool:1", []string{"docker.io/library/*"}, false},
		{"acme/tool:1", []string{"acme/*"}, true},
		{"acme/tool:1", []string{"docker.io/*"}, true},
		{"acme/tool:1", []string{"index.docker.io/acme/*"}, true},
		{"ghcr.io/acme/tool:1", []string{"ghcr.io/acme/*"}, true},
		{"ghcr.io/acmeevil/tool:1", []string{"ghcr.io/acme/*"}, false},
		{"ghcr.io/other/tool:1", []string{"ghcr.io/acme/*"}, false},
		{"python:3.12", []string{"python:*"}, true},
		{"python@" + dig, []string{"python:*"}, true},
		{"pythonista:1", []string{"python:*"}, false},
		{"python:3.12", []string{"py*"}, true},
		{"localhost:5000/x:1", []string{"localhost:5000/*"}, true},
		{"localhost:5000/x:1", []string{"localhost:5001/*"}, false},
		{"ghcr.io/acme/tool:1", []string{"docker.io/*"}, false},
		{"python:3.12", []string{"bad[pattern*"}, false},
		{"Bad:ref", []string{"*"}, false},
	}
	for _, tc := range cases {
		if got := Allowed(tc.name, tc.patterns); got != tc.want {
			t.Errorf("Allowed(%q, %q) = %v, want %v", tc.name, tc.patterns, got, tc.want)
		}
	}
}

func TestCheckPattern(t *testing.T) {
	for _, p := range []string{"*", "python", "python:3", "python:*", "ghcr.io/acme/*", "docker.io/library/*"} {
		if err := CheckPattern(p); err != nil {
			t.Errorf("CheckPattern(%q): %v", p, err)
		}
	}
	for _, p := range []string{"", "**", "py*thon", "a?", "Python:3", "ghcr.io/*/x", " python"} {
		if err := CheckPattern(p); err == nil {
			t.Errorf("CheckPattern(%q) accepted", p)
		}
	}
}

func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"python:3.12-slim", "ghcr.io/a/b@sha256:" + strings.Repeat("0", 64), "localhost:5000/x", "a/b/c:d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		n, err := Normalize(ref)
		if err != nil {
			return
		}
		// A normalised name is a fixed point and matches itself.
		if n2, err := Normalize(n); err != nil || n2 != n {
			t.Fatalf("Normalize(%q) = %q, but Normalize(%q) = %q, %v", ref, n, n, n2, err)
		}
		if !Allowed(ref, []string{n}) {
			t.Fatalf("%q does not match its own normalised form %q", ref, n)
		}
	})
}

func TestPatternRegistry(t *testing.T) {
	for p, want := range map[string]string{
		"*":                      "",
		"python:3.12":            "index.docker.io",
		"docker.io/library/*":    "index.docker.io",
		"acme/*":                 "index.docker.io",
		"py*":                    "index.docker.io",
		"ghcr.io/acme/*":         "ghcr.io",
		"127.0.0.1:5000/*":       "127.0.0.1:5000",
		"localhost:5000/x:1":     "localhost:5000",
		"registry.example.com/*": "registry.example.com",
		"bad?*":                  "",
	} {
		if got := PatternRegistry(p); got != want {
			t.Errorf("PatternRegistry(%q) = %q, want %q", p, got, want)
		}
	}
}
