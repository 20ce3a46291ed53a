package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/readyfile"
)

// TestGetsWhileWritesGrowTheStore: GETs of a large object stream while
// PUTs grow the bbolt file (and so remap it). gofakes3's bbolt backend
// hands out object bytes that alias the map; without serialized the
// server died of SIGBUS within a few dozen PUTs.
func TestGetsWhileWritesGrowTheStore(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakes3")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ready := filepath.Join(dir, "ready")
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-db", filepath.Join(dir, "s3.db"), "-ready-file", ready)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var exit error
	go func() { exit = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := readyfile.Wait(ctx, ready, done)
	if err != nil {
		t.Fatalf("fakes3 did not start: %v", err)
	}
	put := func(key string, n int) error {
		req, err := http.NewRequest(http.MethodPut, url+"/b/"+key, bytes.NewReader(bytes.Repeat([]byte("x"), n)))
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("put %s: %s", key, resp.Status)
		}
		return nil
	}
	const hot = 4 << 20
	if err := put("hot", hot); err != nil {
		t.Fatal(err)
	}

	var readers, writers sync.WaitGroup
	errs := make(chan error, 16)
	writing := make(chan struct{})
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-writing:
					return
				default:
				}
				resp, err := http.Get(url + "/b/hot")
				if err != nil {
					errs <- err
					return
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != hot {
					errs <- fmt.Errorf("get: %d bytes, %v", n, err)
					return
				}
			}
		})
	}
	for w := range 2 {
		writers.Go(func() {
			for i := range 100 {
				if err := put(fmt.Sprintf("grow/%d/%d", w, i), 1<<20); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	writers.Wait()
	close(writing)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	select {
	case <-done:
		t.Fatalf("fakes3 died: %v\n%s", exit, stderr.String())
	default:
	}
	if t.Failed() {
		os.Stderr.Write(stderr.Bytes())
	}
}
