package piperelay

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/tcptest"
)

// relayPair is a TCP connection on loopback: client is the proxy's side,
// server the gateway's.
func relayPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	return tcptest.Pair(t)
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// Relay moves both ways at once, whole and in order, through full
// pipes and a full socket (both far ends start reading late); EOF on
// stdin half-closes the socket, and the gateway's close ends the relay.
func TestRelay(t *testing.T) {
	client, server := relayPair(t)
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	up := make([]byte, 16<<20+123)
	down := make([]byte, 12<<20+45)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)

	// The gateway: reads everything ssh sends up to the half-close, while
	// sending its own bytes down, then the sum of what it got, and closes.
	gw := make(chan error, 1)
	go func() {
		defer server.Close()
		time.Sleep(200 * time.Millisecond) // let the socket fill
		sent := make(chan error, 1)
		go func() {
			_, err := server.Write(down)
			sent <- err
		}()
		h := sha256.New()
		if _, err := io.Copy(h, server); err != nil { // ends at the half-close
			gw <- err
			return
		}
		if err := <-sent; err != nil {
			gw <- err
			return
		}
		_, err := server.Write(h.Sum(nil))
		gw <- err
	}()
	go func() {
		_, _ = inW.Write(up)
		inW.Close()
	}()
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(200 * time.Millisecond) // let ssh's pipe fill
		b, _ := io.ReadAll(outR)
		got <- b
	}()
	handled, err := Relay(client, inR, outW)
	if !handled || err != nil {
		t.Fatalf("Relay: handled %v, err %v", handled, err)
	}
	outW.Close()
	if err := <-gw; err != nil {
		t.Fatalf("gateway side: %v", err)
	}
	b := <-got
	sum := sha256.Sum256(up)
	want := append(append([]byte(nil), down...), sum[:]...)
	if !bytes.Equal(b, want) {
		t.Fatalf("ssh got %d bytes, want the %d sent down and the sum of the %d sent up (equal prefix: %v)",
			len(b), len(want), len(up), bytes.HasPrefix(b, down))
	}
}

// When ssh stops reading (its end of the stdout pipe closed), the relay
// ends, quietly: ssh closes its end when a session is over, while the
// gateway may still be sending.
func TestRelayReaderGone(t *testing.T) {
	client, server := relayPair(t)
	inR, _ := pipe(t)
	outR, outW := pipe(t)
	outR.Close()
	go func() { _, _ = server.Write(make([]byte, 4<<20)) }()
	done := make(chan error, 1)
	go func() {
		_, err := Relay(client, inR, outW)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Relay with ssh's stdout gone: %v, want the quiet end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Relay did not end after ssh closed its stdout")
	}
}

// Anything but pipes on ssh's side, or a socket on the gateway's, is left
// to the caller, with nothing moved.
func TestRelayNotPipes(t *testing.T) {
	client, _ := relayPair(t)
	inR, _ := pipe(t)
	_, outW := pipe(t)
	if handled, err := Relay(client, strings.NewReader("x"), outW); handled || err != nil {
		t.Errorf("stdin a strings.Reader: handled %v, err %v; want it left to the caller", handled, err)
	}
	if handled, err := Relay(client, inR, io.Discard); handled || err != nil {
		t.Errorf("stdout io.Discard: handled %v, err %v; want it left to the caller", handled, err)
	}
	var buf bytes.Buffer
	if handled, err := Relay(&buf, inR, outW); handled || err != nil {
		t.Errorf("conn a bytes.Buffer: handled %v, err %v; want it left to the caller", handled, err)
	}
}
