//go:build linux

package linuxns

import (
	"encoding/binary"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestPeerlessConns: of a files image's Unix sockets, only an established
// connection with no peer (dumped semi-closed: its gateway end had closed)
// is found, which a restore leaves to CRIU rather than hand back with
// --inherit-fd (given back, CRIU waited for a peer it made up, and the
// resume hung until the timeout killed criu).
func TestPeerlessConns(t *testing.T) {
	usk := func(ino, state, peer uint64) []byte {
		var m []byte
		for _, f := range [][2]uint64{{1, ino + 100}, {2, ino}, {3, 1}, {4, state}, {5, 2}, {6, 0}, {7, 0}, {8, peer}} {
			m = protowire.AppendTag(m, protowire.Number(f[0]), protowire.VarintType)
			m = protowire.AppendVarint(m, f[1])
		}
		return protowire.AppendBytes(protowire.AppendTag(m, 11, protowire.BytesType), nil)
	}
	entry := func(field protowire.Number, msg []byte) []byte {
		var e []byte
		e = protowire.AppendVarint(protowire.AppendTag(e, 1, protowire.VarintType), 5)
		e = protowire.AppendVarint(protowire.AppendTag(e, 2, protowire.VarintType), 7)
		return protowire.AppendBytes(protowire.AppendTag(e, field, protowire.BytesType), msg)
	}
	img := []byte("magicmag")
	for _, e := range [][]byte{
		entry(16, usk(11, 10, 0)),    // the listener
		entry(16, usk(12, 1, 99)),    // a connection whose gateway end is open
		entry(16, usk(13, 1, 0)),     // one whose gateway end had closed
		entry(3, []byte{0x08, 0x01}), // a regular file
	} {
		img = binary.LittleEndian.AppendUint32(img, uint32(len(e)))
		img = append(img, e...)
	}
	got, err := peerlessConns(img)
	if err != nil {
		t.Fatal(err)
	}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, []uint64{13}) {
		t.Errorf("peerless connections %v, want [13]", keys)
	}
	if _, err := peerlessConns(img[:len(img)-3]); err == nil {
		t.Error("a truncated image read without an error")
	}
}
