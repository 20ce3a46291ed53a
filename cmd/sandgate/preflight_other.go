//go:build !linux

package main

// checkLinuxPrivileges: the linux driver exists on Linux only (openDriver
// says so); there is nothing to check here.
func checkLinuxPrivileges(bool) error { return nil }

const preflightCmd = "sandbox-preflight"

func preflightMain([]string) int { return 0 }
