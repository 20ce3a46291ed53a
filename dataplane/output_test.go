package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// stores runs a test on each kind of output storage.
func stores(t *testing.T, f func(t *testing.T, dir string)) {
	t.Run("memory", func(t *testing.T) { f(t, "") })
	t.Run("files", func(t *testing.T) { f(t, t.TempDir()+"/out") })
}

// readAll reads o from off to its current end (no follow).
func readAll(t *testing.T, o *OutputLog, off int64) (chunks []Chunk) {
	t.Helper()
	r := o.NewReader(off)
	for {
		c, err := r.Next(context.Background(), false)
		if errors.Is(err, io.EOF) {
			return chunks
		}
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
}

// checkChunks checks that chunks are contiguous from their first offset
// and returns their data joined, per stream and in all.
func checkChunks(t *testing.T, chunks []Chunk) (all []byte, dropped int64) {
	t.Helper()
	var next int64 = -1
	for i, c := range chunks {
		if c.Dropped > 0 {
			if i != 0 {
				t.Errorf("chunk %d: dropped %d bytes in the middle", i, c.Dropped)
			}
			dropped = c.Dropped
			next = c.Offset
			continue
		}
		if next >= 0 && c.Offset != next {
			t.Fatalf("chunk %d at offset %d, want %d", i, c.Offset, next)
		}
		if len(c.Data) == 0 {
			t.Fatalf("chunk %d is empty", i)
		}
		next = c.Offset + int64(len(c.Data))
		all = append(all, c.Data...)
	}
	return all, dropped
}

func TestOutputInterleavedStreams(t *testing.T) {
	stores(t, func(t *testing.T, dir string) {
		o, err := NewOutputLog(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Remove() })
		writes := []struct {
			s    Stream
			data string
		}{{Stdout, "hello "}, {Stdout, "world\n"}, {Stderr, "oops\n"}, {Stdout, "bye\n"}, {Stderr, "e2"}, {Stderr, "e3"}}
		for _, w := range writes {
			if err := o.Write(w.s, []byte(w.data)); err != nil {
				t.Fatal(err)
			}
		}
		o.Close()
		got := readAll(t, o, 0)
		want := []Chunk{
			{Offset: 0, Stream: Stdout, Data: []byte("hello world\n")},
			{Offset: 12, Stream: Stderr, Data: []byte("oops\n")},
			{Offset: 17, Stream: Stdout, Data: []byte("bye\n")},
			{Offset: 21, Stream: Stderr, Data: []byte("e2e3")},
		}
		if show(got) != show(want) {
			t.Fatalf("chunks\n%s\nwant\n%s", show(got), show(want))
		}
		// From the middle of a frame.
		got = readAll(t, o, 14)
		if len(got) != 3 || got[0].Offset != 14 || string(got[0].Data) != "ps\n" || got[0].Stream != Stderr {
			t.Fatalf("from 14: %s", show(got))
		}
		// Past the end: nothing, at the end.
		r := o.NewReader(1000)
		if r.Offset() != 25 {
			t.Errorf("reader past the end at %d, want 25", r.Offset())
		}
		if _, err := r.Next(context.Background(), true); !errors.Is(err, io.EOF) {
			t.Errorf("closed output at its end: %v, want EOF", err)
		}
	})
}

// pattern is the byte at offset off of the test output: text, so that no
// chunk is held back for UTF-8.
func pattern(off int64) byte { return "abcdefghijklmnopqrstuvwxyz0123456789\n"[off%37] }

func patternBytes(from, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = pattern(from + int64(i))
	}
	return b
}

func TestOutputCapDropsOldest(t *testing.T) {
	for _, tc := range []struct {
		cap   int64
		total int64
		write int
	}{
		{cap: 4096, total: 100_000, write: 1},
		{cap: 4096, total: 100_000, write: 333},
		{cap: 64 << 10, total: 1 << 20, write: 70 << 10}, // writes larger than a frame
		{cap: 1 << 20, total: 3 << 20, write: 32 << 10},
	} {
		t.Run(fmt.Sprintf("cap%d/write%d", tc.cap, tc.write), func(t *testing.T) {
			stores(t, func(t *testing.T, dir string) {
				o, err := NewOutputLog(dir, tc.cap)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = o.Remove() })
				for off := int64(0); off < tc.total; {
					n := min(int64(tc.write), tc.total-off)
					if err := o.Write(Stdout, patternBytes(off, n)); err != nil {
						t.Fatal(err)
					}
					off += n
				}
				o.Close()
				if o.End() != tc.total {
					t.Fatalf("End %d, want %d", o.End(), tc.total)
				}
				start := o.Start()
				kept := tc.total - start
				if start == 0 || kept > tc.cap {
					t.Fatalf("kept [%d, %d): %d bytes, cap %d", start, tc.total, kept, tc.cap)
				}
				// Headers count against the cap: with 1-byte writes a
				// sixth of it is data.
				if minKept := tc.cap/16*14/(frameHeader+1) - 1; kept < minKept {
					t.Errorf("kept %d bytes, want at least %d", kept, minKept)
				}
				for _, from := range []int64{0, start - 1, start, start + 17, tc.total - 5} {
					all, dropped := checkChunks(t, readAll(t, o, from))
					wantDropped := max(0, start-from)
					if dropped != wantDropped {
						t.Errorf("from %d: dropped %d, want %d", from, dropped, wantDropped)
					}
					first := max(from, start)
					if !bytes.Equal(all, patternBytes(first, tc.total-first)) {
						t.Errorf("from %d: %d bytes differ from the output's [%d, %d)", from, len(all), first, tc.total)
					}
				}
				if dir != "" {
					entries, err := os.ReadDir(dir)
					if err != nil {
						t.Fatal(err)
					}
					if len(entries) > 2*16+1 {
						t.Errorf("%d segment files for a cap of 16 segments of data, 32 stored", len(entries))
					}
				}
			})
		})
	}
}

func TestOutputConcurrentFollowers(t *testing.T) {
	stores(t, func(t *testing.T, dir string) {
		const capBytes, total = 64 << 10, 4 << 20
		o, err := NewOutputLog(dir, capBytes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Remove() })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := o.NewReader(int64(i) * 1000)
				next, got := r.Offset(), int64(0)
				for {
					c, err := r.Next(ctx, true)
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						errs <- fmt.Errorf("follower %d: %w", i, err)
						return
					}
					if c.Dropped > 0 {
						if c.Offset != next+c.Dropped {
							errs <- fmt.Errorf("follower %d: dropped %d from %d lands at %d", i, c.Dropped, next, c.Offset)
							return
						}
						next = c.Offset
						continue
					}
					if c.Offset != next {
						errs <- fmt.Errorf("follower %d: chunk at %d, want %d", i, c.Offset, next)
						return
					}
					if !bytes.Equal(c.Data, patternBytes(c.Offset, int64(len(c.Data)))) {
						errs <- fmt.Errorf("follower %d: wrong bytes at %d", i, c.Offset)
						return
					}
					next += int64(len(c.Data))
					got += int64(len(c.Data))
				}
				if next != total {
					errs <- fmt.Errorf("follower %d ended at %d, want %d", i, next, total)
				}
			}()
		}
		for off := int64(0); off < total; {
			n := min(int64(1+off%5000), total-off)
			stream := Stdout
			if err := o.Write(stream, patternBytes(off, n)); err != nil {
				t.Fatal(err)
			}
			off += n
		}
		o.Close()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestOutputUTF8(t *testing.T) {
	stores(t, func(t *testing.T, dir string) {
		o, err := NewOutputLog(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Remove() })
		euro := []byte("€") // 3 bytes
		_ = o.Write(Stdout, append([]byte("price: "), euro[:1]...))
		r := o.NewReader(0)
		c, err := r.Next(context.Background(), false)
		if err != nil || string(c.Data) != "price: " {
			t.Fatalf("first chunk %q, %v; want the text without the partial rune", c.Data, err)
		}
		if _, err := r.Next(context.Background(), false); !errors.Is(err, io.EOF) || r.Offset() != 7 {
			t.Fatalf("partial rune: %v at %d, want EOF at 7", err, r.Offset())
		}
		// A follower waits for the rest of the rune.
		got := make(chan Chunk, 1)
		go func() {
			c, _ := r.Next(context.Background(), true)
			got <- c
		}()
		time.Sleep(50 * time.Millisecond)
		_ = o.Write(Stdout, euro[1:2])
		time.Sleep(50 * time.Millisecond)
		_ = o.Write(Stdout, append(euro[2:], " ok"...))
		select {
		case c := <-got:
			if c.Offset != 7 || string(c.Data) != "€ ok" {
				t.Fatalf("follower got %q at %d", c.Data, c.Offset)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("follower got nothing")
		}
		// A partial rune followed by another stream is given as it is.
		_ = o.Write(Stderr, euro[:2])
		_ = o.Write(Stdout, []byte("x"))
		chunks := readAll(t, o, 13)
		if len(chunks) != 2 || !bytes.Equal(chunks[0].Data, euro[:2]) || chunks[0].Stream != Stderr {
			t.Fatalf("partial rune then another stream: %s", show(chunks))
		}
		// Starting inside a rune gives its tail alone.
		chunks = readAll(t, o, 8)
		if len(chunks) < 2 || !bytes.Equal(chunks[0].Data, euro[1:]) || string(chunks[1].Data) != " ok" {
			t.Fatalf("from inside a rune: %s", show(chunks))
		}
		// At the end of a closed output the partial rune is given.
		_ = o.Write(Stdout, euro[:1])
		o.Close()
		chunks = readAll(t, o, 15)
		if len(chunks) != 1 || !bytes.Equal(chunks[0].Data, append([]byte("x"), euro[:1]...)) {
			t.Fatalf("closed with a partial rune: %s", show(chunks))
		}
	})
}

func TestOutputRemove(t *testing.T) {
	stores(t, func(t *testing.T, dir string) {
		o, err := NewOutputLog(dir, 1<<10)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 100 {
			_ = o.Write(Stdout, patternBytes(int64(i)*100, 100))
		}
		r := o.NewReader(0)
		follower := make(chan error, 1)
		go func() {
			for {
				if _, err := r.Next(context.Background(), true); err != nil {
					follower <- err
					return
				}
			}
		}()
		time.Sleep(50 * time.Millisecond)
		if err := o.Remove(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-follower:
			if !errors.Is(err, ErrOutputGone) {
				t.Errorf("follower: %v, want ErrOutputGone", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the follower was not woken by Remove")
		}
		if err := o.Write(Stdout, []byte("x")); !errors.Is(err, ErrOutputGone) {
			t.Errorf("write after Remove: %v", err)
		}
		if dir != "" {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there after Remove: %v", dir, err)
			}
		}
	})
}

// show renders chunks for messages.
func show(chunks []Chunk) string {
	var b bytes.Buffer
	for _, c := range chunks {
		fmt.Fprintf(&b, "{%d %s dropped=%d %q} ", c.Offset, c.Stream, c.Dropped, c.Data)
	}
	return b.String()
}

// TestCopyOutputUpTo: a fork's copy of a process's output (Processes.Fork)
// holds exactly the bytes before the offset the process had at the
// checkpoint, across segments and cut inside a frame, and is written on
// from there.
func TestCopyOutputUpTo(t *testing.T) {
	from := t.TempDir() + "/out"
	o, err := NewOutputLog(from, 1600) // segments of 100 bytes
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 60 {
		line := []byte(fmt.Sprintf("line %02d\n", i))
		stream := Stdout
		if i%3 == 0 {
			stream = Stderr
		}
		if err := o.Write(stream, line); err != nil {
			t.Fatal(err)
		}
		want = append(want, line...)
	}
	o.Close()
	for _, end := range []int64{0, 1, 8, 100, 133, 250, 479, 480} {
		to := t.TempDir()
		if err := copyOutputUpTo(from, to, end); err != nil {
			t.Fatal(err)
		}
		c, err := OpenOutputLog(to, 1600)
		if err != nil {
			t.Fatal(err)
		}
		if c.End() != end && !(end == 0 && c.End() == 0) {
			t.Errorf("copy up to %d ends at %d", end, c.End())
		}
		got, _ := checkChunks(t, readAll(t, c, 0))
		if !bytes.Equal(got, want[:end]) {
			t.Errorf("copy up to %d holds %q, want %q", end, got, want[:end])
		}
		if err := c.Write(Stdout, []byte("more\n")); err != nil {
			t.Fatal(err)
		}
		if got, _ := checkChunks(t, readAll(t, c, end)); string(got) != "more\n" {
			t.Errorf("copy up to %d, written on: %q", end, got)
		}
		c.Close()
	}
}
