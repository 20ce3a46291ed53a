package compat_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/rest"
)

// asArtifact is an artifact of Agent Sandbox's execute.
type asArtifact struct {
	Path        string `json:"path"`
	SizeBytes   int64  `json:"size_bytes"`
	MimeType    string `json:"mime_type"`
	DownloadURL string `json:"download_url"`
}

// asExecute is Agent Sandbox's execute answer.
type asExecute struct {
	Output    *string      `json:"output"`
	Artifacts []asArtifact `json:"artifacts"`
	Error     *string      `json:"error"`
}

// asCall sends one request to Agent Sandbox's API with hdr ("name",
// "value" pairs) as its only credentials.
func asCall(t testing.TB, g *testGateway, method, path, body string, hdr ...string) compatResp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url+"/compat/agent-sandbox/v1"+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := g.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	if err != nil {
		t.Fatal(err)
	}
	return compatResp{status: res.StatusCode, header: res.Header, body: data}
}

// getURL GETs a full URL without credentials.
func getURL(t testing.TB, u string) (int, string) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(data)
}

func TestCompatAgentSandbox(t *testing.T) {
	// Downloads come from 127.0.0.2, the one range DialPublic allows here.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	dl := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			http.NotFound(w, r)
		case "/report":
			w.Header().Set("Content-Disposition", `attachment; filename="report.txt"`)
			_, _ = w.Write([]byte("report"))
		default:
			_, _ = w.Write([]byte("a,b\n1,2\n"))
		}
	})}
	go func() { _ = dl.Serve(ln) }()
	t.Cleanup(func() { _ = dl.Close() })
	proxy, err := egress.New(egress.Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	if err != nil {
		t.Fatal(err)
	}
	g := filesGateway(t, 0, rest.DataPlane{MaxFileBytes: 1 << 20, DialPublic: proxy.DialPublic})

	bearer := func(key string) []string { return []string{"Authorization", "Bearer " + key} }
	alice := bearer(aliceKey)
	call := func(method, path, body string) compatResp {
		t.Helper()
		return asCall(t, g, method, path, body, alice...)
	}
	execute := func(body string) asExecute {
		t.Helper()
		r := call(http.MethodPost, "/execute", body)
		if r.status != http.StatusOK {
			t.Fatalf("execute %s: %d %s", body, r.status, r.body)
		}
		var e asExecute
		r.decode(t, &e)
		if e.Output == nil || e.Artifacts == nil {
			t.Fatalf("execute %s: %s", body, r.body)
		}
		return e
	}
	run := func(session, code string) asExecute {
		t.Helper()
		return execute(fmt.Sprintf(`{"user_id":"alice","session_id":%q,"code":%q}`, session, code))
	}
	detail := func(t *testing.T, r compatResp, status int, want string) {
		t.Helper()
		var d struct {
			Detail any `json:"detail"`
		}
		r.decode(t, &d)
		if r.status != status || (want != "" && fmt.Sprint(d.Detail) != want) {
			t.Errorf("got %d %s, want %d %q", r.status, r.body, status, want)
		}
	}
	type fileRow struct {
		Path      string `json:"path"`
		SizeBytes int64  `json:"size_bytes"`
		Mtime     int64  `json:"mtime"`
	}
	list := func(t *testing.T, query string, hdr ...string) []fileRow {
		t.Helper()
		if hdr == nil {
			hdr = alice
		}
		r := asCall(t, g, http.MethodGet, "/files/list?"+query, "", hdr...)
		var l struct {
			Files []fileRow `json:"files"`
		}
		r.decode(t, &l)
		if r.status != http.StatusOK || l.Files == nil {
			t.Fatalf("list %s: %d %s", query, r.status, r.body)
		}
		return l.Files
	}

	t.Run("conversation", func(t *testing.T) {
		// The seed's ChatGPT conversation: x persists in the session.
		if e := run("chat", "x = 10\nx"); *e.Output != "10\n" || len(e.Artifacts) != 0 {
			t.Errorf("first: %+v", e)
		}
		if e := run("chat", "x += 5\nx"); *e.Output != "15\n" {
			t.Errorf("second: %q", *e.Output)
		}
		// The seed's execute example: print, then the last expression.
		if e := run("chat", "x = 5\nprint(x * 2)\nx"); *e.Output != "10\n5\n" {
			t.Errorf("example: %q", *e.Output)
		}
		// Another session_id is another sandbox.
		if e := run("other", "x"); !strings.Contains(*e.Output, "NameError") {
			t.Errorf("other session: %q", *e.Output)
		}
		// An exception's traceback follows the output.
		e := run("chat", "print('before')\n1/0")
		if !strings.HasPrefix(*e.Output, "before\n") || !strings.Contains(*e.Output, "ZeroDivisionError") ||
			!strings.HasSuffix(*e.Output, "\n") {
			t.Errorf("error: %q", *e.Output)
		}
		if e := run("chat", "import sys\nprint('oops', file=sys.stderr)"); *e.Output != "oops\n" {
			t.Errorf("stderr: %q", *e.Output)
		}
		if e := run("chat", "  \n"); *e.Output != "Empty code\n" {
			t.Errorf("empty code: %q", *e.Output)
		}
		// session_id defaults to "default".
		execute(`{"user_id":"alice","code":"y = 1"}`)
		if e := execute(`{"user_id":"alice","session_id":"default","code":"y"}`); *e.Output != "1\n" {
			t.Errorf("default session: %q", *e.Output)
		}
	})

	t.Run("concurrent first calls", func(t *testing.T) {
		// Calls that race to create one sandbox all run in the one.
		const n = 4
		outs := make(chan string, n)
		for i := range n {
			go func() { // no t.Fatal off the test's goroutine
				body := fmt.Sprintf(`{"user_id":"race","code":"v%d = %d"}`, i, i)
				req, _ := http.NewRequest(http.MethodPost, g.url+"/compat/agent-sandbox/v1/execute", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+aliceKey)
				res, err := g.client.Do(req)
				if err != nil {
					outs <- err.Error()
					return
				}
				defer res.Body.Close()
				data, _ := io.ReadAll(res.Body)
				outs <- fmt.Sprintf("%d %s", res.StatusCode, data)
			}()
		}
		for range n {
			if o := <-outs; o != `200 {"output":"","artifacts":[]}` {
				t.Errorf("racing execute: %s", o)
			}
		}
		if e := execute(`{"user_id":"race","code":"v0 + v1 + v2 + v3"}`); *e.Output != "6\n" {
			t.Errorf("one kernel: %q", *e.Output)
		}
	})

	t.Run("validation", func(t *testing.T) {
		r := call(http.MethodPost, "/execute", `{"session_id":"s","code":"1"}`)
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(string(r.body), `"loc":["body","user_id"]`) ||
			!strings.Contains(string(r.body), `"type":"missing"`) {
			t.Errorf("no user_id: %d %s", r.status, r.body)
		}
		r = call(http.MethodPost, "/execute", `{"user_id":"alice","code":5}`)
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(string(r.body), `"string_type"`) {
			t.Errorf("code 5: %d %s", r.status, r.body)
		}
		detail(t, call(http.MethodPost, "/execute", `{"user_id":"  ","code":"1"}`), 400, "user_id required")
		detail(t, call(http.MethodPost, "/execute", `{"user_id":"a","code":"1","inputs":["../etc/passwd"]}`), 400, "")
		detail(t, call(http.MethodPost, "/execute", `not json`), 422, "")
		detail(t, call(http.MethodGet, "/files/list", ""), 422, "")
		detail(t, call(http.MethodGet, "/nothing", ""), 404, "Not Found")
		detail(t, call(http.MethodGet, "/execute", ""), 405, "Method Not Allowed")
	})

	t.Run("artifacts", func(t *testing.T) {
		e := run("files", "open('out.txt','w').write('hello world\\n')\nimport os\nos.makedirs('d', exist_ok=True)\nopen('d/data.bin','wb').write(b'xyz')")
		if len(e.Artifacts) != 2 {
			t.Fatalf("artifacts: %+v", e)
		}
		a, b := e.Artifacts[0], e.Artifacts[1]
		if a.Path != "d/data.bin" || a.SizeBytes != 3 || a.MimeType != "application/octet-stream" ||
			b.Path != "out.txt" || b.SizeBytes != 12 || b.MimeType != "text/plain" {
			t.Errorf("artifacts: %+v", e.Artifacts)
		}
		if status, body := getURL(t, b.DownloadURL); status != http.StatusOK || body != "hello world\n" {
			t.Errorf("download %s: %d %q", b.DownloadURL, status, body)
		}
		// Only what a run creates or changes comes back.
		if e := run("files", "open('out.txt','a').write('more\\n')"); len(e.Artifacts) != 1 || e.Artifacts[0].Path != "out.txt" ||
			e.Artifacts[0].SizeBytes != 17 {
			t.Errorf("changed: %+v", e.Artifacts)
		}
		if e := run("files", "1 + 1"); *e.Output != "2\n" || len(e.Artifacts) != 0 {
			t.Errorf("no change: %+v", e)
		}
		// inputs name workspace files; a missing one is skipped.
		if e := execute(`{"user_id":"alice","session_id":"files","code":"open('out.txt').read()[:5]","inputs":["out.txt","nope.txt"],"presign_expires_in":60}`); *e.Output != "'hello'\n" {
			t.Errorf("inputs: %q", *e.Output)
		}
	})

	t.Run("reset keeps files", func(t *testing.T) {
		run("files", "z = 42")
		r := call(http.MethodPost, "/sandbox/reset", `{"user_id":"alice","session_id":"files"}`)
		var raw map[string]any
		r.decode(t, &raw)
		if r.status != http.StatusOK || raw["status"] != "success" || raw["output"] != "Kernel reset.\n" || raw["container_id"] == "" {
			t.Errorf("reset: %d %s", r.status, r.body)
		}
		if e := run("files", "z"); !strings.Contains(*e.Output, "NameError") {
			t.Errorf("z after reset: %q", *e.Output)
		}
		files := list(t, "user_id=alice&session_id=files")
		if len(files) != 2 || files[0].Path != "d/data.bin" || files[1].Path != "out.txt" || files[1].SizeBytes != 17 || files[1].Mtime == 0 {
			t.Errorf("files after reset: %+v", files)
		}
	})

	t.Run("download-url", func(t *testing.T) {
		q := "/files/download-url?user_id=alice&session_id=files&path=out.txt"
		var d struct {
			Status      string `json:"status"`
			Path        string `json:"path"`
			ExpiresIn   int    `json:"expires_in"`
			DownloadURL string `json:"download_url"`
		}
		for _, tc := range []struct {
			query string
			want  int
		}{{"", 300}, {"&expires_in=600", 600}, {"&expires_in=9999999", 604800}, {"&expires_in=0", 300}} {
			r := call(http.MethodGet, q+tc.query, "")
			r.decode(t, &d)
			if r.status != http.StatusOK || d.Status != "success" || d.Path != "out.txt" || d.ExpiresIn != tc.want {
				t.Errorf("%s: %d %s", tc.query, r.status, r.body)
			}
		}
		if status, body := getURL(t, d.DownloadURL); status != http.StatusOK || body != "hello world\nmore\n" {
			t.Errorf("download: %d %q", status, body)
		}
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=nope.txt", ""), 404, "not found")
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=d", ""), 404, "not found")
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=never&path=out.txt", ""), 404, "not found")
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=../x", ""), 400, ".. is not allowed")
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=/etc/passwd", ""), 400, "absolute paths are not allowed")
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=out.txt&expires_in=soon", ""), 422, "")
		// bob's user "alice" is not alice's.
		detail(t, asCall(t, g, http.MethodGet, q, "", bearer(bobKey)...), 404, "not found")
		if files := list(t, "user_id=alice&session_id=files", bearer(bobKey)...); len(files) != 0 {
			t.Errorf("bob sees %+v", files)
		}
	})

	t.Run("upload-urls", func(t *testing.T) {
		base := "http://" + ln.Addr().String()
		body := fmt.Sprintf(`{"user_id":"alice","session_id":"up","dest_dir":"data","urls":[%q,%q,%q,%q,%q]}`,
			base+"/data.csv", base+"/image.jpg?Content-Disposition=filename%3D%22myimage.jpg%22",
			base+"/report", base+"/missing", "ftp://example.com/x")
		r := call(http.MethodPost, "/files/upload-urls", body)
		var res struct {
			Status   string   `json:"status"`
			Uploaded []string `json:"uploaded"`
			Errors   []struct {
				SourceURL string `json:"source_url"`
				Error     string `json:"error"`
			} `json:"errors"`
		}
		r.decode(t, &res)
		if r.status != http.StatusOK || res.Status != "partial_success" ||
			strings.Join(res.Uploaded, ",") != "data/data.csv,data/myimage.jpg,data/report.txt" || len(res.Errors) != 2 {
			t.Fatalf("upload: %d %s", r.status, r.body)
		}
		for _, e := range res.Errors {
			if e.SourceURL == "" || e.Error == "" {
				t.Errorf("error row %+v", e)
			}
		}
		files := list(t, "user_id=alice&session_id=up")
		if len(files) != 3 || files[0].Path != "data/data.csv" || files[0].SizeBytes != 8 {
			t.Errorf("files: %+v", files)
		}
		if e := run("up", "open('data/myimage.jpg').read()"); *e.Output != "'a,b\\n1,2\\n'\n" {
			t.Errorf("read upload: %q", *e.Output)
		}
		// A private address is refused, per URL.
		r = call(http.MethodPost, "/files/upload-urls", `{"user_id":"alice","session_id":"up","urls":["http://127.0.0.1:1/x"]}`)
		r.decode(t, &res)
		if r.status != http.StatusOK || res.Status != "error" || len(res.Errors) != 1 || len(res.Uploaded) != 0 {
			t.Errorf("private: %d %s", r.status, r.body)
		}
		r = call(http.MethodPost, "/files/upload-urls", `{"user_id":"alice","session_id":"up"}`)
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"status":"success","uploaded":[],"errors":[]}` {
			t.Errorf("no urls: %d %s", r.status, r.body)
		}
		many := make([]string, 201)
		for i := range many {
			many[i] = fmt.Sprintf("%q", base+"/f")
		}
		detail(t, call(http.MethodPost, "/files/upload-urls", `{"user_id":"alice","urls":[`+strings.Join(many, ",")+`]}`), 400, "too many urls (max 200)")
		detail(t, call(http.MethodPost, "/files/upload-urls", `{"user_id":"alice","urls":[],"dest_dir":"a/../../b"}`), 400, "invalid dest_dir")
	})

	t.Run("auth", func(t *testing.T) {
		for _, rt := range []struct{ method, path string }{
			{http.MethodPost, "/execute"}, {http.MethodPost, "/sandbox/reset"}, {http.MethodPost, "/sandbox/stop"},
			{http.MethodPost, "/files/upload-urls"}, {http.MethodGet, "/files/list?user_id=alice&session_id=files"},
			{http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=out.txt"}, {http.MethodGet, "/nothing"},
		} {
			for _, hdr := range [][]string{nil, {"X-API-Key", "sg_wrong_token"}, {"X-API-Key", ""}, {"Authorization", "Bearer sg_wrong_token", "X-API-Key", aliceKey}} {
				r := asCall(t, g, rt.method, rt.path, `{"user_id":"alice","session_id":"files","code":"1"}`, hdr...)
				if r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), `"unauthorized"`) ||
					r.header.Get("WWW-Authenticate") != `Bearer realm="sandgate"` {
					t.Errorf("%s %s %v: %d %s", rt.method, rt.path, hdr, r.status, r.body)
				}
			}
		}
		// The seed's X-API-Key carries a sandgate token.
		if files := list(t, "user_id=alice&session_id=files", "X-API-Key", aliceKey); len(files) != 2 {
			t.Errorf("X-API-Key list: %+v", files)
		}
		r := asCall(t, g, http.MethodPost, "/execute", `{"user_id":"alice","session_id":"chat","code":"x"}`, "X-API-Key", aliceKey)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"output":"5\n"`) {
			t.Errorf("X-API-Key execute: %d %s", r.status, r.body)
		}
		// X-API-Key means nothing elsewhere.
		if r := g.do(t, http.MethodGet, "/v1/sessions", "", nil, "X-API-Key", aliceKey); r.status != http.StatusUnauthorized {
			t.Errorf("X-API-Key on /v1: %d", r.status)
		}
	})

	t.Run("stop", func(t *testing.T) {
		r := call(http.MethodPost, "/files/download-url", "")
		detail(t, r, 405, "Method Not Allowed")
		dr := call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=out.txt", "")
		var d struct {
			DownloadURL string `json:"download_url"`
		}
		dr.decode(t, &d)
		r = call(http.MethodPost, "/sandbox/stop", `{"user_id":"alice","session_id":"files"}`)
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"status":"success"}` {
			t.Errorf("stop: %d %s", r.status, r.body)
		}
		// The sandbox is gone: its links die, its files with it.
		if status, _ := getURL(t, d.DownloadURL); status != http.StatusGone {
			t.Errorf("link after stop: %d", status)
		}
		detail(t, call(http.MethodGet, "/files/download-url?user_id=alice&session_id=files&path=out.txt", ""), 404, "not found")
		// The next call creates a fresh sandbox.
		if files := list(t, "user_id=alice&session_id=files"); len(files) != 0 {
			t.Errorf("files after stop: %+v", files)
		}
		if e := run("files", "'z' in globals()"); *e.Output != "False\n" {
			t.Errorf("kernel after stop: %q", *e.Output)
		}
		// Stopping what does not exist succeeds, as in the seed.
		r = call(http.MethodPost, "/sandbox/stop", `{"user_id":"nobody"}`)
		if r.status != http.StatusOK {
			t.Errorf("stop nothing: %d %s", r.status, r.body)
		}
		// Every sandbox is a native session named as-<16 hex>-<16 hex>.
		var all struct {
			Sessions []struct{ Name, Status string } `json:"sessions"`
		}
		lr := compatCall(t, g, http.MethodGet, "/v1/sessions?limit=100", aliceKey, "")
		lr.decode(t, &all)
		named := 0
		for _, s := range all.Sessions {
			if strings.HasPrefix(s.Name, "as-") && len(s.Name) == 36 && s.Status == "running" {
				named++
			}
		}
		if named != 6 { // chat, other, default, race, files, up
			t.Errorf("%d named sessions", named)
		}
	})
}
