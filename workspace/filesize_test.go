package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRestoreRefusesHugeSparseFile (review of issue 35 item 1): a sparse
// entry's length costs its store nothing, so a manifest from a store that
// is not trusted could make a restore write a 2^62-byte file. Lengths past
// maxFileSize are refused, with an error that says so, and nothing is
// written; a 1 TiB sparse file (truncate -s 1T) is fine.
func TestRestoreRefusesHugeSparseFile(t *testing.T) {
	tib := Entry{Path: "sparse.bin", Mode: 0o644, Size: 1 << 40, Sparse: true}
	if err := checkEntry(&tib); err != nil {
		t.Fatalf("a 1 TiB sparse file: %v", err)
	}
	s := newServiceCfg(t, Config{})
	// The store holds an empty object: the huge file's data, no bytes.
	src := t.TempDir()
	write(t, filepath.Join(src, "empty"), "")
	sm, _, err := s.scan(context.Background(), src, scanCache{}, 1<<30, &pinSet{})
	if err != nil || len(sm.Entries) != 1 {
		t.Fatalf("scan: %v", err)
	}
	dir := t.TempDir()
	m := &Manifest{Version: 1, Entries: []Entry{{Path: "huge.bin", Mode: 0o644, Size: 1 << 62, Sparse: true, Hash: sm.Entries[0].Hash}}}
	err = s.restore(context.Background(), m, dir)
	if !errors.Is(err, errCorrupt) || !strings.Contains(err.Error(), "16 TiB") {
		t.Fatalf("restore of a 2^62-byte sparse entry: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "huge.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused file was made: %v", err)
	}
}
