package main

import (
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// --ready-file holds the URL, one line, while the gateway runs, and is
// gone after a clean exit.
func TestReadyFile(t *testing.T) {
	b := gwtest.StartBinary(t, sandgateBin, "serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--sandbox", "workdir", "--api-key", "k", "--keep-sandboxes-on-exit=false")
	data, err := os.ReadFile(b.ReadyFile)
	if err != nil || string(data) != b.URL+"\n" {
		t.Fatalf("ready file = %q, %v; want %q and a newline", data, err, b.URL)
	}
	resp, err := http.Get(b.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	_ = b.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.Done:
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	if _, err := os.Stat(b.ReadyFile); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ready file after exit: %v", err)
	}
}

func TestReadyFileFlagAndEnv(t *testing.T) {
	t.Setenv("SANDGATE_READY_FILE", "/run/from-env")
	c, err := parseServe(nil, io.Discard)
	if err != nil || c.readyFile != "/run/from-env" {
		t.Fatalf("from the environment: %q, %v", c.readyFile, err)
	}
	c, err = parseServe([]string{"--ready-file", "/run/from-flag"}, io.Discard)
	if err != nil || c.readyFile != "/run/from-flag" {
		t.Fatalf("the flag over the environment: %q, %v", c.readyFile, err)
	}
}
