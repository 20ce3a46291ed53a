package workspace

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestScanSkipsUploadsInFlight: the temporary file of a REST upload in
// flight (or one a crash cut off) is not content: never synced or
// snapshotted (issue 35 item 8).
func TestScanSkipsUploadsInFlight(t *testing.T) {
	s := newService(t)
	src := t.TempDir()
	write(t, filepath.Join(src, "a/.sandgate-upload-0123456789abcdef.tmp"), "half an upload")
	write(t, filepath.Join(src, "a/kept.txt"), "kept")
	write(t, filepath.Join(src, ".sandgate-upload-notes"), "not an upload's name")
	// The user's own files that merely look alike are content.
	write(t, filepath.Join(src, ".sandgate-upload-my-draft.tmp"), "mine")
	write(t, filepath.Join(src, ".sandgate-upload-0123456789ABCDEF.tmp"), "mine")
	write(t, filepath.Join(src, ".sandgate-upload-0123456789abcdef0.tmp"), "mine")
	write(t, filepath.Join(src, ".sandgate-upload-.tmp"), "mine")
	m, _, err := s.scan(context.Background(), src, scanCache{}, 1<<30, &pinSet{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range m.Entries {
		got = append(got, e.Path)
	}
	if strings.Join(got, ",") != ".sandgate-upload-.tmp,.sandgate-upload-0123456789ABCDEF.tmp,.sandgate-upload-0123456789abcdef0.tmp,"+
		".sandgate-upload-my-draft.tmp,.sandgate-upload-notes,a,a/kept.txt" {
		t.Errorf("scanned %q", got)
	}
}
