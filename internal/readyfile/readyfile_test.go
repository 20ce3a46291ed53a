package readyfile_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/readyfile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWriteThenWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ready")
	got := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		url, err := readyfile.Wait(context.Background(), path, nil)
		got <- url
		errc <- err
	}()
	time.Sleep(30 * time.Millisecond)
	if err := readyfile.Write(path, "http://127.0.0.1:1234"); err != nil {
		t.Fatal(err)
	}
	if url, err := <-got, <-errc; url != "http://127.0.0.1:1234" || err != nil {
		t.Fatalf("Wait = %q, %v", url, err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "http://127.0.0.1:1234\n" {
		t.Fatalf("file = %q, %v", b, err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	// Write replaces an old file whole.
	if err := readyfile.Write(path, "https://[::1]:99"); err != nil {
		t.Fatal(err)
	}
	if url, err := readyfile.Wait(context.Background(), path, nil); url != "https://[::1]:99" || err != nil {
		t.Fatalf("Wait after rewrite = %q, %v", url, err)
	}
}

func TestWaitGivesUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "never")
	exited := make(chan struct{})
	close(exited)
	if _, err := readyfile.Wait(context.Background(), path, exited); err == nil {
		t.Fatal("Wait succeeded for an exited process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := readyfile.Wait(ctx, path, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait after the deadline: %v", err)
	}
	if err := readyfile.Write(filepath.Join(path, "no-such-dir", "f"), "x"); err == nil {
		t.Fatal("Write into a missing directory succeeded")
	}
}
