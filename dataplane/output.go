package dataplane

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"unicode/utf8"
)

// Stream says which of a process's streams bytes came from.
type Stream uint8

// The streams of a process's output.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// DefaultOutputCap is how many bytes of a process's output are kept.
const DefaultOutputCap = 16 << 20

// frameHeader is a stored frame's header: the stream (1 byte), then the
// data's length (4 bytes, big-endian).
const frameHeader = 5

// maxFrame bounds one frame's data.
const maxFrame = 64 << 10

// ErrOutputGone is what reading an Output answers once it was removed.
var ErrOutputGone = errors.New("output removed")

// OutputLog is a process's combined stdout and stderr, as an append-only log
// of bytes with offsets that count every byte written since the start,
// in arrival order: they never go back, even after the oldest bytes are
// dropped to keep the log under its cap.
//
// The log is a list of segments, each a run of frames (a stream tag, a
// length, the data) in a file of dir (or in memory when dir is ""). A
// segment is closed at a sixteenth of the cap, and whole segments are
// dropped, oldest first, while the log holds more than the cap of data
// (or twice the cap with the frames' headers): what is kept is at least
// the cap minus about one segment. Readers never hold the lock
// while they read a file: a segment is only appended to while it is the
// last, and a dropped segment reads as an error (a closed file), which a
// reader takes as "dropped" and skips.
type OutputLog struct {
	dir    string // "" keeps the segments in memory
	cap    int64
	segMax int64

	mu      sync.Mutex
	segs    []*segment // oldest first
	stored  int64      // bytes of all segments, headers included
	end     int64      // offset of the next byte to be written
	nextSeq int
	closed  bool          // no more writes: the process ended
	removed bool          // the storage is gone
	changed chan struct{} // closed and replaced at every change
	err     error         // the first write error: writes stop there
	// quota, when set, is charged the bytes the log stores (SetQuota).
	quota Quota
	// truncated, once set, says why output is no longer kept (Truncate);
	// discarded counts the bytes written since and not kept.
	truncated string
	discarded int64
}

// Quota is what an OutputLog's stored bytes (frames' headers included)
// are charged to: a session's disk quota. Its methods are called with the
// log's lock held, so they must not call back into the log.
type Quota interface {
	// Take charges n bytes, or charges nothing and reports false when
	// there is no room for them.
	Take(n int64) bool
	// Give returns n bytes charged earlier.
	Give(n int64)
	// Force charges n bytes whatever the room (bytes already stored).
	Force(n int64)
}

// ErrNoRoom is what a write answers when the log's quota has no room for
// more bytes (nothing of the refused frame is kept).
var ErrNoRoom = errors.New("no room in the disk quota for more output")

// segment is one run of frames: data bytes [base, base+size) of the log.
type segment struct {
	base   int64 // offset of the segment's first data byte
	size   int64 // data bytes (headers not counted)
	stored int64 // bytes in the backing store, headers included
	last   Stream
	store  segmentStore
}

// segmentStore holds one segment's frames.
type segmentStore interface {
	io.ReaderAt
	// append adds p at the end (only the Output's writer calls it).
	append(p []byte) error
	remove() error
}

// NewOutputLog returns an empty output kept under dir (created if needed;
// "" keeps it in memory), holding at most capBytes (<= 0:
// DefaultOutputCap).
func NewOutputLog(dir string, capBytes int64) (*OutputLog, error) {
	if capBytes <= 0 {
		capBytes = DefaultOutputCap
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("output directory: %w", err)
		}
	}
	segMax := max(capBytes/16, 1)
	return &OutputLog{dir: dir, cap: capBytes, segMax: segMax, changed: make(chan struct{})}, nil
}

// OpenOutputLog returns the output kept under dir by an earlier
// OutputLog (a gateway before a restart), with its offsets as they were,
// to be written on. A frame cut short at the end of the last segment (the
// gateway died in the middle of writing it) is dropped.
func OpenOutputLog(dir string, capBytes int64) (*OutputLog, error) {
	o, err := NewOutputLog(dir, capBytes)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("output directory: %w", err)
	}
	for _, e := range entries { // sorted by name: by sequence
		seq, base, ok := segmentName(e.Name())
		if !ok {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, e.Name()), os.O_RDWR, 0)
		if err != nil {
			o.closeStores()
			return nil, fmt.Errorf("output segment: %w", err)
		}
		seg := &segment{base: base, store: &fileStore{f: f}}
		if err := seg.scan(f); err != nil {
			f.Close()
			o.closeStores()
			return nil, err
		}
		if n := len(o.segs); n > 0 && o.segs[n-1].base+o.segs[n-1].size != base {
			// A gap (a segment lost): the older ones cannot be read in order.
			o.closeStores()
			o.segs, o.stored = nil, 0
		}
		o.segs = append(o.segs, seg)
		o.stored += seg.stored
		o.end = base + seg.size
		o.nextSeq = seq
	}
	return o, nil
}

// segmentName parses a segment file's name (seg-SEQ-BASE): its sequence
// and the data offset it starts at; ok false for any other name.
func segmentName(name string) (seq int, base int64, ok bool) {
	if n, _ := fmt.Sscanf(name, "seg-%08d-%d", &seq, &base); n != 2 || fmt.Sprintf("seg-%08d-%d", seq, base) != name {
		return 0, 0, false
	}
	return seq, base, true
}

// readFrameHeader reads the next frame's header from a recovered segment:
// its stream and data length; ok false at the segment's end, a torn
// header, or one no writer made (a stream other than stdout or stderr, a
// length over maxFrame), where the segment's good frames end.
func readFrameHeader(br *bufio.Reader) (stream Stream, n int64, ok bool) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return 0, 0, false
	}
	stream, n = Stream(hdr[0]), int64(binary.BigEndian.Uint32(hdr[1:]))
	if n > maxFrame || (stream != Stdout && stream != Stderr) {
		return 0, 0, false
	}
	return stream, n, true
}

// scan reads a recovered segment's frames: its size, stored bytes and
// last stream; a torn last frame is cut off.
func (seg *segment) scan(f *os.File) error {
	fs := seg.store.(*fileStore)
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		stream, n, ok := readFrameHeader(br)
		if !ok {
			break
		}
		if _, err := br.Discard(int(n)); err != nil {
			break
		}
		seg.stored += frameHeader + n
		seg.size += n
		seg.last = stream
	}
	fs.size = seg.stored
	if err := f.Truncate(seg.stored); err != nil {
		return fmt.Errorf("output segment: %w", err)
	}
	return nil
}

// closeStores closes the segments' files without removing them.
func (o *OutputLog) closeStores() {
	for _, s := range o.segs {
		if fs, ok := s.store.(*fileStore); ok {
			fs.f.Close()
		}
	}
}

// Stored is how many bytes the output takes in its store, frames'
// headers included.
func (o *OutputLog) Stored() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stored
}

// SetQuota charges the log's stored bytes to q from now on, what it
// stores already included (whatever q's room: it is on disk).
func (o *OutputLog) SetQuota(q Quota) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.quota != nil || o.removed {
		return
	}
	o.quota = q
	q.Force(o.stored)
}

// Write appends p as written by stream. After a storage error, or once the
// output is closed or removed, Write keeps nothing and returns the error;
// once truncated it keeps nothing and counts p as discarded. ErrNoRoom:
// the quota took no more (what went before is kept).
func (o *OutputLog) Write(stream Stream, p []byte) error {
	_, err := o.write(stream, p)
	return err
}

// write is Write, and how many bytes of p it kept (or discarded, once
// truncated).
func (o *OutputLog) write(stream Stream, p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.removed:
		return 0, ErrOutputGone
	case o.closed:
		return 0, errors.New("output closed")
	case o.err != nil:
		return 0, o.err
	case o.truncated != "":
		o.discarded += int64(len(p))
		return len(p), nil
	}
	done := 0
	var err error
	for done < len(p) {
		n := min(len(p)-done, maxFrame)
		if err = o.appendFrame(stream, p[done:done+n]); err != nil {
			if !errors.Is(err, ErrNoRoom) {
				o.err = err
			}
			break
		}
		done += n
	}
	if done > 0 {
		o.notify()
	}
	return done, err
}

// Truncate stops keeping output, for reason (a code such as "disk_full"):
// what is kept stays, later writes are counted as discarded, and readers
// at the end are told (Chunk.Truncated). The first reason stays.
func (o *OutputLog) Truncate(reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.truncated == "" && !o.removed {
		o.truncated = reason
		o.notify()
	}
}

// Truncated says why output is no longer kept ("": it is), and how many
// bytes were written since and not kept.
func (o *OutputLog) Truncated() (reason string, discarded int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.truncated, o.discarded
}

// DropKept drops every byte kept of a complete output (Close), freeing
// its storage and its charge to the quota; its offsets stay, and readers
// are told what was dropped (Chunk.Dropped), as for bytes past the cap.
// It reports how many bytes it freed.
func (o *OutputLog) DropKept() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed || o.removed || len(o.segs) == 0 {
		return 0
	}
	freed := o.stored
	for len(o.segs) > 0 {
		o.dropOldest()
	}
	o.notify()
	return freed
}

// restoreEnd sets the end offset of a reopened log that kept no bytes
// (DropKept) to what it was.
func (o *OutputLog) restoreEnd(end int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.segs) == 0 && end > o.end {
		o.end = end
	}
}

// restoreTruncated marks a reopened log as truncated as it was.
func (o *OutputLog) restoreTruncated(reason string, discarded int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.truncated, o.discarded = reason, discarded
}

func (o *OutputLog) appendFrame(stream Stream, data []byte) error {
	if o.quota != nil {
		need := int64(frameHeader + len(data))
		for !o.quota.Take(need) {
			// A log at its cap drops its oldest segment for this frame
			// anyway: drop it first, as the cap does.
			if len(o.segs) < 2 || (o.end+int64(len(data))-o.segs[0].base <= o.cap && o.stored+need <= 2*o.cap) {
				return ErrNoRoom
			}
			o.dropOldest()
		}
	}
	if err := o.appendCharged(stream, data); err != nil {
		if o.quota != nil {
			o.quota.Give(int64(frameHeader + len(data)))
		}
		return err
	}
	return nil
}

// dropOldest drops the oldest segment; o.mu is held.
func (o *OutputLog) dropOldest() {
	old := o.segs[0]
	o.segs = o.segs[1:]
	o.stored -= old.stored
	if o.quota != nil {
		o.quota.Give(old.stored)
	}
	_ = old.store.remove()
}

func (o *OutputLog) appendCharged(stream Stream, data []byte) error {
	last := len(o.segs) - 1
	if last < 0 || o.segs[last].stored >= o.segMax {
		st, err := o.newStore()
		if err != nil {
			return err
		}
		o.segs = append(o.segs, &segment{base: o.end, store: st})
		last = len(o.segs) - 1
	}
	seg := o.segs[last]
	buf := make([]byte, frameHeader+len(data))
	buf[0] = byte(stream)
	binary.BigEndian.PutUint32(buf[1:frameHeader], uint32(len(data)))
	copy(buf[frameHeader:], data)
	if err := seg.store.append(buf); err != nil {
		return fmt.Errorf("keep output: %w", err)
	}
	seg.stored += int64(len(buf))
	seg.size += int64(len(data))
	seg.last = stream
	o.stored += int64(len(buf))
	o.end += int64(len(data))
	// The cap counts data bytes; stored bytes (with the frames' headers,
	// which tiny writes inflate) are bounded at twice it.
	for len(o.segs) > 1 && (o.end-o.segs[0].base > o.cap || o.stored > 2*o.cap) {
		o.dropOldest()
	}
	return nil
}

func (o *OutputLog) newStore() (segmentStore, error) {
	o.nextSeq++
	if o.dir == "" {
		return &memStore{}, nil
	}
	// The name holds the segment's base offset, so that OpenOutputLog
	// finds the offsets again after a restart.
	f, err := os.OpenFile(filepath.Join(o.dir, fmt.Sprintf("seg-%08d-%d", o.nextSeq, o.end)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("new output segment: %w", err)
	}
	return &fileStore{f: f}, nil
}

// notify wakes every follower; o.mu is held.
func (o *OutputLog) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// Close marks the output complete: followers read to its end and stop.
func (o *OutputLog) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		o.notify()
	}
}

// Remove frees the output's storage (its files, and dir when it is then
// empty); readers get ErrOutputGone. It is idempotent.
func (o *OutputLog) Remove() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.removed {
		return nil
	}
	o.removed, o.closed = true, true
	var errs []error
	for _, s := range o.segs {
		errs = append(errs, s.store.remove())
	}
	if o.quota != nil {
		o.quota.Give(o.stored)
	}
	o.segs, o.stored = nil, 0
	if o.dir != "" {
		if err := os.Remove(o.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	o.notify()
	return errors.Join(errs...)
}

// End is the offset the next byte written will have: how many bytes were
// ever written.
func (o *OutputLog) End() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.end
}

// Closed reports whether the output is complete (Close or Remove).
func (o *OutputLog) Closed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.closed
}

// Start is the offset of the oldest byte kept.
func (o *OutputLog) Start() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.startLocked()
}

func (o *OutputLog) startLocked() int64 {
	if len(o.segs) == 0 {
		return o.end
	}
	return o.segs[0].base
}

// Chunk is a run of bytes of one stream, as a Reader returns them.
type Chunk struct {
	// Dropped, when not 0, says that many bytes before Offset were asked
	// for but are no longer kept; Data is then empty.
	Dropped int64
	Offset  int64
	Stream  Stream
	Data    []byte
	// Truncated, when set, says why the output's bytes from Offset on are
	// not kept (OutputLog.Truncate); Data is then empty. A reader is told
	// once, when it reaches the end of what was kept.
	Truncated string
}

// maxChunk bounds the data of one Chunk.
const maxChunk = 32 << 10

// Reader reads an Output from an offset on. One goroutine uses a Reader;
// any number of Readers may read one Output at once.
type Reader struct {
	o   *OutputLog
	off int64
	seg *segment // the segment that holds off, when known
	// cur, pos and frameOff are a cursor into segment cur: the frame at
	// byte pos of its store holds data from offset frameOff on.
	cur      *segment
	pos      int64
	frameOff int64
	// toldTruncated: the reader returned the Truncated chunk.
	toldTruncated bool
}

// NewReader returns a reader from offset off (clamped to [0, End]; an
// offset below Start reads as a Dropped chunk first).
func (o *OutputLog) NewReader(off int64) *Reader {
	o.mu.Lock()
	defer o.mu.Unlock()
	off = max(0, min(off, o.end))
	return &Reader{o: o, off: off}
}

// Offset is the offset of the next byte Next returns.
func (r *Reader) Offset() int64 { return r.off }

// Next returns the next chunk. Without follow, or once the output is
// closed, it returns io.EOF at the end of what was written; with follow it
// waits for more until ctx ends. It never splits a UTF-8 sequence of a
// stream's text (unless the stream changes or ends right after it), so that
// a chunk of text is valid UTF-8 on its own.
func (r *Reader) Next(ctx context.Context, follow bool) (Chunk, error) {
	for {
		c, wait, err := r.next()
		if err != nil || wait == nil {
			return c, err
		}
		if !follow {
			// The end of what was written (or only part of a UTF-8
			// sequence is there, which more output may complete): the
			// end for now.
			return Chunk{}, io.EOF
		}
		select {
		case <-ctx.Done():
			return Chunk{}, ctx.Err()
		case <-wait:
		}
	}
}

// next returns a chunk, or a channel to wait on for more, or io.EOF.
func (r *Reader) next() (Chunk, <-chan struct{}, error) {
	o := r.o
	o.mu.Lock()
	if o.removed {
		o.mu.Unlock()
		return Chunk{}, nil, ErrOutputGone
	}
	start, end, closed, changed := o.startLocked(), o.end, o.closed, o.changed
	if r.off < start {
		dropped := start - r.off
		r.off, r.seg = start, nil
		o.mu.Unlock()
		return Chunk{Dropped: dropped, Offset: start}, nil, nil
	}
	if r.off >= end {
		truncated := o.truncated
		o.mu.Unlock()
		if truncated != "" && !r.toldTruncated {
			r.toldTruncated = true
			return Chunk{Offset: end, Truncated: truncated}, nil, nil
		}
		if closed {
			return Chunk{}, nil, io.EOF
		}
		return Chunk{}, changed, nil
	}
	if r.seg == nil || r.off < r.seg.base || r.off >= r.seg.base+r.seg.size || !o.holds(r.seg) {
		i := sort.Search(len(o.segs), func(i int) bool { return o.segs[i].base+o.segs[i].size > r.off })
		r.seg = o.segs[i]
	}
	seg := r.seg
	segEnd, segStored := seg.base+seg.size, seg.stored
	isLast := seg == o.segs[len(o.segs)-1]
	var nextStream Stream // the stream right after this segment, 0 if unknown
	if !isLast {
		nextStream = o.firstStream(seg)
	}
	o.mu.Unlock()

	c, next, err := r.readRun(seg, segEnd, segStored)
	if err != nil {
		// A store error is a segment dropped while we read it: start over,
		// which reports what was dropped.
		r.seg = nil
		o.mu.Lock()
		gone := o.removed || !o.holds(seg)
		o.mu.Unlock()
		if gone {
			return r.next()
		}
		return Chunk{}, nil, err
	}
	if next == 0 {
		next = nextStream
	}
	// What follows is unknown (the end) and may still come: do not end a
	// chunk of text inside a UTF-8 sequence.
	more := next == c.Stream || (next == 0 && !closed && isLast)
	if more {
		if k := incompleteTail(c.Data); k > 0 {
			c.Data = c.Data[:len(c.Data)-k]
		}
	}
	// A chunk that starts inside a sequence (the caller asked for an
	// offset in one) gives those bytes on their own.
	if k := leadingContinuation(c.Data); k > 0 && k < len(c.Data) {
		c.Data = c.Data[:k]
	}
	if len(c.Data) == 0 {
		// Only part of a sequence is there: wait for the rest.
		return Chunk{}, changed, nil
	}
	// Validate against drops that happened while we read.
	o.mu.Lock()
	start = o.startLocked()
	removed := o.removed
	o.mu.Unlock()
	if removed {
		return Chunk{}, nil, ErrOutputGone
	}
	if c.Offset < start {
		r.seg = nil
		return r.next()
	}
	r.off = c.Offset + int64(len(c.Data))
	return c, nil, nil
}

// holds reports whether seg is still one of the output's; o.mu is held.
func (o *OutputLog) holds(seg *segment) bool {
	return len(o.segs) > 0 && seg.base >= o.segs[0].base
}

// firstStream is the stream of the segment after seg; o.mu is held.
func (o *OutputLog) firstStream(seg *segment) Stream {
	for i, s := range o.segs {
		if s == seg && i+1 < len(o.segs) {
			var h [1]byte
			if _, err := o.segs[i+1].store.ReadAt(h[:], 0); err == nil {
				return Stream(h[0])
			}
		}
	}
	return 0
}

// readRun reads, from r.off in seg, the frames of one stream up to
// maxChunk bytes. next is the stream of the frame after the run when it
// was seen (0: the segment's end). It starts at the reader's cursor when
// that is in seg, else at the segment's start, and leaves the cursor at
// the frame that holds the run's end.
func (r *Reader) readRun(seg *segment, segEnd, segStored int64) (c Chunk, next Stream, err error) {
	pos, frameOff := int64(0), seg.base
	if r.cur == seg && r.frameOff <= r.off {
		pos, frameOff = r.pos, r.frameOff
	}
	br := bufio.NewReaderSize(io.NewSectionReader(seg.store, pos, segStored-pos), 64<<10)
	var hdr [frameHeader]byte
	c.Offset = r.off
	defer func() { r.cur, r.pos, r.frameOff = seg, pos, frameOff }()
	for frameOff < segEnd {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return Chunk{}, 0, fmt.Errorf("read output: %w", err)
		}
		stream, n := Stream(hdr[0]), int64(binary.BigEndian.Uint32(hdr[1:]))
		if frameOff+n <= r.off { // wholly before the reader's offset
			if _, err := br.Discard(int(n)); err != nil {
				return Chunk{}, 0, fmt.Errorf("read output: %w", err)
			}
			pos += frameHeader + n
			frameOff += n
			continue
		}
		if c.Stream == 0 {
			c.Stream = stream
		} else if stream != c.Stream {
			return c, stream, nil
		}
		skip := max(0, c.Offset+int64(len(c.Data))-frameOff)
		if skip > 0 {
			if _, err := br.Discard(int(skip)); err != nil {
				return Chunk{}, 0, fmt.Errorf("read output: %w", err)
			}
		}
		want := min(n-skip, int64(maxChunk-len(c.Data)))
		buf := make([]byte, want)
		if _, err := io.ReadFull(br, buf); err != nil {
			return Chunk{}, 0, fmt.Errorf("read output: %w", err)
		}
		c.Data = append(c.Data, buf...)
		if skip+want < n {
			return c, stream, nil // the frame goes on: same stream
		}
		pos += frameHeader + n
		frameOff += n
		if len(c.Data) >= maxChunk {
			break
		}
	}
	return c, 0, nil
}

// incompleteTail is how many bytes at the end of p are the start of a
// UTF-8 sequence that is not complete, when p is text otherwise.
func incompleteTail(p []byte) int {
	for k := 1; k <= 3 && k <= len(p); k++ {
		b := p[len(p)-k]
		if b < 0x80 {
			return 0
		}
		if utf8.RuneStart(b) {
			if !utf8.FullRune(p[len(p)-k:]) {
				return k
			}
			return 0
		}
	}
	return 0
}

// leadingContinuation is how many UTF-8 continuation bytes (at most 3)
// p starts with.
func leadingContinuation(p []byte) int {
	k := 0
	for k < len(p) && k < 3 && !utf8.RuneStart(p[k]) {
		k++
	}
	return k
}

// memStore keeps a segment in memory.
type memStore struct {
	mu  sync.RWMutex
	buf []byte
}

func (m *memStore) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.buf == nil {
		return 0, ErrOutputGone
	}
	if off >= int64(len(m.buf)) {
		return 0, io.EOF
	}
	n := copy(p, m.buf[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memStore) append(p []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buf == nil {
		m.buf = make([]byte, 0, len(p))
	}
	m.buf = append(m.buf, p...)
	return nil
}

func (m *memStore) remove() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.buf = nil
	return nil
}

// fileStore keeps a segment in a file; reads of what was appended need no
// lock (pread), and a removed store reads as an error.
type fileStore struct {
	f    *os.File
	size int64 // only the writer touches it
}

func (s *fileStore) ReadAt(p []byte, off int64) (int, error) { return s.f.ReadAt(p, off) }

func (s *fileStore) append(p []byte) error {
	n, err := s.f.WriteAt(p, s.size)
	s.size += int64(n)
	return err
}

func (s *fileStore) remove() error {
	name := s.f.Name()
	cerr := s.f.Close()
	if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return cerr
}

// copyOutputUpTo copies the segments of the output kept in directory
// from into directory to, up to data offset end (a fork's copy of a
// process's output as it was at its checkpoint: Processes.Fork).
func copyOutputUpTo(from, to string, end int64) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	for _, e := range entries {
		_, base, ok := segmentName(e.Name())
		if !ok || base >= end {
			continue
		}
		if err := copySegmentUpTo(filepath.Join(from, e.Name()), filepath.Join(to, e.Name()), end-base); err != nil {
			return err
		}
	}
	return nil
}

// copySegmentUpTo copies segment file from to a new file to, its frames
// up to limit data bytes (the last one cut there). A torn frame ends it,
// as OpenOutputLog would.
func copySegmentUpTo(from, to string, limit int64) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("output segment: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("output segment: %w", err)
	}
	br := bufio.NewReaderSize(in, 64<<10)
	bw := bufio.NewWriterSize(out, 64<<10)
	var hdr [frameHeader]byte
	for limit > 0 {
		stream, n, ok := readFrameHeader(br)
		if !ok {
			break
		}
		n = min(n, limit)
		hdr[0] = byte(stream)
		binary.BigEndian.PutUint32(hdr[1:], uint32(n))
		if _, err := bw.Write(hdr[:]); err != nil {
			out.Close()
			return fmt.Errorf("output segment: %w", err)
		}
		if _, err := io.CopyN(bw, br, n); err != nil {
			break // torn: the copy's last frame is too, and dropped when opened
		}
		limit -= n
	}
	if err := bw.Flush(); err != nil {
		out.Close()
		return fmt.Errorf("output segment: %w", err)
	}
	return out.Close()
}
