//go:build linux

package linuxns

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The /etc dirs no sandbox on disk names (those of sandboxes gone, or
// half built by a crash) are removed; those a kept or paused sandbox's
// state names stay (its restore binds it again), and so do the current
// one and one retired less than etcDirGrace ago (a create that took it
// may not have saved its state yet).
func TestEtcDirsRemoveUnused(t *testing.T) {
	root := t.TempDir()
	e := newEtcDirs(root, slog.New(slog.DiscardHandler))
	dir := func(g string) string { return filepath.Join(e.root, g) }
	for _, g := range []string{"g-kept", "g-gone", "g-half", "g-cur", "g-recent", "g-old"} {
		if err := os.MkdirAll(filepath.Join(dir(g), "ssl"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	st := &sandboxState{ID: "sbx-kept", EtcDir: "g-kept"}
	if err := os.Mkdir(filepath.Join(root, st.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := st.save(filepath.Join(root, st.ID)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	e.cur = "g-cur"
	e.retired["g-recent"] = now.Add(-etcDirGrace / 2)
	e.retired["g-old"] = now.Add(-etcDirGrace)
	e.removeUnused(now)
	left, _ := filepath.Glob(filepath.Join(e.root, "*"))
	want := []string{dir("g-cur"), dir("g-kept"), dir("g-recent")}
	if !slices.Equal(left, want) {
		t.Errorf("after removeUnused: %v, want %v", left, want)
	}
	if _, ok := e.retired["g-old"]; ok {
		t.Error("a removed dir is still noted as retired")
	}
}
