package tunnel

import (
	"encoding/binary"
	"net"
	"sync"
)

// frameTracker is the connection under a WebSocket tunnel's library: it
// follows the frames of what the client sends (every byte the library
// reads comes through it), so that the gateway knows, for any position in
// the stream, whether it is in a data frame's payload and where that
// ends. The library reads a frame's payload with io.ReadFull, up to the
// size asked: a read of more than is in would wait for the rest of the
// frame.
type frameTracker struct {
	net.Conn
	mu     sync.Mutex
	in     int64 // bytes read from Conn (and the hijack's buffered head)
	hdr    [14]byte
	hn     int     // bytes of hdr collected
	left   int64   // payload bytes of the current frame still to come
	frames []frame // the last maxTrackedFrames, oldest first
}

// frame is one frame's place in the stream: its header starts at hdr,
// its payload is [start, end).
type frame struct {
	hdr, start, end int64
	data            bool // a data frame (binary, text, continuation), not a control one
}

// maxTrackedFrames bounds the frames a tracker keeps: a position before
// the oldest is answered "nothing known" (no read-ahead).
const maxTrackedFrames = 64

func (t *frameTracker) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	t.feed(p[:n])
	return n, err
}

// feed follows the frames in p, the next bytes of the stream.
func (t *frameTracker) feed(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(p) > 0 {
		if t.left > 0 {
			n := min(int64(len(p)), t.left)
			t.left -= n
			t.in += n
			p = p[n:]
			continue
		}
		t.hdr[t.hn] = p[0]
		t.hn++
		t.in++
		p = p[1:]
		need := headerLen(t.hdr[:t.hn])
		if need == 0 || t.hn < need {
			continue
		}
		plen := payloadLen(t.hdr[:need])
		if len(t.frames) == maxTrackedFrames {
			t.frames = append(t.frames[:0], t.frames[1:]...)
		}
		t.frames = append(t.frames, frame{hdr: t.in - int64(need), start: t.in, end: t.in + plen, data: t.hdr[0]&0x0f < 8})
		t.left, t.hn = plen, 0
	}
}

// midFrame reports whether what was read ends inside a frame, its
// header or its payload: a read of the library's under way then waits
// for the rest of that frame (a read at the frame's start holds none of
// it yet).
func (t *frameTracker) midFrame() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hn > 0 || t.left > 0
}

// headerLen is the length of the frame header h starts (0: not known yet).
func headerLen(h []byte) int {
	if len(h) < 2 {
		return 0
	}
	n := 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4 // the mask key
	}
	return n
}

// payloadLen is the payload length the complete header h says.
func payloadLen(h []byte) int64 {
	switch l := h[1] & 0x7f; l {
	case 126:
		return int64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		return int64(min(binary.BigEndian.Uint64(h[2:10]), 1<<62))
	default:
		return int64(l)
	}
}

// available returns how many payload bytes one read of the library at
// stream position pos returns without waiting, when limit bytes of the
// stream can be read without waiting: the rest of the data frame at pos,
// or of the next one (past complete control frames, which the library
// handles itself), up to limit. 0 when that frame's header is not in
// whole; -1 when that frame starts past what was read (its header is at
// the socket's head).
func (t *frameTracker) available(pos, limit int64) int64 {
	for _, f := range t.frames {
		if f.end < pos || (f.end == pos && f.hdr < pos) {
			continue // read already
		}
		if f.hdr > pos {
			return 0 // pos is in a frame no longer tracked
		}
		if pos < f.start {
			if !f.data {
				if f.end > limit {
					return 0
				}
				pos = f.end
				continue
			}
			pos = f.start
		}
		if !f.data {
			return 0
		}
		if f.start == f.end {
			continue // an empty data frame: the library reads on
		}
		return max(0, min(f.end, limit)-pos)
	}
	if pos == t.in && t.hn == 0 && t.left == 0 {
		return -1 // the next frame starts past what was read: at the socket's head
	}
	return 0
}

// availableAt is available for a frame whose header starts head (at
// most 14 bytes, peeked), with limit bytes in: its payload that is in,
// when it is a data frame whose header is complete.
func availableAt(head []byte, limit int64) int64 {
	need := headerLen(head)
	if need == 0 || len(head) < need || head[0]&0x0f >= 8 {
		return 0
	}
	return max(0, min(payloadLen(head[:need]), limit-int64(need)))
}
