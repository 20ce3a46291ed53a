package workdir

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// List returns the ids of the workdirs present (sandbox.Reattacher).
func (d *Driver) List(ctx context.Context) ([]string, error) {
	return sandbox.ListIDs(d.cfg.Root)
}

// Adopt re-attaches the workdir of session id after a restart. The workdir
// driver keeps files across restarts, not processes: any process of the
// previous run is killed.
func (d *Driver) Adopt(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, fmt.Errorf("invalid sandbox id %q", id)
	}
	dir := filepath.Join(d.cfg.Root, id)
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("workdir: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("workdir %s is not a directory", dir)
	}
	killAllTagged(SessionEnvVar + "=" + id)
	return &workdirSandbox{d: d, id: id, dir: dir, procs: map[*hostProcess]struct{}{}}, nil
}

// Remove destroys what is left of sandbox id (sandbox.Reattacher).
func (d *Driver) Remove(ctx context.Context, id string) error {
	if !sandbox.ValidID(id) {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	killAllTagged(SessionEnvVar + "=" + id)
	if err := os.RemoveAll(filepath.Join(d.cfg.Root, id)); err != nil {
		return fmt.Errorf("remove workdir: %w", err)
	}
	return nil
}

// Detach kills the sandbox's processes and keeps its files for the next
// gateway process.
func (s *workdirSandbox) Detach(ctx context.Context) error {
	s.kill(ctx)
	return nil
}

// killAllTagged kills tagged processes until none is left (they may fork
// while we scan), for at most a short while.
func killAllTagged(tag string) {
	for i := 0; i < 20; i++ {
		if killTagged(tag) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
