package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Every package the small init links runs its init() in every sandbox's
// start, and its heap stays in every idle sandbox (sandbox/linuxns/initexe):
// the init links the sandbox side and the SFTP server, and outside the
// standard library only these. A new one is a choice to make here, with
// GODEBUG=inittrace=1 sandgate-init sandbox-init showing what it costs.
var allowed = []string{
	"github.com/sandgate/sandgate/cmd/sandgate-init",
	"github.com/sandgate/sandgate/sandbox",
	"github.com/sandgate/sandgate/sandbox/linuxns/initd",
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl",
	"github.com/sandgate/sandgate/internal/procio",
	"github.com/sandgate/sandgate/sftpd",
	"golang.org/x/sys/unix",
	// Not the seccomp library: the gateway assembles the filter's program
	// (sandbox/linuxns/seccompprog), the init only loads it.
}

func TestSmallInitLinksLittle(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(cmd.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for p := range strings.FieldsSeq(string(out)) {
		if !slices.Contains(allowed, p) {
			t.Errorf("the small sandbox init links %s: every sandbox would run its init() and keep its heap", p)
		}
	}
}
