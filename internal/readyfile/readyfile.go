// Package readyfile is how `sandgate serve --ready-file PATH` tells
// whoever started it that it is listening, and where: once the listener is
// bound, PATH holds one line, the gateway's URL. The file appears whole
// (written to a temporary file, then renamed), so a reader never sees part
// of it.
package readyfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Write stores url in path atomically: a temporary file in the same
// directory, renamed over path.
func Write(path, url string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	_, err = f.WriteString(url + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("ready file: %w", err)
	}
	return nil
}

// pollInterval is how often Wait looks for the file.
const pollInterval = 10 * time.Millisecond

// Wait waits until path exists and returns the URL in it. It gives up with
// an error when ctx ends or exited is closed (the process that was to write
// the file is gone) before the file appears.
func Wait(ctx context.Context, path string, exited <-chan struct{}) (string, error) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			url := strings.TrimSpace(string(b))
			if url == "" {
				return "", fmt.Errorf("ready file %s is empty", path)
			}
			return url, nil
		case !errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("ready file: %w", err)
		}
		select {
		case <-t.C:
		case <-exited:
			return "", errors.New("the process exited before it was ready")
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for ready file %s: %w", path, context.Cause(ctx))
		}
	}
}
