package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// restFile sends one files request to g with the test token.
func restFile(t *testing.T, g *gatewayProc, method, path string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, g.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

func wantStatus(t *testing.T, what string, res *http.Response, body []byte, status int, code string) {
	t.Helper()
	if res.StatusCode != status {
		t.Errorf("%s: %d %.300s, want %d", what, res.StatusCode, body, status)
		return
	}
	if code != "" && !bytes.Contains(body, []byte(`"code":"`+code+`"`)) {
		t.Errorf("%s: %s, want code %s", what, body, code)
	}
}

// createFilesSession creates a session with body (nil: defaults).
func createFilesSession(t *testing.T, g *gatewayProc, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	return s.SessionID
}

func filesDriverArgs(t *testing.T, driver string) []string {
	if driver == "linux" {
		requireLinuxDriver(t)
		return []string{"--sandbox", "linux"}
	}
	return nil
}

func TestRESTFiles(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, filesDriverArgs(t, driver)...)
			id := createFilesSession(t, g, nil)
			base := "/v1/sessions/" + id + "/files?path="

			// Round trip, Range, Last-Modified, mode, mkdirs.
			res, body := restFile(t, g, http.MethodPut, base+"dir/sub/hello.txt&mkdirs=true&mode=0640", strings.NewReader("hello, world"))
			wantStatus(t, "put", res, body, 201, "")
			var e struct {
				Path, Mode, Type string
				SizeBytes        int64
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Mode != "0640" || e.SizeBytes != 12 || e.Path != "dir/sub/hello.txt" {
				t.Errorf("entry %s", body)
			}
			res, body = restFile(t, g, http.MethodGet, base+"dir/sub/hello.txt", nil)
			wantStatus(t, "get", res, body, 200, "")
			lm, err := http.ParseTime(res.Header.Get("Last-Modified"))
			if string(body) != "hello, world" || err != nil || time.Since(lm) > time.Minute || res.Header.Get("Accept-Ranges") != "bytes" {
				t.Errorf("get %q %v", body, res.Header)
			}
			res, body = restFile(t, g, http.MethodGet, base+"dir/sub/hello.txt", nil, "Range", "bytes=7-")
			if res.StatusCode != 206 || string(body) != "world" || res.Header.Get("Content-Range") != "bytes 7-11/12" {
				t.Errorf("range: %d %q %v", res.StatusCode, body, res.Header)
			}
			res, _ = restFile(t, g, http.MethodGet, base+"dir/sub/hello.txt", nil, "If-Modified-Since", lm.Format(http.TimeFormat))
			if res.StatusCode != 304 {
				t.Errorf("If-Modified-Since: %d", res.StatusCode)
			}
			res, body = restFile(t, g, http.MethodGet, base+"dir&list=true&recursive=true", nil)
			if res.StatusCode != 200 || !bytes.Contains(body, []byte(`"path":"dir/sub/hello.txt"`)) || !bytes.Contains(body, []byte(`"mode":"0640"`)) {
				t.Errorf("list: %d %s", res.StatusCode, body)
			}

			// Errors.
			for _, tc := range []struct {
				method, query string
				body          string
				status        int
				code          string
			}{
				{"GET", "nope", "", 404, "file_not_found"},
				{"GET", "dir", "", 409, "is_a_directory"},
				{"GET", "dir/sub/hello.txt&list=true", "", 409, "not_a_directory"},
				{"PUT", "dir/sub/hello.txt/x&mkdirs=true", "x", 409, "not_a_directory"},
				{"PUT", "dir", "x", 409, "is_a_directory"},
				{"PUT", "no/parent", "x", 404, "file_not_found"},
				{"DELETE", "dir", "", 409, "directory_not_empty"},
				{"DELETE", "nope", "", 404, "file_not_found"},
				{"GET", "a%00b", "", 400, "invalid_path"},
				{"PUT", "dir/sub/hello.txt/", "x", 400, "invalid_path"},
				{"PUT", "newdir/", "x", 400, "invalid_path"},
				{"PUT", "x&mode=8", "x", 400, "invalid_parameter"},
			} {
				var rd io.Reader
				if tc.body != "" {
					rd = strings.NewReader(tc.body)
				}
				res, body := restFile(t, g, tc.method, base+tc.query, rd)
				wantStatus(t, tc.method+" "+tc.query, res, body, tc.status, tc.code)
			}

			// Escapes: every one stays inside the sandbox.
			shadow, _ := os.ReadFile("/etc/shadow")
			res, body = restFile(t, g, http.MethodPut, base+"evil&mode=0644", strings.NewReader("x"))
			wantStatus(t, "put evil", res, body, 201, "")
			for _, p := range []string{"../../etc/shadow", "/etc/shadow", "../../../../../../../etc/shadow"} {
				res, body := restFile(t, g, http.MethodGet, base+p, nil)
				if res.StatusCode == 200 && len(shadow) > 0 && bytes.Equal(body, shadow) {
					t.Errorf("read %s: the host's /etc/shadow", p)
				}
				if driver == "workdir" && res.StatusCode != 404 {
					t.Errorf("read %s on workdir: %d, want 404 (nothing in the workdir)", p, res.StatusCode)
				}
			}
			marker := fmt.Sprintf("sandgate-escape-%d", time.Now().UnixNano())
			for _, p := range []string{"../../../../tmp/" + marker, "/tmp/" + marker} {
				res, body := restFile(t, g, http.MethodPut, base+p+"&mkdirs=true", strings.NewReader("x"))
				if res.StatusCode >= 500 {
					t.Errorf("put %s: %d %s", p, res.StatusCode, body)
				}
			}
			if _, err := os.Stat("/tmp/" + marker); err == nil {
				_ = os.Remove("/tmp/" + marker)
				t.Errorf("a PUT escaped to the host's /tmp")
			}

			// An empty file reads as empty.
			res, body = restFile(t, g, http.MethodPut, base+"empty", strings.NewReader(""))
			wantStatus(t, "put empty", res, body, 201, "")
			if res, body = restFile(t, g, http.MethodGet, base+"empty", nil); res.StatusCode != 200 || len(body) != 0 {
				t.Errorf("get empty: %d %q", res.StatusCode, body)
			}
			if driver == "linux" {
				// A file whose size reads as 0 until it is read comes whole.
				res, body = restFile(t, g, http.MethodGet, base+"/proc/meminfo", nil)
				if res.StatusCode != 200 || !bytes.Contains(body, []byte("MemTotal:")) {
					t.Errorf("get /proc/meminfo: %d %q", res.StatusCode, body)
				}
				// The image's files are read-only: 403, not 500.
				res, body = restFile(t, g, http.MethodPut, base+"/usr/sandgate-ro-test", strings.NewReader("x"))
				wantStatus(t, "put on a read-only file system", res, body, 403, "permission_denied")
			}

			// Delete.
			res, body = restFile(t, g, http.MethodDelete, base+"dir&recursive=true", nil)
			wantStatus(t, "delete", res, body, 204, "")

			// An upload aborted mid-body leaves nothing.
			abortUpload(t, g, "/v1/sessions/"+id+"/files?path=aborted.bin")
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, body = restFile(t, g, http.MethodGet, base+".&list=true", nil)
				if !bytes.Contains(body, []byte("sandgate-upload")) && !bytes.Contains(body, []byte("aborted.bin")) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("an aborted upload left %s", body)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// abortUpload starts a PUT that announces 64 MiB, sends 4 MiB and hangs up.
func abortUpload(t *testing.T, g *gatewayProc, path string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(c)
	fmt.Fprintf(w, "PUT %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", path, g.Token, 64<<20)
	_, _ = w.Write(make([]byte, 4<<20))
	_ = w.Flush()
	time.Sleep(200 * time.Millisecond)
	_ = c.Close()
}

// TestRESTFilesDiskFull fills a 16 MiB workspace: 507, and nothing left.
func TestRESTFilesDiskFull(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	id := createFilesSession(t, g, map[string]any{"resources": map[string]any{"diskMiB": 16}})
	base := "/v1/sessions/" + id + "/files?path="
	res, body := restFile(t, g, http.MethodPut, base+"keep", strings.NewReader("keep"))
	wantStatus(t, "put", res, body, 201, "")
	res, body = restFile(t, g, http.MethodPut, base+"huge", io.LimitReader(zeroReader{}, 32<<20))
	wantStatus(t, "fill", res, body, 507, "disk_full")
	res, body = restFile(t, g, http.MethodGet, base+".&list=true", nil)
	if res.StatusCode != 200 || bytes.Contains(body, []byte("huge")) || bytes.Contains(body, []byte("sandgate-upload")) {
		t.Errorf("left after 507: %s", body)
	}
	// The disk is usable again.
	res, body = restFile(t, g, http.MethodPut, base+"small", strings.NewReader("fits"))
	wantStatus(t, "after", res, body, 201, "")
}

// TestRESTFilesTooLarge needs serve's --max-file-bytes.
func TestRESTFilesTooLarge(t *testing.T) {
	g := startGateway(t, "--max-file-bytes", "1048576")
	id := createFilesSession(t, g, nil)
	base := "/v1/sessions/" + id + "/files?path="
	res, body := restFile(t, g, http.MethodPut, base+"big", bytes.NewReader(make([]byte, 1<<20+1)))
	wantStatus(t, "content-length", res, body, 413, "file_too_large")
	// Chunked: counted.
	res, body = restFile(t, g, http.MethodPut, base+"big", io.LimitReader(zeroReader{}, 2<<20))
	wantStatus(t, "chunked", res, body, 413, "file_too_large")
	res, body = restFile(t, g, http.MethodPut, base+"ok", bytes.NewReader(make([]byte, 1<<20)))
	wantStatus(t, "at the cap", res, body, 201, "")
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// patternReader yields a repeating non-zero pattern.
type patternReader struct{ n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(p.n*7 + p.n>>12)
		p.n++
	}
	return len(b), nil
}

// vmRSS is a process's resident set size in bytes.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestRESTFilesLarge streams 1 GiB in and out; the gateway's memory stays
// far below the file's size.
func TestRESTFilesLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer")
	}
	const size = 1 << 30
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, filesDriverArgs(t, driver)...)
			var create map[string]any
			if driver == "linux" { // the default workspace is 1 GiB
				create = map[string]any{"resources": map[string]any{"diskMiB": 2048}}
			}
			id := createFilesSession(t, g, create)
			base := "/v1/sessions/" + id + "/files?path="
			var maxRSS atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if r := vmRSS(g.cmd.Process.Pid); r > maxRSS.Load() {
						maxRSS.Store(r)
					}
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
			in := sha256.New()
			start := time.Now()
			res, body := restFile(t, g, http.MethodPut, base+"big.bin", io.TeeReader(io.LimitReader(&patternReader{}, size), in))
			putTime := time.Since(start)
			wantStatus(t, "put", res, body, 201, "")

			req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions/"+id+"/files?path=big.bin", nil)
			req.Header.Set("Authorization", "Bearer "+g.Token)
			start = time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			out := sha256.New()
			n, err := io.Copy(out, resp.Body)
			_ = resp.Body.Close()
			getTime := time.Since(start)
			close(stop)
			wg.Wait()
			if err != nil || n != size || !bytes.Equal(in.Sum(nil), out.Sum(nil)) || resp.ContentLength != size {
				t.Fatalf("get: %d bytes (Content-Length %d), %v, same bytes %v", n, resp.ContentLength, err, bytes.Equal(in.Sum(nil), out.Sum(nil)))
			}
			t.Logf("1 GiB PUT %v (%.0f MiB/s), GET %v (%.0f MiB/s), gateway VmRSS max %d MiB",
				putTime, 1024/putTime.Seconds(), getTime, 1024/getTime.Seconds(), maxRSS.Load()>>20)
			if maxRSS.Load() == 0 || maxRSS.Load() > 256<<20 {
				t.Errorf("gateway VmRSS reached %d MiB for a 1 GiB file", maxRSS.Load()>>20)
			}
		})
	}
}

// TestRESTFilesFetch needs serve to pass DialPublic (the egress proxy's)
// to the data plane and a --max-fetch-bytes flag.
func TestRESTFilesFetch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	forbidden, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int32
	srvs := []*http.Server{
		{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/redirect":
				http.Redirect(w, r, "http://"+forbidden.Addr().String()+"/secret", http.StatusFound)
			case "/big":
				_, _ = w.Write(make([]byte, 200<<10))
			default:
				w.Header().Set("Content-Disposition", `attachment; filename="report.csv"`)
				_, _ = w.Write([]byte("a,b\n"))
			}
		})},
		{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) })},
	}
	go func() { _ = srvs[0].Serve(ln) }()
	go func() { _ = srvs[1].Serve(forbidden) }()
	t.Cleanup(func() {
		for _, s := range srvs {
			_ = s.Close()
		}
	})
	g := startGateway(t, "--egress-allow-cidr", "127.0.0.2/32", "--egress-resolve", "meta.test=169.254.169.254",
		"--max-fetch-bytes", "102400")
	id := createFilesSession(t, g, nil)
	src := "http://" + ln.Addr().String()
	var out struct {
		Status  string
		Fetched []string
		Errors  []struct{ URL, Error string }
	}
	code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/files/fetch", map[string]any{
		"urls":    []string{src + "/one", src + "/redirect", "http://meta.test/latest/meta-data", src + "/big"},
		"destDir": "data",
	}, &out)
	if code != 200 || out.Status != "partial_success" || len(out.Fetched) != 1 || out.Fetched[0] != "data/report.csv" || len(out.Errors) != 3 {
		t.Fatalf("fetch: %d %+v", code, out)
	}
	for _, e := range out.Errors {
		want := map[string]string{
			src + "/redirect":                   "private address 127.0.0.1",
			"http://meta.test/latest/meta-data": "meta.test:80: resolves to a private address",
			src + "/big":                        "over the limit of 102400 bytes",
		}[e.URL]
		if want == "" || !strings.Contains(e.Error, want) {
			t.Errorf("error for %s: %q, want %q", e.URL, e.Error, want)
		}
	}
	if reached.Load() != 0 {
		t.Error("the redirect reached 127.0.0.1")
	}
	res, body := restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/files?path=data&list=true", nil)
	if res.StatusCode != 200 || !bytes.Contains(body, []byte(`"report.csv"`)) || bytes.Contains(body, []byte("big")) || bytes.Contains(body, []byte("sandgate-upload")) {
		t.Errorf("data/: %s", body)
	}
}
