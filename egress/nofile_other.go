//go:build !unix

package egress

// nofileLimit is the process's descriptor limit; 0: unknown.
func nofileLimit() uint64 { return 0 }
