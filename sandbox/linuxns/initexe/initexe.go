// Package initexe holds the small sandbox init binary that make build
// embeds in sandgate (cmd/sandgate-init: `sandbox-init` and `sftp-server`
// only), and hands it to the linux driver as a sealed memfd to exec.
//
// Why a second binary: a Go program runs every linked package's init()
// before main, and sandgate links the whole gateway. Exec'ing it as a
// sandbox's init cost about 20 ms of package inits and runtime start, and
// left about 27 MB RSS (6.5 MiB PSS) per idle sandbox; the small binary
// starts in about 1 ms and holds a fraction of that. It is built from the
// same sources in the same make invocation (go build -overlay puts it in
// blob/ for the gateway's build only), so it cannot be stale; a build
// without it (go install) falls back to the gateway's own binary.
package initexe

import "embed"

// name is the small init's file in blob (see blob/README.md).
const name = "blob/sandgate-init"

//go:embed blob
var blob embed.FS

// Bytes returns the embedded small init, or nil when this binary was built
// without it.
func Bytes() []byte {
	b, err := blob.ReadFile(name)
	if err != nil || len(b) == 0 {
		return nil
	}
	return b
}
