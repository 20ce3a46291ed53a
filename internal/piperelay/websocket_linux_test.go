package piperelay

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// wsFrame is a server's frame (unmasked).
func wsFrame(fin bool, op byte, payload []byte) []byte {
	h := []byte{op, 0}
	if fin {
		h[0] |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		h[1] = byte(n)
	case n < 1<<16:
		h[1] = 126
		h = binary.BigEndian.AppendUint16(h, uint16(n))
	default:
		h[1] = 127
		h = binary.BigEndian.AppendUint64(h, uint64(n))
	}
	return append(h, payload...)
}

// readClientFrame reads one masked frame from r (the relay's side).
func readClientFrame(r io.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	if h[1]&0x80 == 0 {
		return 0, nil, errors.New("an unmasked frame from the client")
	}
	if h[0]&0x80 == 0 {
		return 0, nil, errors.New("a fragmented frame from the client")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	op = h[0] & 0x0f
	if op >= opClose && n > 125 {
		return 0, nil, errors.New("a long control frame")
	}
	var key [4]byte
	if _, err := io.ReadFull(r, key[:]); err != nil {
		return 0, nil, err
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	for i := range payload {
		payload[i] ^= key[i%4]
	}
	return op, payload, nil
}

// The gateway's data frames (a message in fragments, an empty frame, the
// three length encodings, a ping between them, each written in pieces)
// reach ssh's pipe whole and in order; the ping is answered with a
// masked pong; the gateway's close frame is answered and ends the relay;
// ssh's bytes go through up.
func TestRelayWebSocket(t *testing.T) {
	client, server := relayPair(t)
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	parts := [][]byte{make([]byte, 100), make([]byte, 40<<10), make([]byte, 3<<20+7), make([]byte, 70<<10)}
	var want []byte
	for _, p := range parts {
		_, _ = rand.Read(p)
		want = append(want, p...)
	}
	stream := wsFrame(false, opBinary, parts[0])
	stream = append(stream, wsFrame(true, opPing, []byte("hi"))...) // between a message's frames, as RFC 6455 allows
	stream = append(stream, wsFrame(false, opContinuation, parts[1])...)
	stream = append(stream, wsFrame(true, opContinuation, nil)...)
	stream = append(stream, wsFrame(true, opBinary, parts[2])...)
	stream = append(stream, wsFrame(true, opBinary, parts[3])...)
	closeFrame := wsFrame(true, opClose, []byte{0x03, 0xe8, 'b', 'y', 'e'})

	done := make(chan error, 1)
	go func() {
		handled, err := RelayWebSocket(func() (net.Conn, bool) { return client, true }, inR, outW)
		if !handled {
			err = errors.New("not handled")
		}
		done <- err
	}()
	// What ssh gets.
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(outR, int64(len(want))))
		got <- b
	}()
	if _, err := inW.Write([]byte("ssh says hello")); err != nil {
		t.Fatal(err)
	}
	// The gateway writes its frames in pieces that cut headers in two.
	for p := stream; len(p) > 0; {
		n := min(len(p), 1+len(p)%4093)
		if _, err := server.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	// ssh's bytes (one binary message) and the ping's answer, in either
	// order.
	var pong, data []byte
	for pong == nil || data == nil {
		op, payload, err := readClientFrame(server)
		switch {
		case err != nil:
			t.Fatal(err)
		case op == opPong && pong == nil:
			pong = payload
		case op == opBinary && data == nil:
			data = payload
		default:
			t.Fatalf("unexpected frame from the relay: opcode %d %q", op, payload)
		}
	}
	if string(pong) != "hi" || string(data) != "ssh says hello" {
		t.Fatalf("the relay sent a pong %q (want \"hi\") and %q up (want \"ssh says hello\")", pong, data)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("ssh got %d bytes, not the %d the data frames carried", len(b), len(want))
	}
	if _, err := server.Write(closeFrame); err != nil {
		t.Fatal(err)
	}
	op, payload, err := readClientFrame(server)
	if err != nil || op != opClose || !bytes.Equal(payload, []byte{0x03, 0xe8}) {
		t.Fatalf("answer to the close: opcode %d %x %v, want a close 1000", op, payload, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not end at the gateway's close frame")
	}
}

// EOF on stdin sends a close frame; the relay still moves what the
// gateway sends until its own close, which it does not answer again.
func TestRelayWebSocketStdinEOF(t *testing.T) {
	client, server := relayPair(t)
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, err := RelayWebSocket(func() (net.Conn, bool) { return client, true }, inR, outW)
		done <- err
	}()
	inW.Close()
	op, payload, err := readClientFrame(server)
	if err != nil || op != opClose || !bytes.Equal(payload, []byte{0x03, 0xe8}) {
		t.Fatalf("after stdin's EOF: opcode %d %x %v, want a close 1000", op, payload, err)
	}
	if _, err := server.Write(append(wsFrame(true, opBinary, []byte("last words")), wsFrame(true, opClose, []byte{0x03, 0xe8})...)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len("last words"))
	if _, err := io.ReadFull(outR, b); err != nil || string(b) != "last words" {
		t.Fatalf("ssh got %q %v", b, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := server.Read(make([]byte, 16)); n != 0 || err == nil {
		t.Fatalf("the relay answered the gateway's close after its own (%d bytes, %v)", n, err)
	}
}

// A frame the gateway must not send (RFC 6455: text, masked, reserved
// bits, a 64-bit length with its top bit set, a long ping, fragments out
// of order, a close frame with a 1-byte payload, a status a peer may not
// send or a reason that is not UTF-8) is an error, and the relay's close
// frame says why (1002, or 1007 for the reason; never 1005 or 1006).
// The gateway's end inside a frame or a fragmented message is an error
// too (ssh would otherwise take a cut stream for a finished one); at a
// message's boundary it is the relay's end. A relay without pipes takes
// nothing.
func TestRelayWebSocketRefuses(t *testing.T) {
	closeOf := func(code uint16, reason string) []byte {
		return wsFrame(true, opClose, append(binary.BigEndian.AppendUint16(nil, code), reason...))
	}
	cat := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	for _, c := range []struct {
		name   string
		stream []byte
		code   uint16 // the relay's close frame's status; 0: none sent, nor an error
		eof    bool   // a cut stream: an error, no close frame
	}{
		{"text", wsFrame(true, opText, []byte("x")), closeProtocol, false},
		{"masked", []byte{0x82, 0x81, 1, 2, 3, 4, 'x'}, closeProtocol, false},
		{"reserved", []byte{0xc2, 0x01, 'x'}, closeProtocol, false},
		{"opcode 3", []byte{0x83, 0x00}, closeProtocol, false},
		{"64-bit length top bit", []byte{0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 1, 'x'}, closeProtocol, false},
		{"long ping", wsFrame(true, opPing, make([]byte, 126)), closeProtocol, false},
		{"fragmented ping", wsFrame(false, opPing, []byte("x")), closeProtocol, false},
		{"continuation first", wsFrame(true, opContinuation, []byte("x")), closeProtocol, false},
		{"continuation after a whole message", cat(wsFrame(true, opBinary, []byte("a")), wsFrame(true, opContinuation, []byte("b"))), closeProtocol, false},
		{"new message inside one", cat(wsFrame(false, opBinary, []byte("a")), wsFrame(true, opPing, nil), wsFrame(true, opBinary, []byte("b"))), closeProtocol, false},
		{"close of 1 byte", wsFrame(true, opClose, []byte{0x03}), closeProtocol, false},
		{"close 1005", closeOf(1005, ""), closeProtocol, false},
		{"close 1006", closeOf(1006, ""), closeProtocol, false},
		{"close 999", closeOf(999, ""), closeProtocol, false},
		{"close 1015", closeOf(1015, ""), closeProtocol, false},
		{"close 5000", closeOf(5000, ""), closeProtocol, false},
		{"close reason not UTF-8", closeOf(1000, "\xff\xfe"), closeBadData, false},
		{"EOF in a header", []byte{0x82, 126, 0x01}, 0, true},
		{"EOF in a payload", wsFrame(true, opBinary, make([]byte, 300))[:100], 0, true},
		{"EOF in a ping's payload", wsFrame(true, opPing, []byte("hello"))[:4], 0, true},
		{"EOF in a fragmented message", wsFrame(false, opBinary, []byte("a")), 0, true},
		{"EOF at a message's end", cat(wsFrame(false, opBinary, []byte("a")), wsFrame(true, opContinuation, []byte("b"))), 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, server := relayPair(t)
			inR, _ := pipe(t)
			_, outW := pipe(t)
			if _, err := server.Write(c.stream); err != nil {
				t.Fatal(err)
			}
			_ = server.CloseWrite() // a relay that took the stream for good ends at its end
			done := make(chan error, 1)
			go func() {
				handled, err := RelayWebSocket(func() (net.Conn, bool) { return client, true }, inR, outW)
				if !handled {
					err = errors.New("not handled")
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the relay did not end")
			}
			if wantErr := c.code != 0 || c.eof; (err != nil) != wantErr {
				t.Fatalf("error %v, want one: %v", err, wantErr)
			}
			if c.eof && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v, want io.ErrUnexpectedEOF", err)
			}
			client.Close()
			op, payload, rerr := readClientFrame(server)
			for rerr == nil && op == opPong { // a ping's answer, before the close
				op, payload, rerr = readClientFrame(server)
			}
			if c.code == 0 {
				if rerr == nil {
					t.Fatalf("the relay sent a frame (opcode %d %x), want none", op, payload)
				}
				return
			}
			if rerr != nil || op != opClose || len(payload) != 2 || binary.BigEndian.Uint16(payload) != c.code {
				t.Fatalf("the relay's last frame: opcode %d %x %v, want a close %d", op, payload, rerr, c.code)
			}
		})
	}
	taken := false
	handled, err := RelayWebSocket(func() (net.Conn, bool) { taken = true; return nil, false }, bytes.NewReader(nil), io.Discard)
	if handled || err != nil || taken {
		t.Fatalf("without pipes: handled %v, err %v, socket taken %v", handled, err, taken)
	}
}

// A close frame is answered with its status alone (none for none: 1005
// is never sent), and a ping after the relay's own close is not.
func TestRelayWebSocketCloseAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		in     []byte
		answer []byte
	}{
		{"no status", nil, []byte{}},
		{"3000 with a reason", append([]byte{0x0b, 0xb8}, "bye"...), []byte{0x0b, 0xb8}},
		{"1001", []byte{0x03, 0xe9}, []byte{0x03, 0xe9}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, server := relayPair(t)
			inR, _ := pipe(t)
			_, outW := pipe(t)
			if _, err := server.Write(wsFrame(true, opClose, c.in)); err != nil {
				t.Fatal(err)
			}
			if _, err := RelayWebSocket(func() (net.Conn, bool) { return client, true }, inR, outW); err != nil {
				t.Fatal(err)
			}
			op, payload, err := readClientFrame(server)
			if err != nil || op != opClose || !bytes.Equal(payload, c.answer) {
				t.Fatalf("answer: opcode %d %x %v, want a close %x", op, payload, err, c.answer)
			}
		})
	}
}

// readDataFrames reads the client's masked binary frames from r until
// want bytes of payload came, and returns them unmasked.
func readDataFrames(r io.Reader, want int) ([]byte, error) {
	var got []byte
	for len(got) < want {
		var h [14]byte
		if _, err := io.ReadFull(r, h[:2]); err != nil {
			return got, err
		}
		if h[1]&0x80 == 0 {
			return got, errors.New("an unmasked frame from the client")
		}
		op := h[0] & 0x0f
		hl := 2
		switch h[1] & 0x7f {
		case 126:
			hl += 2
		case 127:
			hl += 8
		}
		if _, err := io.ReadFull(r, h[2:hl+4]); err != nil {
			return got, err
		}
		var n uint64
		switch l := h[1] & 0x7f; l {
		case 126:
			n = uint64(binary.BigEndian.Uint16(h[2:]))
		case 127:
			n = binary.BigEndian.Uint64(h[2:])
		default:
			n = uint64(l)
		}
		key := h[hl : hl+4]
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			return got, err
		}
		for i := range p {
			p[i] ^= key[i%4]
		}
		if op != opBinary || h[0]&0x80 == 0 {
			return got, fmt.Errorf("a frame of opcode %d (fin %v) from the client, want whole binary messages", op, h[0]&0x80 != 0)
		}
		got = append(got, p...)
	}
	return got, nil
}

// Both ways at once, with a gateway that reads nothing until it has
// written all it sends (as one whose sshd stops reading while its own
// output is stuck): the relay keeps moving the gateway's frames to ssh
// while its upload waits for room, so neither side waits on the other
// for ever. Every byte arrives, in order, each way.
func TestRelayWebSocketBothWaysAtOnce(t *testing.T) {
	client, server := relayPair(t)
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	up := make([]byte, 48<<20+5)
	down := make([]byte, 48<<20+11)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)

	done := make(chan error, 1)
	go func() {
		_, err := RelayWebSocket(func() (net.Conn, bool) { return client, true }, inR, outW)
		done <- err
	}()
	go func() { _, _ = inW.Write(up) }()
	gotDown := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(outR, int64(len(down))))
		gotDown <- b
	}()
	gw := make(chan error, 1)
	gotUp := make(chan []byte, 1)
	go func() {
		for p := down; len(p) > 0; {
			n := min(len(p), 256<<10)
			if _, err := server.Write(wsFrame(true, opBinary, p[:n])); err != nil {
				gw <- err
				return
			}
			p = p[n:]
		}
		b, err := readDataFrames(server, len(up))
		gotUp <- b
		gw <- err
	}()
	select {
	case err := <-gw:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute): // a deadlock, not a slow machine
		t.Fatal("the gateway's writes and the relay's upload wait on each other")
	}
	if b := <-gotUp; !bytes.Equal(b, up) {
		t.Fatalf("the gateway got %d bytes up, not the %d ssh sent", len(b), len(up))
	}
	if b := <-gotDown; !bytes.Equal(b, down) {
		t.Fatalf("ssh got %d bytes down, not the %d the gateway sent", len(b), len(down))
	}
	if _, err := server.Write(wsFrame(true, opClose, []byte{0x03, 0xe8})); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// maskBytes is RFC 6455's masking (byte i XOR key[i%4]) at any length.
func TestMaskBytes(t *testing.T) {
	key := []byte{0x12, 0x34, 0x56, 0x78}
	for n := range 70 {
		p := make([]byte, n)
		_, _ = rand.Read(p)
		want := bytes.Clone(p)
		for i := range want {
			want[i] ^= key[i%4]
		}
		maskBytes(key, p)
		if !bytes.Equal(p, want) {
			t.Fatalf("%d bytes: %x, want %x", n, p, want)
		}
	}
}

// The relay masks every byte ssh sends (the library did, in assembly).
func BenchmarkMaskBytes(b *testing.B) {
	p := make([]byte, upBufSize)
	key := []byte{1, 2, 3, 4}
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		maskBytes(key, p)
	}
}
