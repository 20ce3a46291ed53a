//go:build !unix

package main

// lockDataDir does nothing where flock(2) is missing.
func lockDataDir(string) (func(), error) { return func() {}, nil }
