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
// an extended-data header) fits, and so does the allocation it rounds up
// to anyway (5 pages). The capacity marks a buffer as pooled: newPacketBuf
// makes every other buffer with a capacity equal to its length, which is
// below pooledPacketMin or above pooledPacketCap.
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

// newPacketBuf returns a buffer of n bytes for a packet of type typ read
// from the connection: a pooled one for channel data of a size in the
// pooled range. Only channel data is ever handed back (writePooled).
func newPacketBuf(typ byte, n int) []byte {
	if (typ != msgChannelData && typ != msgChannelExtendedData) || n < pooledPacketMin || n > pooledPacketCap {
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
