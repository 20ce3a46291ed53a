package dataplane

import (
	"sync"
	"unicode/utf8"
	"unsafe"
)

// capture keeps at most limit bytes of one output stream: its first
// ceil(limit/2) bytes (the head) and its last floor(limit/2) (the tail),
// dropping what lies between.
//
// Both live in one buffer, the head then the tail's ring, which grows with
// what is written (at most doubling, so the garbage of its growth stays
// below what it keeps) up to limit bytes: a command costs the bytes it
// keeps, not its limit. output freezes the capture and hands that buffer
// out as it is, the ring turned in place: a command's answer is encoded
// from it, with no copy (see Output).
type capture struct {
	limit   int64
	total   int64
	headCap int    // bytes of the head: limit - ring
	ring    int    // bytes of the tail
	buf     []byte // the head, then the ring; len grows to headCap+ring
	at      int    // once the ring is full: where its oldest byte is
	full    bool   // the ring is full (what was written reached limit)
	discard bool   // keep nothing, only count (the output was streamed)
	frozen  bool   // output was called: buf is the answer's, never written again
	isText  bool   // once frozen: what is kept is text
	pool    *BufferPool
}

func newCapture(limit int64) *capture {
	limit = max(limit, 0)
	ring := int(limit / 2)
	return &capture{limit: limit, ring: ring, headCap: int(limit) - ring}
}

// release gives the buffer back to the pool; what output returned is
// invalid from then on.
func (c *capture) release() {
	if c.pool != nil && c.buf != nil {
		c.pool.put(c.buf)
	}
	c.buf, c.frozen = nil, true
}

// newCounter returns a capture that keeps nothing: it counts the bytes and
// says whether more than limit came (for output sent as it arrives).
func newCounter(limit int64) *capture {
	c := newCapture(limit)
	c.discard = true
	return c
}

// smallBuf is the buffer's first size: output that fits takes no more.
// Past it the buffer takes its whole size at once (headCap+ring), so that
// growing makes no garbage; pages never written are not resident, and a
// pooled buffer is reused as a whole.
const smallBuf = 64 << 10

// grow makes room for n more bytes in buf (n fits under headCap+ring).
func (c *capture) grow(n int) {
	need := len(c.buf) + n
	if need <= cap(c.buf) {
		return
	}
	size := c.headCap + c.ring
	if need <= smallBuf {
		size = min(size, smallBuf)
	}
	b := c.pool.get(size)[:len(c.buf)]
	copy(b, c.buf)
	if c.buf != nil {
		c.pool.put(c.buf)
	}
	c.buf = b
}

// appendBuf appends p, which fits under headCap+ring.
func (c *capture) appendBuf(p []byte) {
	c.grow(len(p))
	c.buf = append(c.buf, p...)
}

func (c *capture) Write(p []byte) {
	c.total += int64(len(p))
	if c.discard || c.frozen {
		return
	}
	if n := c.headCap - len(c.buf); n > 0 {
		n = min(n, len(p))
		c.appendBuf(p[:n])
		p = p[n:]
	}
	if c.ring == 0 || len(p) == 0 {
		return
	}
	end := c.headCap + c.ring
	if len(p) >= c.ring {
		c.grow(end - len(c.buf))
		c.buf = c.buf[:end]
		copy(c.buf[c.headCap:], p[len(p)-c.ring:])
		c.at, c.full = 0, true
		return
	}
	for len(p) > 0 {
		if !c.full {
			n := min(end-len(c.buf), len(p))
			c.appendBuf(p[:n])
			p = p[n:]
			if len(c.buf) == end {
				c.at, c.full = 0, true
			}
			continue
		}
		n := copy(c.buf[c.headCap+c.at:], p)
		p = p[n:]
		c.at += n
		if c.at == c.ring {
			c.at = 0
		}
	}
}

// truncated reports whether bytes were dropped.
func (c *capture) truncated() bool { return c.total > c.limit }

// parts returns the kept output in order: the head, then the tail in at
// most two pieces. They alias the buffer.
func (c *capture) parts() (head, tail1, tail2 []byte) {
	if len(c.buf) <= c.headCap {
		return c.buf, nil, nil
	}
	head, ring := c.buf[:c.headCap], c.buf[c.headCap:]
	if c.full {
		return head, ring[c.at:], ring[:c.at]
	}
	return head, ring, nil
}

// bytes returns a copy of the kept output: the head then the tail.
func (c *capture) bytes() []byte {
	if c.frozen { // turned and trimmed in place
		return append([]byte(nil), c.buf...)
	}
	h, t1, t2 := c.parts()
	out := make([]byte, 0, len(h)+len(t1)+len(t2))
	return append(append(append(out, h...), t1...), t2...)
}

// text returns a copy of the kept output as text, or ok=false when it is
// not valid UTF-8. A character cut in two by the truncation, at the end of
// the head or the start of the tail, is dropped, so that truncated text
// stays text.
func (c *capture) text() (string, bool) {
	if c.frozen {
		return string(c.buf), c.isText
	}
	b := c.bytes()
	if c.truncated() && !c.discard {
		head := trimCutEnd(b[:c.headCap])
		tail := trimCutStart(b[c.headCap:])
		b = append(head, tail...) // head's end is dropped: no overlap
	}
	return string(b), utf8.Valid(b)
}

// output freezes the capture and returns the kept output, which aliases
// the capture's buffer: nothing writes to it after (Write counts and
// drops). The ring is turned in place; when the output is text, the
// characters cut by a truncation are taken out in place too.
func (c *capture) output() Output {
	if c.frozen {
		return c.out()
	}
	c.frozen = true
	if c.discard {
		return c.out()
	}
	if c.full && c.at > 0 {
		rotate(c.buf[c.headCap:], c.at)
		c.at = 0
	}
	c.isText = utf8.Valid(c.buf)
	if c.truncated() {
		// Text when both halves are, once the characters cut between
		// them are dropped (the bytes glued across the cut may happen to
		// be valid, but they are no text the command wrote).
		head := trimCutEnd(c.buf[:c.headCap])
		tail := trimCutStart(c.buf[c.headCap:])
		c.isText = utf8.Valid(head) && utf8.Valid(tail)
		if c.isText {
			n := copy(c.buf[len(head):], tail)
			c.buf = c.buf[:len(head)+n]
		}
	}
	return c.out()
}

func (c *capture) out() Output {
	o := Output{Truncated: c.truncated(), raw: c.buf, c: c}
	if !c.isText && !c.discard {
		o.IsBase64 = true
	} else if len(c.buf) > 0 {
		// The buffer is frozen: the string shares it.
		o.Text = unsafe.String(&c.buf[0], len(c.buf))
	}
	return o
}

// rotate turns b left by k bytes in place.
func rotate(b []byte, k int) {
	reverse(b[:k])
	reverse(b[k:])
	reverse(b)
}

func reverse(b []byte) {
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
}

// trimCutEnd drops an incomplete UTF-8 character at the end of b.
func trimCutEnd(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			return b
		}
	}
	return b
}

// trimCutStart drops the continuation bytes of a character cut at the
// start of b.
func trimCutStart(b []byte) []byte {
	for i := 0; i < len(b) && i < utf8.UTFMax; i++ {
		if utf8.RuneStart(b[i]) {
			return b[i:]
		}
	}
	return b
}

// Output is one stream's output in an answer: Text when it is valid UTF-8,
// else only its bytes (IsBase64: an answer carries them as base64).
//
// A command's Output shares the buffer its output was kept in, Text
// included: encode it from Bytes rather than copy it. After the Result's
// Release, neither may be used.
type Output struct {
	Text      string
	IsBase64  bool
	Truncated bool
	raw       []byte
	c         *capture
}

// Bytes returns the kept bytes (Text's bytes when it is text). The caller
// must not modify them.
func (o Output) Bytes() []byte {
	if o.raw == nil && o.Text != "" {
		return []byte(o.Text)
	}
	return o.raw
}

// BufferPool keeps the buffers of commands' output for reuse, so that a
// burst of commands does not make the gateway's heap (and with it what the
// Go runtime keeps of it, which is sized by the heap's peak) grow by their
// garbage. Buffers are pooled by size; the runtime drops pooled buffers
// that stay unused across garbage collections (sync.Pool). Its zero value
// is ready; a nil *BufferPool allocates and never reuses.
type BufferPool struct {
	mu    sync.Mutex
	sizes map[int]*sync.Pool
}

// maxPoolSizes bounds the sizes a BufferPool keeps buffers of. A
// buffer's size follows its request's maxOutputBytes, which the client
// picks: one pool per size ever asked for grew without bound. Buffers of
// a size past these are allocated and dropped, as without a pool.
const maxPoolSizes = 32

// pool returns the pool of buffers of size, nil when size has none and
// maxPoolSizes are taken.
func (p *BufferPool) pool(size int) *sync.Pool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sizes == nil {
		p.sizes = map[int]*sync.Pool{}
	}
	sp := p.sizes[size]
	if sp == nil {
		if len(p.sizes) >= maxPoolSizes {
			return nil
		}
		sp = &sync.Pool{}
		p.sizes[size] = sp
	}
	return sp
}

// get returns an empty buffer of capacity size.
func (p *BufferPool) get(size int) []byte {
	if p != nil {
		if sp := p.pool(size); sp != nil {
			if b, ok := sp.Get().(*[]byte); ok {
				return (*b)[:0]
			}
		}
	}
	return make([]byte, 0, size)
}

// put gives b back for reuse.
func (p *BufferPool) put(b []byte) {
	if p == nil || cap(b) == 0 {
		return
	}
	b = b[:0]
	if sp := p.pool(cap(b)); sp != nil {
		sp.Put(&b)
	}
}

// OutputOf returns b as an Output: Text when it is valid UTF-8. The
// Output shares b.
func OutputOf(b []byte, truncated bool) Output {
	c := &capture{buf: b, total: int64(len(b)), limit: int64(len(b)), frozen: true, isText: utf8.Valid(b)}
	o := c.out()
	o.Truncated, o.c = truncated, nil
	return o
}
