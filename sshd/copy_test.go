package sshd

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// chunkReader returns its data in reads of the given sizes, cycling, then
// err (io.EOF when nil).
type chunkReader struct {
	data  []byte
	sizes []int
	i     int
	err   error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := min(len(p), r.sizes[r.i%len(r.sizes)], len(r.data))
	r.i++
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func TestCopyStreamBurstsAndQuietSpells(t *testing.T) {
	data := make([]byte, 5<<20)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	// Full small reads (grow), full large reads, short reads (shrink), again.
	sizes := []int{copyBufMin, copyBufMax, copyBufMax, 100, 7, copyBufMin, copyBufMax, 1}
	var pool bufPool
	var out bytes.Buffer
	n, err := copyStream(&out, &chunkReader{data: data, sizes: sizes}, &pool)
	if err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copied %d of %d bytes, err %v, equal %v", n, len(data), err, bytes.Equal(out.Bytes(), data))
	}
}

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

type failWriter struct{}

var errWrite = errors.New("write failed")

func (failWriter) Write(p []byte) (int, error) { return 0, errWrite }

func TestCopyStreamErrors(t *testing.T) {
	var pool bufPool
	src := func() io.Reader { return &chunkReader{data: make([]byte, 1000), sizes: []int{1000}} }
	if _, err := copyStream(shortWriter{}, src(), &pool); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("short write: %v", err)
	}
	if _, err := copyStream(failWriter{}, src(), &pool); !errors.Is(err, errWrite) {
		t.Errorf("failed write: %v", err)
	}
	errRead := errors.New("read failed")
	var out bytes.Buffer
	n, err := copyStream(&out, &chunkReader{data: []byte("abc"), sizes: []int{3}, err: errRead}, &pool)
	if !errors.Is(err, errRead) || n != 3 || out.String() != "abc" {
		t.Errorf("read error: n %d err %v out %q", n, err, out.String())
	}
}
