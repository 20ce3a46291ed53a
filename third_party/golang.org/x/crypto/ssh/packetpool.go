// sandgate: this file is not in upstream x/crypto (see
// third_party/README.md in the sandgate repository).

package ssh

import (
	"io"
	"sync"
	"unsafe"
)

// Channel data is read into packet buffers from a pool, and a channel's
// buffer hands each one back as soon as its bytes have been read, so a
// bulk transfer reuses a few buffers instead of allocating, and the
// runtime clearing and faulting in, a fresh 32 KiB for every packet. With
// AES-GCM a packet is opened straight into its pooled buffer
// (gcmCipher.readCipherPacket), so its bytes are not copied at all between
// the decryption and the channel's reader.

// pooledPacketCap is the capacity of every pooled buffer: the largest data
// packet this package accepts (channelMaxPacket bytes after an
// extended-data header), with its padding-length byte in front, fits, and
// so does the allocation it rounds up to anyway (5 pages).
const pooledPacketCap = 40 << 10

// pooledPacketMin is the smallest packet given a pooled buffer. Bulk
// senders fill their packets (OpenSSH: 32 KiB of data); a smaller packet
// gets a buffer of its own size, as upstream, so a peer sending packets
// of any size pins at most 1.5 times the memory upstream lets it in a
// channel's window (a pooled buffer is 40 KiB whatever it holds; upstream
// gives a 28 KiB packet 28 KiB).
const pooledPacketMin = 28 << 10

var packetBufs = sync.Pool{New: func() any {
	b := make([]byte, pooledPacketCap)
	return &b
}}

// A packet in a pooled buffer always starts at its second byte, where
// it is when the buffer was opened into (the first holds the padding
// length), so its capacity is pooledPacketCap-1: that marks it as pooled,
// and packetBase finds the buffer from it. Every other packet's buffer has
// a capacity equal to its length, below pooledPacketMin or above
// pooledPacketCap-1.

// newPacketBuf returns a buffer of n bytes for a packet of type typ read
// from the connection: a pooled one for channel data of a size in the
// pooled range. Only channel data is ever handed back (writePooled).
func newPacketBuf(typ byte, n int) []byte {
	if !poolable(typ, n) {
		return make([]byte, n)
	}
	return (*packetBufs.Get().(*[]byte))[1 : 1+n]
}

func poolable(typ byte, n int) bool {
	return (typ == msgChannelData || typ == msgChannelExtendedData) && n >= pooledPacketMin && n < pooledPacketCap
}

// lendPacket returns packet, opened into buf (a pooled buffer) at its
// second byte, when it is channel data of a pooled size; otherwise a copy
// in a buffer of its own, and buf goes back to the pool. Either way the
// packet returned is the caller's.
func lendPacket(packet []byte, buf *[]byte) []byte {
	if len(packet) > 0 && poolable(packet[0], len(packet)) {
		return packet
	}
	fresh := make([]byte, len(packet))
	copy(fresh, packet)
	packetBufs.Put(buf)
	return fresh
}

// packetBase returns the pooled buffer that packet, whose capacity marks
// it as pooled, starts one byte into.
func packetBase(packet []byte) *[]byte {
	b := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(packet)), -1)), pooledPacketCap)
	return &b
}

// writePooled is write for data read from packet, a buffer from
// newPacketBuf or lendPacket: when it is a pooled one, Read returns it to
// the pool once the data has been read. Nothing else may hold packet.
func (b *buffer) writePooled(data, packet []byte) {
	b.Cond.L.Lock()
	e := &element{buf: data}
	if cap(packet) == pooledPacketCap-1 {
		e.pooled = packetBase(packet)
	}
	b.tail.next = e
	b.tail = e
	b.Cond.Signal()
	b.Cond.L.Unlock()
}

// release returns e's packet buffer to the pool, once e's data is read.
func (e *element) release() {
	if e.pooled != nil && len(e.buf) == 0 {
		packetBufs.Put(e.pooled)
		e.pooled, e.buf = nil, nil
	}
}

// ReadBuffers is Read without the copy, for a caller that hands the bytes
// straight on (one writev(2) into a pipe or a socket): it waits until the
// channel has data, or is closed, then calls write with up to max bytes of
// it in place, as consecutive slices (at most 1024), and consumes the first
// n bytes write reports written: they are gone from the channel, their
// packet buffers go back to the pool, and they count towards the window
// adjustment, as after Read. The slices must not be used after write
// returns. It returns n and write's error, or io.EOF once the channel is
// closed and drained. Only one goroutine may read a channel's data at a
// time, by ReadBuffers or Read.
func (c *channel) ReadBuffers(max int, write func([][]byte) (int, error)) (int, error) {
	if !c.decided {
		return 0, errUndecided
	}
	bufs, err := c.pending.peek(max)
	if len(bufs) == 0 {
		return 0, err
	}
	n, err := write(bufs)
	if n > 0 {
		c.pending.consume(n)
		if aerr := c.adjustWindow(uint32(n)); err == nil && aerr != io.EOF {
			// io.EOF: the peer has closed the connection; as with
			// Read, the caller sees it once the buffer is drained.
			err = aerr
		}
	}
	return n, err
}

// maxLentBuffers caps the slices one ReadBuffers lends: writev(2) takes at
// most 1024 (IOV_MAX on Linux and macOS), and a peer sending tiny packets
// would otherwise have one batch hold a slice header for each.
const maxLentBuffers = 1024

// peek waits until b has data or is closed, and returns up to max bytes of
// the data in place, in at most maxLentBuffers slices (nil and io.EOF once
// closed and drained). The head's elements stay put until consume: write
// only appends after the tail.
func (b *buffer) peek(max int) ([][]byte, error) {
	b.Cond.L.Lock()
	defer b.Cond.L.Unlock()
	for {
		for len(b.head.buf) == 0 && b.head != b.tail {
			b.head = b.head.next
		}
		if len(b.head.buf) > 0 {
			break
		}
		if b.closed {
			return nil, io.EOF
		}
		b.Cond.Wait()
	}
	var bufs [][]byte
	for e, n := b.head, 0; e != nil && n < max && len(bufs) < maxLentBuffers; e = e.next {
		if len(e.buf) == 0 {
			continue
		}
		take := min(len(e.buf), max-n)
		bufs = append(bufs, e.buf[:take])
		n += take
	}
	return bufs, nil
}

// consume drops the first n bytes of b's data, which peek returned, and
// hands back each packet buffer it empties.
func (b *buffer) consume(n int) {
	b.Cond.L.Lock()
	defer b.Cond.L.Unlock()
	for n > 0 {
		if len(b.head.buf) == 0 {
			if b.head == b.tail {
				return
			}
			b.head = b.head.next
			continue
		}
		r := min(n, len(b.head.buf))
		b.head.buf = b.head.buf[r:]
		n -= r
		b.head.release()
	}
}
