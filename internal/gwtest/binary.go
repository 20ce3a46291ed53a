package gwtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/readyfile"
)

// Binary is a `sandgate serve` process started by StartBinary.
type Binary struct {
	// URL is the gateway's address, as it wrote it to ReadyFile.
	URL       string
	ReadyFile string
	Cmd       *exec.Cmd
	// Stdout and Stderr are everything the process wrote so far.
	Stdout, Stderr *Buffer
	// Done is closed once the process has exited and been waited for;
	// Cmd.ProcessState is set then.
	Done <-chan struct{}
}

// binaryStartTimeout bounds how long StartBinary waits for the ready file
// (the linux driver re-adopts or reaps sandboxes before it listens).
const binaryStartTimeout = 60 * time.Second

// StartBinary runs `bin args...`, where args are "serve" and its flags,
// with --ready-file added, and returns once the gateway has written its URL
// there; pass --listen 127.0.0.1:0 for a free port. The child's environment is the test's without SANDGATE_*
// and SANDBOX_* variables, which would change flags or point clients
// elsewhere. If the process still runs when the test ends it is killed
// (SIGKILL); tests that want a clean stop send SIGTERM themselves, in a
// cleanup registered after this call.
func StartBinary(t testing.TB, bin string, args ...string) *Binary {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("StartBinary runs sandgate serve; got args %q", args)
	}
	ready := filepath.Join(t.TempDir(), "ready")
	full := append(slices.Clip(args), "--ready-file", ready)
	b := &Binary{ReadyFile: ready, Cmd: exec.Command(bin, full...), Stdout: &Buffer{}, Stderr: &Buffer{}}
	b.Cmd.Env = CleanEnv()
	b.Cmd.Stdout, b.Cmd.Stderr = b.Stdout, b.Stderr
	if err := b.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	b.Done = done
	go func() {
		defer close(done)
		_ = b.Cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = b.Cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), binaryStartTimeout)
	defer cancel()
	url, err := readyfile.Wait(ctx, ready, done)
	if err != nil {
		t.Fatalf("sandgate serve did not get ready: %v\nstderr:\n%s", err, b.Stderr.String())
	}
	b.URL = url
	return b
}

// CleanEnv is the environment for child processes of a test: the test's
// own, minus SANDGATE_* (flags' twins) and SANDBOX_* (client settings).
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SANDBOX_") || strings.HasPrefix(kv, "SANDGATE_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
