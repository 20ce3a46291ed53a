//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockDataDir takes the data dir for this gateway: an exclusive flock(2)
// on <data dir>/serve.lock, which holds the pid. A second `serve` on the
// same data dir fails at once, naming the pid that holds it, instead of
// waiting for the store and timing out. The lock goes with the process
// (the descriptor is close-on-exec: sandboxes never inherit it).
func lockDataDir(dir string) (func(), error) {
	path := filepath.Join(dir, "serve.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = fmt.Sprintf("another sandgate serve, pid %d", pid)
			}
			return nil, fmt.Errorf("data dir %s is in use by %s (it holds %s); stop it, or give this gateway its own --data-dir", dir, holder, path)
		}
		return nil, fmt.Errorf("lock the data dir: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
