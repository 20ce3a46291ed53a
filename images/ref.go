package images

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// dockerHub is the registry name sandgate shows and stores for Docker Hub;
// go-containerregistry spells it index.docker.io.
const dockerHub = "docker.io"

// Normalize returns ref in the form sandgate stores and shows, as Docker
// normalises it: a registry host, the repository, and a tag (":latest" when
// none is given) or a digest. Docker Hub is "docker.io" and its official
// images live under "library/":
//
//	python:3.12-slim           -> docker.io/library/python:3.12-slim
//	acme/tool                  -> docker.io/acme/tool:latest
//	ghcr.io/acme/tool:v1       -> ghcr.io/acme/tool:v1
//	localhost:5000/x@sha256:…  -> localhost:5000/x@sha256:…
//
// A reference with both a tag and a digest keeps the digest only.
func Normalize(ref string) (string, error) {
	r, err := parseRef(ref, false)
	if err != nil {
		return "", err
	}
	return refString(r), nil
}

// parseRef parses a user's reference; insecure lets the puller fall back to
// plain HTTP for its registry.
func parseRef(ref string, insecure bool) (name.Reference, error) {
	if ref == "" || len(ref) > 1024 || strings.TrimSpace(ref) != ref {
		return nil, fmt.Errorf("invalid image reference %q", ref)
	}
	opts := []name.Option{name.WeakValidation}
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return r, nil
}

// registryName is the registry of r as sandgate shows it.
func registryName(r name.Reference) string {
	reg := r.Context().RegistryStr()
	if reg == name.DefaultRegistry {
		return dockerHub
	}
	return reg
}

// refString is the normalised form of a parsed reference.
func refString(r name.Reference) string {
	repo := registryName(r) + "/" + r.Context().RepositoryStr()
	switch v := r.(type) {
	case name.Digest:
		return repo + "@" + v.DigestStr()
	case name.Tag:
		return repo + ":" + v.TagStr()
	}
	return repo + ":" + r.Identifier()
}

// repoOf is the part of a normalised name before its tag or digest.
func repoOf(normalized string) string {
	if i := strings.LastIndex(normalized, "@"); i >= 0 {
		return normalized[:i]
	}
	slash := strings.LastIndex(normalized, "/")
	if i := strings.LastIndex(normalized, ":"); i > slash {
		return normalized[:i]
	}
	return normalized
}

// Allowed reports whether the image name matches one of patterns. name is
// normalised first; a name that does not parse matches nothing.
//
// A pattern is one of:
//
//   - "*": any image.
//   - an exact reference, normalised like name: "python:3.12" matches
//     docker.io/library/python:3.12 only, and "python" matches
//     docker.io/library/python:latest only.
//   - a prefix ending in "*", matched against the normalised name as text
//     after the prefix is normalised the way Docker splits a name: a first
//     path component with a "." or ":" or equal to "localhost" is a
//     registry ("ghcr.io/acme/*", "localhost:5000/*"); anything else is on
//     Docker Hub ("acme/*" is docker.io/acme/*), and a Docker Hub prefix
//     without a "/" is an official image ("python:*" is
//     docker.io/library/python:*, "py*" is docker.io/library/py*).
//     "docker.io/*" is all of Docker Hub; "index.docker.io/" is read as
//     "docker.io/".
//   - "REPO:*" (a prefix ending in ":*") also matches REPO by digest
//     (REPO@sha256:…), so it means every version of REPO.
//
// Other glob syntax ("?", "[", a "*" that is not last) is not supported:
// CheckPattern refuses it.
func Allowed(name string, patterns []string) bool {
	n, err := Normalize(name)
	if err != nil {
		return false
	}
	for _, p := range patterns {
		if matchPattern(n, p) {
			return true
		}
	}
	return false
}

// CheckPattern reports whether p is a pattern Allowed understands, so a
// gateway can refuse a bad flag at start rather than match nothing.
func CheckPattern(p string) error {
	if p == "*" {
		return nil
	}
	prefix, isPrefix := strings.CutSuffix(p, "*")
	if strings.ContainsAny(prefix, "*?[]") {
		return fmt.Errorf("image pattern %q: only a single trailing * is supported", p)
	}
	if prefix == "" || strings.TrimSpace(p) != p || strings.ContainsAny(p, " \t\n") {
		return fmt.Errorf("image pattern %q: empty or contains spaces", p)
	}
	if isPrefix {
		return nil
	}
	if _, err := Normalize(p); err != nil {
		return fmt.Errorf("image pattern %q: %w", p, err)
	}
	return nil
}

func matchPattern(normalized, p string) bool {
	if p == "*" {
		return true
	}
	prefix, isPrefix := strings.CutSuffix(p, "*")
	if !isPrefix {
		n, err := Normalize(p)
		return err == nil && n == normalized
	}
	if CheckPattern(p) != nil {
		return false
	}
	prefix = normalizePrefix(prefix)
	if strings.HasPrefix(normalized, prefix) {
		return true
	}
	if repo, ok := strings.CutSuffix(prefix, ":"); ok {
		return strings.HasPrefix(normalized, repo+"@")
	}
	return false
}

// normalizePrefix applies Docker's domain split to the text of a prefix
// pattern (see Allowed).
func normalizePrefix(prefix string) string {
	first, rest, hasSlash := strings.Cut(prefix, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		if first == name.DefaultRegistry || first == dockerHub {
			return dockerHub + "/" + officialPrefix(rest)
		}
		return prefix
	}
	return dockerHub + "/" + officialPrefix(prefix)
}

// officialPrefix puts a Docker Hub repository prefix without a namespace
// under library/.
func officialPrefix(repo string) string {
	if repo == "" || strings.Contains(repo, "/") {
		return repo
	}
	return "library/" + repo
}

// PatternRegistry is the registry every image that pattern p allows comes
// from, spelled as the puller dials it ("index.docker.io" for Docker Hub,
// "ghcr.io", "localhost:5000"), or "" when p allows images of several
// registries ("*") or is not a pattern. A gateway trusts the registries
// its operator named this way.
func PatternRegistry(p string) string {
	if p == "*" || CheckPattern(p) != nil {
		return ""
	}
	prefix, isPrefix := strings.CutSuffix(p, "*")
	if !isPrefix {
		r, err := parseRef(p, false)
		if err != nil {
			return ""
		}
		return r.Context().RegistryStr()
	}
	first, _, ok := strings.Cut(normalizePrefix(prefix), "/")
	if !ok {
		return ""
	}
	if first == dockerHub {
		return name.DefaultRegistry
	}
	return first
}
