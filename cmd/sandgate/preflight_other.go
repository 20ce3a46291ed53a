//go:build !linux

package main

// checkLinuxPrivileges: the linux driver exists on Linux only (openDriver
// says so); there is nothing to check here.
func checkLinuxPrivileges(bool) error { return nil }

const preflightCmd = "sandbox-preflight"

func preflightMain([]string) int { return 0 }

// hostMemory: the linux driver alone has a warm pool.
func hostMemory() uint64 { return 0 }
