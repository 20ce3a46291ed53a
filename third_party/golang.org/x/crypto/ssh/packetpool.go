// sandgate: this file is not in upstream x/crypto (see
// third_party/README.md in the sandgate repository).

package ssh

import "sync"

// Channel data is read into packet buffers from a pool, and a channel's
// buffer hands each one back as soon as its bytes have been read, so a
// bulk transfer reuses a few buffers instead of allocating, and the
// runtime clearing and faulting in, a fresh 32 KiB for every packet.

// pooledPacketCap is the capacity of every pooled packet buffer: the
// largest data packet this package accepts (channelMaxPacket bytes after
// an extended-data header) fits. The capacity marks a buffer as pooled:
// newPacketBuf makes every other buffer with a capacity equal to its
// length, which is below pooledPacketMin or above pooledPacketCap.
const pooledPacketCap = channelMaxPacket + 64

// pooledPacketMin is the smallest packet given a pooled buffer; smaller
// ones cost little to allocate.
const pooledPacketMin = 4 << 10

var packetBufs = sync.Pool{New: func() any {
	b := make([]byte, pooledPacketCap)
	return &b
}}

// newPacketBuf returns a buffer of n bytes for a packet read from the
// connection: a pooled one when n is in the pooled range.
func newPacketBuf(n int) []byte {
	if n < pooledPacketMin || n > pooledPacketCap {
		return make([]byte, n)
	}
	return (*packetBufs.Get().(*[]byte))[:n]
}

// writePooled is write for data read from packet, a buffer from
// newPacketBuf: when it is a pooled one, Read returns it to the pool once
// the data has been read. Nothing else may hold packet.
func (b *buffer) writePooled(data, packet []byte) {
	b.Cond.L.Lock()
	e := &element{buf: data}
	if cap(packet) == pooledPacketCap {
		p := packet[:pooledPacketCap]
		e.pooled = &p
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
