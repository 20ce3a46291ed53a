package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// The file data plane's bounds under load (issue 34, item 2): slow link
// readers cost the gateway a bounded amount of memory, a session's file
// operations share one sftp-server, transfers are capped and link fetches
// rate-limited.

// gatewayRSS is the gateway process's resident set, in bytes.
func gatewayRSS(t *testing.T, g *gatewayProc) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// putRandomFile writes size random bytes to path in session id.
func putRandomFile(t *testing.T, g *gatewayProc, id, path string, size int) {
	t.Helper()
	data := make([]byte, size)
	r := rand.NewChaCha8([32]byte{1})
	_, _ = r.Read(data)
	res, body := restFile(t, g, http.MethodPut, "/v1/sessions/"+id+"/files?path="+url.QueryEscape(path), bytes.NewReader(data))
	wantStatus(t, "put "+path, res, body, http.StatusCreated, "")
}

// fileLink returns a presigned link to path in session id.
func fileLink(t *testing.T, g *gatewayProc, id, path string) string {
	t.Helper()
	var l struct{ URL string }
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/files/link", map[string]any{"path": path}, &l); code != http.StatusOK || l.URL == "" {
		t.Fatalf("link: %d %+v", code, l)
	}
	return l.URL
}

// stuckReader sends GET link, reads the answer's status line and headers
// (and whatever else fits in 4 KiB), and then never reads again. It
// returns the status.
func stuckReader(t *testing.T, link string) (net.Conn, int, http.Header) {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.RequestURI(), u.Host)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 4096), nil)
	if err != nil {
		t.Fatalf("read the answer's head: %v", err)
	}
	return c, res.StatusCode, res.Header
}

// stuckDownload starts the owner's GET of path in session id that never
// reads past the answer's head (closed at the test's end).
func stuckDownload(t *testing.T, g *gatewayProc, id, path string) int {
	t.Helper()
	u, err := url.Parse(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /v1/sessions/%s/files?path=%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", id, url.QueryEscape(path), u.Host, g.Token)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 4096), nil)
	if err != nil {
		t.Fatalf("read the answer's head: %v", err)
	}
	return res.StatusCode
}

// sftpServers counts the sftp-server processes of workdir session id.
func sftpServers(id string) int {
	n := 0
	for _, pid := range gwtest.TaggedProcesses(id) {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if bytes.Contains(cmdline, []byte("sftp-server")) {
			n++
		}
	}
	return n
}

// TestRESTLinkSlowReadersMemory: 60 link readers that never read the body
// (4 sessions, 15 each: within the default bounds) keep the gateway under
// 240 MB, and each session serves them from one sftp-server. Before, each
// reader held 64 READs of 255 KiB in flight in a pipe (1.84 GB for 60),
// each from its own sftp-server; and with GOGC fixed at 400 the packets'
// garbage took the peak to 270-305 MB (160-170 MB since the heap
// governor, internal/procgov).
func TestRESTLinkSlowReadersMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) { slowReadersMemory(t, driver) })
	}
}

func slowReadersMemory(t *testing.T, driver string) {
	const (
		sessions  = 4
		perLink   = 15
		fileBytes = 48 << 20
		maxRSS    = 240 << 20
	)
	// Link fetches may hold half of a session's transfers: room for 15.
	g := startGateway(t, append(filesDriverArgs(t, driver), "--max-file-transfers-per-session", "32")...)
	var ids, links []string
	for range sessions {
		id := createFilesSession(t, g, nil)
		putRandomFile(t, g, id, "big.bin", fileBytes)
		ids = append(ids, id)
		links = append(links, fileLink(t, g, id, "big.bin"))
	}
	before := gatewayRSS(t, g)

	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	for i := range sessions * perLink {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, status, _ := stuckReader(t, links[i%sessions])
			if status != http.StatusOK {
				t.Errorf("reader %d: status %d", i, status)
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The transfers fill what they may, then stall: watch for 10 s.
	peak := int64(0)
	maxServers := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		peak = max(peak, gatewayRSS(t, g))
		if driver == "workdir" { // its processes are tagged with the session's id
			for _, id := range ids {
				maxServers = max(maxServers, sftpServers(id))
			}
		}
	}
	t.Logf("%s: gateway RSS %d MB before, %d MB at the peak with %d stalled link readers", driver, before>>20, peak>>20, len(conns))
	if driver == "workdir" {
		t.Logf("at most %d sftp-server per session at once", maxServers)
	}
	if peak > maxRSS {
		t.Errorf("gateway RSS peaked at %d MB with %d stalled readers, want under %d MB", peak>>20, len(conns), maxRSS>>20)
	}
	if maxServers > 1 {
		t.Errorf("a session ran %d sftp-servers at once for its downloads, want 1", maxServers)
	}
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(2 * time.Second)
	t.Logf("gateway RSS after the readers left: %d MB", gatewayRSS(t, g)>>20)

	// The session's own calls still work.
	res, body := restFile(t, g, http.MethodGet, "/v1/sessions/"+ids[0]+"/files?path=big.bin", nil, "Range", "bytes=0-9")
	wantStatus(t, "owner's range read", res, body, http.StatusPartialContent, "")
}

// TestRESTFileTransferBounds: past the bound per session, a transfer is
// refused with 503 too_many_file_transfers and Retry-After, while the
// session's other file calls work; a link fetched past its rate limit is
// refused with 429 and Retry-After.
func TestRESTFileTransferBounds(t *testing.T) {
	g := startGateway(t, "--max-file-transfers-per-session", "2", "--link-fetches-per-minute", "4")
	id := createFilesSession(t, g, nil)
	putRandomFile(t, g, id, "big.bin", 16<<20)
	link := fileLink(t, g, id, "big.bin")
	if _, status, _ := stuckReader(t, link); status != http.StatusOK {
		t.Fatalf("link reader: %d", status)
	}
	// Link fetches hold at most half of the session's transfers: the
	// second is refused, and the owner keeps the other.
	c, status, _ := stuckReader(t, link)
	c.Close()
	if status != http.StatusServiceUnavailable {
		t.Errorf("second link reader: %d, want 503", status)
	}
	if status := stuckDownload(t, g, id, "big.bin"); status != http.StatusOK {
		t.Fatalf("the owner's download: %d", status)
	}
	res, body := restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/files?path=big.bin", nil)
	wantStatus(t, "third download", res, body, http.StatusServiceUnavailable, "too_many_file_transfers")
	if res.Header.Get("Retry-After") == "" {
		t.Errorf("503 without Retry-After: %v", res.Header)
	}
	res, body = restFile(t, g, http.MethodPut, "/v1/sessions/"+id+"/files?path=up.txt", strings.NewReader("x"))
	wantStatus(t, "upload past the bound", res, body, http.StatusServiceUnavailable, "too_many_file_transfers")
	// Metadata calls are no transfers.
	res, body = restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/files?path=.&list=true", nil)
	wantStatus(t, "list", res, body, http.StatusOK, "")
	if n := sftpServers(id); n != 1 {
		t.Errorf("%d sftp-servers for the session, want 1", n)
	}

	// Two fetches so far; two more pass the bound of 4, the next does not.
	for i := range 2 {
		c, status, _ := stuckReader(t, link)
		c.Close()
		if status != http.StatusServiceUnavailable {
			t.Errorf("fetch %d while busy: %d", i, status)
		}
	}
	_, status, hdr := stuckReader(t, link)
	if status != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Errorf("fifth fetch of the link: %d %v, want 429 with Retry-After", status, hdr)
	}
}

// TestRESTLinkFetchesPerIP: link fetches from one address are bounded
// across links (--link-fetches-per-ip), 429 with Retry-After past it.
func TestRESTLinkFetchesPerIP(t *testing.T) {
	g := startGateway(t, "--link-fetches-per-ip", "3")
	id := createFilesSession(t, g, nil)
	putRandomFile(t, g, id, "a.bin", 1000)
	putRandomFile(t, g, id, "b.bin", 1000)
	links := []string{fileLink(t, g, id, "a.bin"), fileLink(t, g, id, "b.bin")}
	for i := range 3 {
		res, err := http.Get(links[i%2])
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("fetch %d: %d", i, res.StatusCode)
		}
	}
	res, err := http.Get(links[1])
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Errorf("fourth fetch from one address: %d %v, want 429 with Retry-After", res.StatusCode, res.Header)
	}
}

// TestRESTLinkFetchesTrustedProxy: behind a --trusted-proxy, link fetches
// are counted per client (the rightmost X-Forwarded-For hop outside the
// trusted ranges), so one client past its bound leaves another its own;
// without the flag the header is the client's to write, and ignored.
func TestRESTLinkFetchesTrustedProxy(t *testing.T) {
	fetch := func(t *testing.T, link, xff string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, link, nil)
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	t.Run("trusted", func(t *testing.T) {
		g := startGateway(t, "--link-fetches-per-ip", "2", "--trusted-proxy", "127.0.0.0/8", "--trusted-proxy", "10.9.0.0/16")
		id := createFilesSession(t, g, nil)
		putRandomFile(t, g, id, "a.bin", 100)
		link := fileLink(t, g, id, "a.bin")
		for i := range 2 {
			if code := fetch(t, link, "192.0.2.1"); code != http.StatusOK {
				t.Fatalf("fetch %d of one client: %d", i, code)
			}
		}
		if code := fetch(t, link, "192.0.2.1"); code != http.StatusTooManyRequests {
			t.Errorf("third fetch of one client: %d, want 429", code)
		}
		// A spoofed leftmost hop does not make another client, the
		// rightmost untrusted one counts; a trusted hop after it is skipped.
		if code := fetch(t, link, "198.51.100.7, 192.0.2.1, 10.9.1.1"); code != http.StatusTooManyRequests {
			t.Errorf("the same client behind two proxies: %d, want 429", code)
		}
		if code := fetch(t, link, "192.0.2.2"); code != http.StatusOK {
			t.Errorf("another client behind the proxy: %d, want 200", code)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		g := startGateway(t, "--link-fetches-per-ip", "2")
		id := createFilesSession(t, g, nil)
		putRandomFile(t, g, id, "a.bin", 100)
		link := fileLink(t, g, id, "a.bin")
		for i, xff := range []string{"192.0.2.1", "192.0.2.2"} {
			if code := fetch(t, link, xff); code != http.StatusOK {
				t.Fatalf("fetch %d: %d", i, code)
			}
		}
		if code := fetch(t, link, "192.0.2.3"); code != http.StatusTooManyRequests {
			t.Errorf("a client naming another address: %d, want 429", code)
		}
	})
}

// TestRESTUploadStall: an upload whose client stops sending is ended
// after --upload-stall-timeout with 408 upload_stalled, and the transfer
// it held is free again; nothing is written.
func TestRESTUploadStall(t *testing.T) {
	g := startGateway(t, "--max-file-transfers-per-session", "1", "--upload-stall-timeout", "1s")
	id := createFilesSession(t, g, nil)
	u, err := url.Parse(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PUT /v1/sessions/%s/files?path=slow.txt HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 1000\r\n\r\n0123456789", id, u.Host, g.Token)
	_ = c.SetReadDeadline(time.Now().Add(90 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled upload: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	wantStatus(t, "stalled upload", res, body, http.StatusRequestTimeout, "upload_stalled")
	res, body = restFile(t, g, http.MethodPut, "/v1/sessions/"+id+"/files?path=next.txt", strings.NewReader("x"))
	wantStatus(t, "the next upload", res, body, http.StatusCreated, "")
	res, body = restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/files?path=slow.txt", nil)
	wantStatus(t, "the stalled file", res, body, http.StatusNotFound, "file_not_found")
}
