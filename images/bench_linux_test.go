package images

import (
	"context"
	"io/fs"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
)

// BenchmarkFirstPull50MB measures a first pull (nothing stored) of an image
// of a busybox layer and a 50 MB layer of random data from a registry on
// loopback, and the disk the unpacked layers use:
//
//	go test -run XXX -bench FirstPull50MB -benchtime 5x ./images/
func BenchmarkFirstPull50MB(b *testing.B) {
	reg := imagestest.NewRegistry(b)
	img := imagestest.Image(b, v1.Config{}, imagestest.BusyboxLayer(b), imagestest.RandomLayer(b, "data/blob", 50<<20, 1))
	ref := reg.Push(b, "bench/big:1", img)
	var total time.Duration
	var disk int64
	for b.Loop() {
		b.StopTimer()
		tr := http.DefaultTransport.(*http.Transport).Clone()
		s, err := Open(b.TempDir(), WithTransport(tr))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		got, err := s.Pull(context.Background(), ref, PullOptions{})
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		disk = diskUse(b, s.layersDir())
		b.ReportMetric(float64(got.SizeBytes)/1e6, "MB-files")
		tr.CloseIdleConnections()
		b.StartTimer()
	}
	b.ReportMetric(float64(disk)/1e6, "MB-disk")
}

// diskUse is the allocated bytes under dir, as du counts them.
func diskUse(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
