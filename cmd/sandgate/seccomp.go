package main

import "github.com/sandgate/sandgate/sandbox"

// seccompReporter is a driver whose sandboxes run under a seccomp filter
// (linuxns).
type seccompReporter interface{ Seccomp() map[string]any }

// seccompStatus describes driver d's seccomp filter, for the start-up log
// and /readyz: the linux driver's, or that d has none.
func seccompStatus(d sandbox.Driver) map[string]any {
	if r, ok := d.(seccompReporter); ok {
		return r.Seccomp()
	}
	return map[string]any{
		"enabled": false,
		"reason":  "the " + d.Name() + " driver has no seccomp filter: its commands run as the gateway's user, with the host's whole system call surface",
	}
}
