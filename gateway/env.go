package gateway

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Bounds of a session's own environment (CreateParams.Env).
const (
	// MaxEnvVars is how many variables a session may set.
	MaxEnvVars = 64
	// MaxEnvBytes bounds the names and values together.
	MaxEnvBytes = 32 << 10
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are the variables the gateway sets itself (the egress proxy,
// the trust store, the SSH agent's socket): a session's env may not set them.
func reservedEnv(name string) bool {
	switch strings.ToUpper(name) {
	case "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", AgentEnv:
		return true
	}
	return slices.Contains(caEnv, name)
}

// checkEnv checks a session's environment variables (secrets are the
// session's: their names are the gateway's to set).
func checkEnv(env map[string]string, secrets []SecretRef) error {
	if len(env) > MaxEnvVars {
		return Invalid("invalid_env", fmt.Sprintf("at most %d environment variables, got %d", MaxEnvVars, len(env)))
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !envName.MatchString(k) {
			return Invalid("invalid_env", fmt.Sprintf("environment variable name %q: want letters, digits and _, not starting with a digit", k))
		}
		if slices.ContainsFunc(secrets, func(r SecretRef) bool { return r.Name == k }) {
			return Invalid("invalid_env", fmt.Sprintf("environment variable %s is one of the session's secrets", k))
		}
		if reservedEnv(k) {
			return Invalid("invalid_env", fmt.Sprintf("environment variable %s is the gateway's own (egress proxy, trust store)", k))
		}
		if strings.ContainsRune(env[k], 0) {
			return Invalid("invalid_env", fmt.Sprintf("environment variable %s: the value holds a NUL byte", k))
		}
		size += len(k) + len(env[k])
	}
	if size > MaxEnvBytes {
		return Invalid("invalid_env", fmt.Sprintf("environment variables: %d bytes, at most %d", size, MaxEnvBytes))
	}
	return nil
}

// sortedEnv renders env as NAME=value lines, by name.
func sortedEnv(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}
