package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"os"
	"strings"
	"testing"
)

// spliceIn moves a pipe's bytes to a TCP socket whole and in order, and
// ends at EOF on the pipe; anything but a pipe it leaves to the caller.
func TestProxySpliceIn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := make([]byte, 8<<20+123)
	_, _ = rand.Read(want)
	go func() {
		_, _ = w.Write(want)
		w.Close()
	}()
	handled, err := spliceIn(conn, r)
	if !handled || err != nil {
		t.Fatalf("spliceIn from a pipe: handled %v, err %v", handled, err)
	}
	_ = conn.(*net.TCPConn).CloseWrite()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("received %d bytes, want the %d written", len(b), len(want))
	}
	if handled, err := spliceIn(conn, strings.NewReader("x")); handled || err != nil {
		t.Errorf("spliceIn from a strings.Reader: handled %v, err %v; want it left to the caller", handled, err)
	}
}
