package dataplane

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
	"unicode/utf8"
)

// modelOutput is what a capture of limit must answer for the stream w:
// its first ceil(limit/2) and last floor(limit/2) bytes, the characters
// cut between them dropped when the rest is text.
func modelOutput(w []byte, limit int) (kept []byte, text bool) {
	if len(w) <= limit {
		return w, utf8.Valid(w)
	}
	head, tail := w[:limit-limit/2], w[len(w)-limit/2:]
	h, t := trimCutEnd(head), trimCutStart(tail)
	if utf8.Valid(h) && utf8.Valid(t) {
		return append(append([]byte(nil), h...), t...), true
	}
	return append(append([]byte(nil), head...), tail...), false
}

// The capture keeps, in one buffer turned in place, what the head/tail
// rule says, for every limit and every way of cutting the writes, with
// buffers from a pool or not.
func TestCaptureKeepsHeadAndTail(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := [][]byte{[]byte("a"), []byte("é"), []byte("€"), []byte("𝄞"), []byte("\n"), {0xff}}
	pool := &BufferPool{}
	for i := range 3000 {
		limit := rng.IntN(40)
		if i%50 == 0 {
			limit = smallBuf + rng.IntN(1000)
		}
		n := rng.IntN(3 * (limit + 1))
		binary := rng.IntN(4) == 0
		var w []byte
		for len(w) < n {
			c := alphabet[rng.IntN(len(alphabet)-1)]
			if binary {
				c = alphabet[rng.IntN(len(alphabet))]
			}
			w = append(w, c...)
		}
		c := newCapture(int64(limit))
		if i%2 == 0 {
			c.pool = pool
		}
		for rest := w; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(2*limit+2))
			c.Write(rest[:k])
			rest = rest[k:]
		}
		// text and bytes (copies, which the kernel uses on a live
		// capture) agree with output.
		copyText, copyOK := c.text()
		o := c.output()
		kept, text := modelOutput(w, limit)
		if o.IsBase64 == text || !bytes.Equal(o.Bytes(), kept) || o.Truncated != (len(w) > limit) {
			t.Fatalf("limit %d, wrote %q: got %q (base64 %v, truncated %v), want %q (text %v)",
				limit, w, o.Bytes(), o.IsBase64, o.Truncated, kept, text)
		}
		if text && (o.Text != string(kept) || copyText != o.Text || !copyOK) {
			t.Fatalf("limit %d: Text %q, text() %q %v, want %q", limit, o.Text, copyText, copyOK, kept)
		}
		if tt, ok := c.text(); ok != text || !bytes.Equal(c.bytes(), kept) || (ok && tt != o.Text) {
			t.Fatalf("limit %d: text()/bytes() after output disagree with it", limit)
		}
		c.Write([]byte("more")) // frozen: counted, not kept
		if !bytes.Equal(c.output().Bytes(), o.Bytes()) {
			t.Fatalf("a write after output changed it")
		}
		Result{Stdout: o}.Release()
	}
}

// A streamed command's output is counted, not kept.
func TestCounterKeepsNothing(t *testing.T) {
	c := newCounter(4)
	c.Write([]byte("hello"))
	if o := c.output(); len(o.Bytes()) != 0 || !o.Truncated || c.total != 5 {
		t.Errorf("counter: %+v, total %d", o, c.total)
	}
}

// Growing a capture costs one small buffer, then its whole size once.
func TestCaptureGrowsOnce(t *testing.T) {
	c := newCapture(16 << 20)
	c.Write(make([]byte, 100))
	if cap(c.buf) != smallBuf {
		t.Errorf("first buffer %d bytes, want %d", cap(c.buf), smallBuf)
	}
	c.Write(make([]byte, smallBuf))
	if cap(c.buf) != 16<<20 {
		t.Errorf("second buffer %d bytes, want the whole limit", cap(c.buf))
	}
}

func TestOutputBudget(t *testing.T) {
	ctx := context.Background()
	b := &OutputBudget{Total: 10, PerTenant: 6, Wait: 50 * time.Millisecond}
	relA, err := b.Acquire(ctx, "a", 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "a", 2); !errors.Is(err, ErrTenantBudget) {
		t.Errorf("past the tenant's share: %v", err)
	}
	relB, err := b.Acquire(ctx, "b", 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "c", 2); !errors.Is(err, ErrGatewayBudget) {
		t.Errorf("past the gateway's: %v", err)
	}
	// A waiter gets the room a release frees.
	b.Wait = time.Minute
	got := make(chan error, 1)
	go func() {
		rel, err := b.Acquire(ctx, "c", 3)
		if err == nil {
			rel()
		}
		got <- err
	}()
	relA()
	relA() // once only
	if err := <-got; err != nil {
		t.Errorf("queued: %v", err)
	}
	// A charge above a bound runs alone rather than never.
	relB()
	rel, err := b.Acquire(ctx, "d", 50)
	if err != nil {
		t.Errorf("a lone big charge: %v", err)
	} else {
		rel()
	}
	// The caller's context ends the wait.
	relX, _ := b.Acquire(ctx, "x", 6)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Acquire(cctx, "x", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled wait: %v", err)
	}
	relX()
	if total, of := b.Used("x"); total != 0 || of != 0 {
		t.Errorf("left charged: %d, %d", total, of)
	}
}

// TestBufferPoolSizesBounded: the output buffers' sizes follow each
// request's maxOutputBytes, which the client picks; a pool per size ever
// asked for grew without bound (a sync.Pool and a map entry each, kept
// for the gateway's life), however few commands ran at once.
func TestBufferPoolSizesBounded(t *testing.T) {
	pool := &BufferPool{}
	out := make([]byte, smallBuf+2000)
	for i := range 1000 {
		c := newCapture(int64(2*smallBuf + i)) // past smallBuf: the buffer takes the limit's size
		c.pool = pool
		c.Write(out)
		if got := c.output().Bytes(); len(got) != len(out) {
			t.Fatalf("limit %d: kept %d bytes of %d", 2*smallBuf+i, len(got), len(out))
		}
		c.release()
	}
	pool.mu.Lock()
	n := len(pool.sizes)
	pool.mu.Unlock()
	if n > maxPoolSizes {
		t.Fatalf("the pool keeps buffers of %d sizes, want at most %d", n, maxPoolSizes)
	}
	// The sizes it has keep being reused.
	b := pool.get(readBufSize)
	pool.put(b)
}
