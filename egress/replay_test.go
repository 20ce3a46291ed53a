package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingServer accepts connections on loopback and hands everything
// each one sent, up to its EOF, to got.
func recordingServer(t *testing.T) (port string, got <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan []byte, 4)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				b, _ := io.ReadAll(c)
				ch <- b
			})
		}
	})
	return strconv.Itoa(int(portOf(t, ln.Addr().String()))), ch
}

// clientHello returns the first TLS record a client sends for sni.
func clientHello(t *testing.T, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{ServerName: sni}).Handshake()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// TestConnectReplaysBytesInItsSegment: bytes a client sends in the same
// write as its CONNECT (read by the proxy's HTTP server along with the
// request) all reach upstream, in order, on the plain and the TLS branch.
func TestConnectReplaysBytesInItsSegment(t *testing.T) {
	port, got := recordingServer(t)
	p, _ := newTestProxy(t, Config{AllowCIDRs: loopback, Hosts: hostsFor("a.test")})
	_, proxy := startSession(t, p, "s1", Policy{Allow: mustList(t, "a.test:"+port)}, nil)
	payload := strings.Repeat("0123456789abcdef", 200) // 3200 bytes: most of them buffered
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"plain", []byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n" + payload)},
		{"tls", append(clientHello(t, "a.test"), payload...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", proxy.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			target := "a.test:" + port
			msg := append([]byte(fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)), c.data...)
			if _, err := conn.Write(msg); err != nil { // one write: one segment on loopback
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("CONNECT: %v %v", resp, err)
			}
			conn.(*net.TCPConn).CloseWrite()
			select {
			case b := <-got:
				if !bytes.Equal(b, c.data) {
					t.Errorf("upstream got %d bytes, want the %d sent with the CONNECT (prefix %q)", len(b), len(c.data), b[:min(len(b), 16)])
				}
			case <-time.After(20 * time.Second):
				t.Fatal("upstream got nothing")
			}
		})
	}
}
