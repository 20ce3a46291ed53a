// sandgate: this file is not in upstream x/crypto (see
// third_party/README.md in the sandgate repository).

package ssh

import (
	"encoding/binary"
	"sync/atomic"
)

// Upstream, every packet the transport's read loop reads goes through the
// incoming channel to the mux's loop, which hands channel data to its
// channel's buffer: two goroutines, and a wake-up of the second (often on
// another thread) for every packet of a bulk transfer. Here the read loop
// puts channel data into its channel's buffer itself when the mux's loop
// has handled everything sent to it before (so the order of the
// connection's messages holds) and the packet is one the loop would take
// without a reply or an error: data or stderr data of an open channel,
// well formed, within the channel's window. Everything else still goes to
// the loop. Putting data in a buffer never blocks and writes nothing to
// the connection, so the read loop never waits on the mux or on a key
// exchange it would have to read for.

// directData is the read loop's side of that hand-off.
type directData struct {
	mux atomic.Pointer[mux] // set once the connection has a mux

	// pending counts the packets sent to incoming whose reader has not
	// yet come back for the next one, which it does once it has handled
	// the last. This rests on incoming having one reader at a time (the
	// authentication, then the mux's loop), which handles a packet fully
	// before it reads the next; packets read before there is a mux count
	// too, and are read by the mux's loop or before it.
	pending atomic.Int32
	taken   bool // the reader holds a packet from incoming (the reader's)
}

// deliver hands p, read by the read loop, straight to its channel and
// reports true when it may; otherwise it counts p as sent to incoming,
// where the read loop then sends it.
func (d *directData) deliver(p []byte) bool {
	if m := d.mux.Load(); m != nil && d.pending.Load() == 0 && m.takeData(p) {
		return true
	}
	d.pending.Add(1)
	return false
}

// handled is called by incoming's reader when it comes back for a packet:
// it has handled the one it took last.
func (d *directData) handled() {
	if d.taken {
		d.taken = false
		d.pending.Add(-1)
	}
}

// takeData writes packet, when it is channel data that mux.onePacket would
// write to a channel's buffer without an error or a reply, to that buffer
// as it would (channel.handleData), and reports whether it did.
func (m *mux) takeData(packet []byte) bool {
	headerLen := 9
	switch {
	case len(packet) < headerLen:
		return false
	case packet[0] == msgChannelData:
	case packet[0] == msgChannelExtendedData:
		headerLen = 13
		// Only stderr: other types credit the window back, a write.
		if len(packet) < headerLen || binary.BigEndian.Uint32(packet[5:]) != 1 {
			return false
		}
	default:
		return false
	}
	length := binary.BigEndian.Uint32(packet[headerLen-4 : headerLen])
	if length == 0 || length > channelMaxPacket || int(length) != len(packet)-headerLen {
		return false
	}
	ch := m.chanList.getChan(binary.BigEndian.Uint32(packet[1:]))
	if ch == nil || !ch.established.Load() {
		return false
	}
	ch.windowMu.Lock()
	if ch.myWindow < length {
		ch.windowMu.Unlock()
		return false
	}
	ch.myWindow -= length
	ch.windowMu.Unlock()
	if headerLen == 13 {
		ch.extPending.writePooled(packet[headerLen:], packet)
	} else {
		ch.pending.writePooled(packet[headerLen:], packet)
	}
	return true
}
