// Package dataplane runs a session's REST data plane in the gateway
// process: one-shot and streamed commands and persistent named shells
// (commands.go, shells.go), file access through an SFTP server started in
// the sandbox (files.go, fetch.go), background processes with their
// output kept for reattaching clients (processes.go, output.go), and
// persistent Python kernels driven by an embedded script (kernel.go,
// kernel.py). Every process starts
// through the session's Start, as SSH's do, with the same confinement;
// its gateway.StartOptions say whether it resumes a stopped session and
// whether the history lists it. package rest serves it over HTTP.
package dataplane
