package sshd

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// TestReadAheadStream reads a stream the way x/crypto/ssh's transport
// does (a 4 KiB bufio.Reader, then packet-sized ReadFulls) through
// readAhead, over a source that sends bursts and quiet spells, and checks
// every byte and the source's final error.
func TestReadAheadStream(t *testing.T) {
	data := make([]byte, 6<<20)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	wantErr := errors.New("tunnel closed")
	src := &chunkReader{data: data, sizes: []int{copyBufMax, copyBufMax, 100, 4 << 10, 7, copyBufMax, 33 << 10, 1}, err: wantErr}
	pool := &bufPool{}
	ra := &readAhead{src: src, pool: pool}
	br := bufio.NewReader(ra) // the transport's: 4 KiB
	var got bytes.Buffer
	pkt := make([]byte, 32<<10)
	var err error
	for i := 0; ; i++ {
		n := []int{4, 32 << 10, 13, 32<<10 - 4, 4096}[i%5]
		var m int
		m, err = io.ReadFull(br, pkt[:n])
		got.Write(pkt[:m])
		if err != nil {
			break
		}
	}
	if !errors.Is(err, wantErr) {
		t.Fatalf("read ended with %v, want %v", err, wantErr)
	}
	if _, err := br.Read(pkt); !errors.Is(err, wantErr) {
		t.Fatalf("next read: %v, want %v", err, wantErr)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("got %d bytes, want %d, or they differ", got.Len(), len(data))
	}
	if ra.big != nil {
		t.Fatal("buffer still held after the stream ended")
	}
}

// TestReadAheadOnlyWhileFull: reads that do not fill the caller's buffer
// go straight to it; a full one makes the next read a large one into a
// pooled buffer, which goes back once served.
func TestReadAheadOnlyWhileFull(t *testing.T) {
	data := make([]byte, 1<<20)
	src := &chunkReader{data: data, sizes: []int{100, 4 << 10, copyBufMax, 10}}
	ra := &readAhead{src: src, pool: &bufPool{}}
	p := make([]byte, 4<<10)

	if n, _ := ra.Read(p); n != 100 || ra.ahead || ra.big != nil {
		t.Fatalf("short read: n=%d ahead=%v big=%v", n, ra.ahead, ra.big != nil)
	}
	if n, _ := ra.Read(p); n != 4<<10 || !ra.ahead || ra.big != nil {
		t.Fatalf("full read: n=%d ahead=%v big=%v", n, ra.ahead, ra.big != nil)
	}
	// The source hands copyBufMax at once: 4 KiB to the caller, the rest kept.
	if n, _ := ra.Read(p); n != 4<<10 || ra.big == nil || ra.w-ra.r != copyBufMax-4<<10 {
		t.Fatalf("read ahead: n=%d big=%v buffered=%d", n, ra.big != nil, ra.w-ra.r)
	}
	large := make([]byte, copyBufMax)
	if n, _ := ra.Read(large); n != copyBufMax-4<<10 || ra.big != nil {
		t.Fatalf("drain: n=%d big=%v", n, ra.big != nil)
	}
	// Quiet again: the 10-byte read goes straight into the caller's buffer.
	if n, _ := ra.Read(p); n != 10 || ra.ahead || ra.big != nil {
		t.Fatalf("quiet read: n=%d ahead=%v big=%v", n, ra.ahead, ra.big != nil)
	}
}
