package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sandgate/sandgate/images/imagestest"
)

func TestWantRow(t *testing.T) {
	for _, tc := range []struct {
		rows []string
		id   string
		want bool
	}{
		{[]string{"8"}, "8", true}, {[]string{"8"}, "8b", true}, {[]string{"8b"}, "8", true},
		{[]string{"8b"}, "8b", true}, {[]string{"8b"}, "8a", false}, {[]string{"1"}, "8", false},
		{[]string{"10"}, "1", false}, {[]string{"1", "2"}, "8c", false},
		{[]string{"9d"}, "9", true}, {[]string{"9"}, "9c", true}, {[]string{"9a", "9c"}, "9b", false},
		{[]string{"e"}, "e3", true}, {[]string{"e"}, "e5c", true}, {[]string{"e3"}, "e3b", true},
		{[]string{"e3"}, "e4", false}, {[]string{"e"}, "3", false}, {[]string{"3"}, "e3", false},
	} {
		c := &config{rows: map[string]bool{}}
		for _, r := range tc.rows {
			c.rows[r] = true
		}
		if got := c.wantRow(tc.id); got != tc.want {
			t.Errorf("rows %v: wantRow(%q) = %v, want %v", tc.rows, tc.id, got, tc.want)
		}
	}
}

func TestParseSizeMB(t *testing.T) {
	for in, want := range map[string]int64{"50MB": 50e6, "50MiB": 50 << 20, "1GiB": 1 << 30, "7": 7} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if got := sizeLabel(50e6); got != "50 MB" {
		t.Errorf("sizeLabel(50e6) = %q", got)
	}
}

// A sparse file counts its allocated blocks, not its size.
func TestDiskUsageSparse(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	alloc, apparent, err := diskUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if apparent < 1<<30 || alloc > 1<<20 || alloc < 8192 {
		t.Errorf("alloc %d apparent %d: want 8 KiB-1 MiB allocated of 1 GiB", alloc, apparent)
	}
	if a, _, err := diskUsage(filepath.Join(dir, "missing")); err != nil || a != 0 {
		t.Errorf("missing dir: %d, %v", a, err)
	}
}

// The loopback registry serves what was pushed.
func TestLoopRegistry(t *testing.T) {
	reg := newLoopRegistry()
	defer reg.close()
	l, err := tarLayer(imagestest.Entry{Name: "etc/", Type: '5'}, imagestest.Entry{Name: "etc/hello", Body: "hi\n"})
	if err != nil {
		t.Fatal(err)
	}
	img, err := benchImage(l)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := reg.push("t/x:1", img)
	if err != nil {
		t.Fatal(err)
	}
	n, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(n, remote.WithTransport(reg.tr))
	if err != nil {
		t.Fatal(err)
	}
	dg, _ := got.Digest()
	want, _ := img.Digest()
	if dg != want {
		t.Errorf("pulled %s, pushed %s", dg, want)
	}
}
