package main

import (
	"fmt"
	"io"
	"net/http"
	"testing"
)

// The loopback server sends exactly its size, straight and through the relay.
func TestBlobServerAndRelay(t *testing.T) {
	const size = 10<<20 + 123
	srv, err := newBlobServer(size)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	relay, err := newTCPRelay(srv.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer relay.close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	for _, port := range []int{srv.port(), relay.port()} {
		resp, err := (&http.Client{Transport: tr}).Get(fmt.Sprintf("http://127.0.0.1:%d/big", port))
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size || resp.ContentLength != size {
			t.Errorf("port %d: %d bytes (Content-Length %d), %v; want %d", port, n, resp.ContentLength, err, size)
		}
	}
}

func TestParseCurl(t *testing.T) {
	if s, err := parseCurl([]byte("2000000000 1000000000"), 1e9); err != nil || s != 0.5 {
		t.Errorf("got %v, %v; want 0.5 s", s, err)
	}
	if _, err := parseCurl([]byte("2000000000 999"), 1e9); err == nil {
		t.Error("a short download passed")
	}
	if _, err := parseCurl([]byte("curl: (7) failed"), 1e9); err == nil {
		t.Error("garbage passed")
	}
}

func TestShellQuote(t *testing.T) {
	if got := shellQuote(`%{speed_download} it's`); got != `'%{speed_download} it'\''s'` {
		t.Errorf("got %s", got)
	}
}
