// Command fakes3 is an S3-compatible server for tests (gofakes3 over a
// bbolt file, so its objects survive a kill and restart). It counts the
// requests it served by method, at GET /_stats, so tests can see what a
// sync uploaded. It is a test tool: no authentication is checked.
//
// Requests that change the store wait for every response in flight, and
// the other way round (see serialized): gofakes3's bbolt backend hands
// out object bytes that still point into bbolt's memory map after their
// transaction, so a write that grows the file, and remaps it, while a GET
// streams them crashes the process with SIGBUS.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	db := flag.String("db", "", "bbolt file that keeps the objects")
	ready := flag.String("ready-file", "", "file to write the URL to once listening")
	flag.Parse()
	if err := run(*listen, *db, *ready); err != nil {
		fmt.Fprintln(os.Stderr, "fakes3:", err)
		os.Exit(1)
	}
}

// counter counts requests by method, and bytes received by PUTs of
// objects.
type counter struct {
	mu       sync.Mutex
	Requests map[string]int `json:"requests"`
	PutBytes int64          `json:"putBytes"`
}

func run(listen, db, ready string) error {
	if db == "" {
		return fmt.Errorf("-db is required")
	}
	backend, err := s3bolt.NewFile(db)
	if err != nil {
		return err
	}
	s3 := gofakes3.New(backend, gofakes3.WithAutoBucket(true)).Server()
	c := &counter{Requests: map[string]int{}}
	var store sync.RWMutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_stats" {
			c.mu.Lock()
			defer c.mu.Unlock()
			_ = json.NewEncoder(w).Encode(c)
			return
		}
		c.mu.Lock()
		c.Requests[r.Method]++
		if r.Method == http.MethodPut && r.ContentLength > 0 {
			c.PutBytes += r.ContentLength
		}
		c.mu.Unlock()
		serialized(&store, r, func() { s3.ServeHTTP(w, r) })
	})
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	if ready != "" {
		tmp := ready + ".tmp"
		if err := os.WriteFile(tmp, []byte(url+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, ready); err != nil {
			return err
		}
	}
	return http.Serve(ln, h)
}

// serialized runs serve, for the whole of its response, under store's
// read lock for a GET or HEAD, and under its write lock otherwise: no
// write commits, and so remaps bbolt's file, while a response that may
// alias the map is being written.
func serialized(store *sync.RWMutex, r *http.Request, serve func()) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		store.RLock()
		defer store.RUnlock()
	} else {
		store.Lock()
		defer store.Unlock()
	}
	serve()
}
