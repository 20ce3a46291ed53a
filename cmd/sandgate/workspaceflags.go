package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/sandgate/sandgate/workspace"
)

// workspaceFlags are serve's settings of named workspaces and snapshots.
type workspaceFlags struct {
	objectStore  string
	endpoint     string
	region       string
	syncInterval time.Duration
	maxWS        int
	maxSnaps     int
}

func (w *workspaceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&w.objectStore, "object-store", "", "keep workspaces and snapshots in an S3-compatible object store, `s3://bucket/prefix` (credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); without it they live in the data dir only")
	fs.StringVar(&w.endpoint, "object-store-endpoint", "", "the object store's URL, e.g. http://127.0.0.1:9000 (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS S3)")
	fs.StringVar(&w.region, "object-store-region", "", "the bucket's region (default: AWS_REGION, else us-east-1)")
	fs.DurationVar(&w.syncInterval, "workspace-sync-interval", time.Minute, "how often a running session's named workspace is synced (it also is on session end and on snapshot)")
	fs.IntVar(&w.maxWS, "max-workspaces-per-tenant", workspace.DefaultMaxWorkspaces, "named workspaces one tenant may keep; one more is refused (429 workspace_limit)")
	fs.IntVar(&w.maxSnaps, "max-snapshots-per-tenant", workspace.DefaultMaxSnapshots, "snapshots one tenant may keep; one more is refused (429 snapshot_limit)")
}

// check refuses bounds that would refuse every create.
func (w *workspaceFlags) check() error {
	if w.maxWS < 1 {
		return fmt.Errorf("--max-workspaces-per-tenant must be at least 1, got %d", w.maxWS)
	}
	if w.maxSnaps < 1 {
		return fmt.Errorf("--max-snapshots-per-tenant must be at least 1, got %d", w.maxSnaps)
	}
	return nil
}

// open makes the workspace engine under dataDir.
func (w *workspaceFlags) open(dataDir string, log *slog.Logger) (*workspace.Service, error) {
	cfg := workspace.Config{Dir: filepath.Join(dataDir, "workspaces"), SyncInterval: w.syncInterval, Log: log,
		MaxWorkspaces: w.maxWS, MaxSnapshots: w.maxSnaps}
	if w.objectStore != "" {
		b, err := workspace.NewS3Backend(workspace.S3Config{URL: w.objectStore, Endpoint: w.endpoint, Region: w.region}, os.Getenv)
		if err != nil {
			return nil, err
		}
		cfg.Remote = b
	}
	return workspace.New(cfg)
}

// flushWorkspaces pushes what is left to the object store before exit,
// for at most timeout.
func flushWorkspaces(ws *workspace.Service, timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := ws.Flush(ctx); err != nil {
		log.Warn("workspace_flush_failed", "err", err)
	}
}
