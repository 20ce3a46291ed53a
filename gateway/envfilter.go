package gateway

import "strings"

// EnvAllowed reports whether a client may set the environment variable
// name, over SSH (env requests) or REST (a command's env): TERM, LANG and
// LC_* always, and the names allow lists, each an exact NAME or a
// PREFIX* (serve --ssh-env-allow).
func EnvAllowed(name string, allow []string) bool {
	if name == "TERM" || name == "LANG" || strings.HasPrefix(name, "LC_") {
		return true
	}
	for _, a := range allow {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(name, p) {
				return true
			}
		} else if a == name {
			return true
		}
	}
	return false
}
