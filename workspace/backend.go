// Package workspace keeps sessions' workspaces beyond the sessions: named
// workspaces that one live session at a time mounts at /workspace, and
// point-in-time snapshots that new sessions start from (fork). It runs in
// the gateway process.
//
// Files are stored by content: each regular file's bytes are one object
// named by its SHA-256, and a manifest (JSON) lists a workspace version's
// paths, modes, sizes and hashes. Unchanged files are stored once, and a
// sync uploads only the objects the store does not hold yet, then the
// manifest. The local store under the data dir is always there; an
// S3-compatible object store, when configured, is the durable copy that a
// gateway with a wiped disk reads back.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Backend is a flat key/value store of objects: the data dir or an
// S3-compatible bucket. Keys are slash-separated paths made by this
// package only. Get of a missing key returns an error matching
// fs.ErrNotExist.
type Backend interface {
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// List returns every key under prefix.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// localBackend keeps objects as files under a directory.
type localBackend struct{ dir string }

func newLocalBackend(dir string) (*localBackend, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("workspace store: %w", err)
	}
	return &localBackend{dir: dir}, nil
}

func (b *localBackend) path(key string) (string, error) {
	if key == "" || strings.Contains(key, "..") || strings.HasPrefix(key, "/") {
		return "", fmt.Errorf("workspace store: bad key %q", key)
	}
	return filepath.Join(b.dir, filepath.FromSlash(key)), nil
}

// Put writes to a temporary file beside the target and renames it over,
// so a reader never sees a partial object.
func (b *localBackend) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".put-*")
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err == nil {
		err = syncDir(filepath.Dir(p)) // the rename too survives a power cut
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("workspace store: put %s: %w", key, err)
	}
	return nil
}

func (b *localBackend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, err
	}
	return os.Open(p)
}

func (b *localBackend) List(ctx context.Context, prefix string) ([]string, error) {
	root := filepath.Join(b.dir, filepath.FromSlash(prefix))
	var keys []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".put-") {
			rel, err := filepath.Rel(b.dir, p)
			if err != nil {
				return err
			}
			keys = append(keys, filepath.ToSlash(rel))
		}
		return nil
	})
	return keys, err
}

func (b *localBackend) Delete(ctx context.Context, key string) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
