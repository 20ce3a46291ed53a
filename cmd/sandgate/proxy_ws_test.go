package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/tunnel"
)

// sandgate proxy --transport websocket over plain http, between ssh's
// pipes: the gateway's frames reach stdout through the splicing relay
// (the socket is taken from the WebSocket library, whose Read then says
// it is closed), stdin's bytes
// reach the gateway as messages, and stdin's EOF closes the WebSocket.
func TestProxyWebSocketRelays(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the splicing relay is Linux only")
	}
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ctx := context.Background()
		_ = c.Write(ctx, websocket.MessageBinary, []byte("banner\n"))
		_, p, err := c.Read(ctx)
		if err != nil {
			got <- "read: " + err.Error()
			return
		}
		got <- string(p)
		_ = c.Write(ctx, websocket.MessageBinary, append([]byte("echo "), p...))
		_, _, err = c.Read(ctx) // the client's close: the library answers it
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
			t.Errorf("the gateway's read after the message: %v, want the client's close 1000", err)
		}
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := (&tunnel.Dialer{APIURL: srv.URL, Transport: tunnel.TransportWebSocket}).Dial(ctx, "sbx-test")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inR.Close(); inW.Close(); outR.Close(); outW.Close() })

	done := make(chan error, 1)
	go func() { done <- splice(conn, inR, outW) }()
	b := make([]byte, len("banner\n"))
	if _, err := io.ReadFull(outR, b); err != nil || string(b) != "banner\n" {
		t.Fatalf("stdout: %q %v, want the banner", b, err)
	}
	if _, err := inW.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "hello" {
		t.Fatalf("the gateway got %q, want hello", s)
	}
	b = make([]byte, len("echo hello"))
	if _, err := io.ReadFull(outR, b); err != nil || string(b) != "echo hello" {
		t.Fatalf("stdout: %q %v, want the echo", b, err)
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Fatalf("splice: %v", err)
	}
	ws, ok := conn.(interface{ HandedOver() bool })
	if !ok {
		t.Fatalf("the WebSocket conn (%T) cannot hand its socket over", conn)
	}
	if !ws.HandedOver() {
		t.Fatal("the relay did not take the socket: the bytes went through the library")
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a Read of the conn after the relay: %v, want net.ErrClosed (the socket taken)", err)
	}
}
